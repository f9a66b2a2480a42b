"""The host's hold on its leases: renewed off the event loop, trusted by the monotonic clock.

A :class:`HeldLease` is one lease this host holds and how long the host may
act under it: until a ttl of its OWN monotonic time after the last renewal
began. Its :meth:`~HeldLease.check` is what the engine asks before every
effect, and its :meth:`~HeldLease.fence` runs inside every checkpoint and
engine-append transaction: the local check, then the stored row still naming
this owner and generation. So a host that was frozen (SIGSTOP, a VM pause)
past its ttl stops acting the moment it runs again, before it has even heard
that another host took over.

The :class:`LeaseKeeper` renews every held lease every heartbeat on a thread
of its own, over a connection of its own (the backend's ``LeaseRenewer``). A batch that holds the event
loop for longer than the ttl (CPU-bound work in ``reduce`` or an effect) does
not starve the renewal, so the host's own checkpoint is not fenced out from
under it; the price is that a host whose loop is wedged but whose process
runs keeps its leases (the stall shows in ``status``). A renewal that finds
the lease taken marks it lost and tells the loop at once; one that fails
(a busy database) leaves the lease to lapse by the clock if it keeps failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

import structlog

from streamkit._requests import Connection
from streamkit.errors import LeaseLost
from streamkit.protocols import Clock, Lease, LeaseRenewer

__all__ = ["HeldLease", "LeaseKeeper"]

_log = structlog.get_logger("streamkit.host")

Monotonic = Callable[[], float]


class HeldLease:
    """A lease this host holds, and the monotonic instant it stops trusting it."""

    __slots__ = ("_check_stored", "_clock", "_monotonic", "lease", "lost", "trusted_until", "ttl")

    def __init__(
        self,
        lease: Lease,
        check_stored: Callable[[Connection, Lease, float], None],
        *,
        ttl: float,
        renewal_started: float,
        clock: Clock,
        monotonic: Monotonic = time.monotonic,
    ) -> None:
        self.lease = lease
        # The backend's stored half of the fence (HostStore.check_fence).
        self._check_stored = check_stored
        self.ttl = ttl
        # From when the taking statement was sent, not when it answered: the row
        # may have been written at any instant in between.
        self.trusted_until = renewal_started + ttl
        self.lost: LeaseLost | None = None
        self._clock = clock
        self._monotonic = monotonic

    def renewed(self, lease: Lease, renewal_started: float) -> None:
        """Record a renewal whose statement was sent at monotonic ``renewal_started``."""
        self.lease = lease
        self.trusted_until = renewal_started + self.ttl

    def in_force(self) -> bool:
        """Whether this host may still act under the lease, by what it knows locally."""
        return self.lost is None and self._monotonic() < self.trusted_until

    def check(self) -> None:
        """Raise :class:`~streamkit.errors.LeaseLost` unless the lease is in force locally."""
        if self.lost is not None:
            raise LeaseLost(self.lost.message, details=dict(self.lost.details))
        overdue = self._monotonic() - self.trusted_until
        if overdue >= 0:
            lease = self.lease
            raise LeaseLost(
                f"lease of processor {lease.slug!r} at path {lease.path!r} (generation "
                f"{lease.generation}) was last renewed more than its ttl of {self.ttl:g} s ago "
                f"by this host's monotonic clock ({overdue:.3f} s over; the process was "
                "frozen or the database unreachable), so another host may hold it now; "
                "nothing was started or written; the host takes the lease again when it can",
                details={
                    "path": lease.path,
                    "slug": lease.slug,
                    "owner": lease.owner,
                    "generation": lease.generation,
                    "overdue": round(overdue, 3),
                },
            )

    def fence(self, conn: Connection) -> None:
        """The fence of a write transaction: the local check, then the stored row."""
        self.check()
        self._check_stored(conn, self.lease, self._clock())


class LeaseKeeper:
    """Renews the host's held leases every ``interval`` seconds on a thread of its own."""

    def __init__(
        self,
        renewer: LeaseRenewer,
        *,
        interval: float,
        ttl: float,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        monotonic: Monotonic = time.monotonic,
    ) -> None:
        self._renewer = renewer
        self._interval = interval
        self._ttl = ttl
        self._clock = clock
        self._loop = loop
        self._monotonic = monotonic
        self._held: dict[HeldLease, Callable[[LeaseLost], None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0

    def hold(self, held: HeldLease, on_lost: Callable[[LeaseLost], None]) -> None:
        """Keep ``held`` renewed; ``on_lost`` runs on the loop if a renewal finds it taken."""
        with self._lock:
            self._held[held] = on_lost

    def drop(self, held: HeldLease) -> None:
        """Stop renewing ``held`` (lost, released, or its engine is gone)."""
        with self._lock:
            self._held.pop(held, None)

    def start(self) -> None:
        """Start the renewal thread (a daemon: a kill of the process ends it with the rest)."""
        self._thread = threading.Thread(
            target=self._run, name="streamkit-lease-keeper", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and wait for the thread (a renewal under way finishes first)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                try:
                    self.renew_all()
                except Exception as exc:
                    # Never die: without renewals every lease lapses. Reconnect next beat.
                    _log.error("lease.keeper_failed", error=repr(exc))
                    self._renewer.close()
        finally:
            self._renewer.close()

    def renew_all(self) -> None:
        """Renew each held lease once, in its own transaction (the thread's one job)."""
        with self._lock:
            items = list(self._held.items())
        for held, on_lost in items:
            if self._stop.is_set():
                return
            started = self._monotonic()
            try:
                lease = self._renewer.renew(held.lease, self._clock(), self._ttl)
            except LeaseLost as exc:
                held.lost = exc
                self.drop(held)
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
                    self._loop.call_soon_threadsafe(on_lost, exc)
                continue
            except Exception as exc:
                # The lease lasts its ttl: the next beat tries again, and if none
                # succeeds in time the lease lapses by the clock, as it should.
                _log.warning("lease.heartbeat_failed", slug=held.lease.slug, error=repr(exc))
                continue
            held.renewed(lease, started)
            self.renewals += 1

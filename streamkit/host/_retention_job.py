"""The host's retention job: the ``[[retention]]`` policies, run under a fenced lease of their own.

One host at a time runs a log's policies: the one holding the lease
:data:`RETENTION_LEASE` on ``/`` (its slug has a colon, which no processor's
may have). The lease is taken like a processor's (:mod:`._acquire`): at once
when free, and from another owner only once this host has watched the very
same row go unrenewed for a ttl of its own monotonic time, so no wall clock
can steal it from a live host. The host's lease keeper renews it, and its
fence runs first in every chunk's transaction: a host that lost it (frozen,
cut off) writes nothing.

Every ``retention_interval`` seconds the holder runs each policy in turn
(:func:`~streamkit.backends._retention.run.run_retention`: below the horizon
only, in chunks that let appends go on). A run that fails is logged and
counted, its error kept for ``status``, ``/metrics`` and the admin page,
and tried again at the next interval. A kill mid-run loses nothing: each
chunk is its own transaction, and the next run removes the segment file of
the chunk that was in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from streamkit.config import RetentionPolicy
from streamkit.errors import LeaseLost, StreamkitError
from streamkit.host._lease_keeper import HeldLease
from streamkit.protocols import Clock, HostStore, Lease, LeaseAsk

__all__ = ["RETENTION_LEASE", "PolicyRecord", "RetentionJob"]

_log = structlog.get_logger("streamkit.host")

RETENTION_LEASE = ("/", "streamkit:retention")
"""The ``(path, slug)`` of the lease whose holder runs the policies."""


@dataclass(slots=True)
class PolicyRecord:
    """What this host's runs of one policy did."""

    policy: RetentionPolicy
    runs: int = 0
    failures: int = 0
    events_taken: int = 0
    keys_forgotten: int = 0
    last_at: float | None = None
    last_run: dict[str, Any] | None = None
    last_error: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        policy = self.policy
        return {
            "path": policy.path,
            "keep_for": policy.keep_for,
            "keep_last": policy.keep_last,
            "mode": policy.mode,
            "archive": None if policy.archive is None else str(policy.archive),
            "chunk": policy.chunk,
            "share": policy.share,
            "runs": self.runs,
            "failures": self.failures,
            "events_taken": self.events_taken,
            "keys_forgotten": self.keys_forgotten,
            "last_at": self.last_at,
            "last_run": self.last_run,
            "last_error": self.last_error,
        }


class RetentionJob:
    """Runs ``policies`` every ``interval`` seconds while this host holds the retention lease.

    ``keep(held, on_lost)`` hands a taken lease to the host's keeper (which
    renews it, and calls ``on_lost`` on the loop if a renewal finds it
    taken); ``gone(held)`` stops renewing it.
    """

    def __init__(
        self,
        *,
        store: HostStore,
        owner: str,
        clock: Clock,
        ttl: float,
        interval: float,
        policies: Sequence[RetentionPolicy],
        keep: Callable[[HeldLease, Callable[[LeaseLost], None]], None],
        gone: Callable[[HeldLease], None],
    ) -> None:
        self._store = store
        self._owner = owner
        self._clock = clock
        self._ttl = ttl
        self.interval = interval
        self._keep = keep
        self._gone = gone
        self.records = [PolicyRecord(policy) for policy in policies]
        self.held: HeldLease | None = None
        # Another owner's row and when this host first saw it so (monotonic).
        self._observed: tuple[Lease, float] | None = None
        self.holder: str | None = None
        """Who held the lease when this host last looked (itself included)."""

    async def run(self) -> None:
        """Take the lease when it is free or stale, and run the policies while it is held."""
        while True:
            try:
                await self.once()
            except Exception as exc:
                # The task must not die: nothing would run the policies, silently.
                _log.error("retention.job_failed", error=repr(exc), exc_info=exc)
            await asyncio.sleep(self.interval if self.held is not None else self._wait())

    def _wait(self) -> float:
        # Watching another holder: look again after a ttl, so a dead one is replaced soon.
        return min(self.interval, self._ttl)

    async def once(self) -> None:
        """One turn: the lease first, then, if held here, every policy in turn."""
        held = self.held
        if held is None or not held.in_force():
            if held is not None:
                self._drop(held)
            held = await self._take()
            if held is None:
                return
        for record in self.records:
            if self.held is not held:
                return  # lost during a run: the next turn takes it again, or not
            await self._run_policy(record, held)

    async def release(self) -> None:
        """Give the lease up (the host is stopping); a failure is logged, the lease lapses."""
        held, self.held = self.held, None
        if held is None:
            return
        self._gone(held)
        try:
            await self._store.release(held.lease)
        except StreamkitError as exc:
            _log.warning("retention.release_failed", error=exc.message)

    def to_dict(self) -> dict[str, Any]:
        """This host's view of the job, for ``status``."""
        return {
            "holds_lease": self.held is not None and self.held.in_force(),
            "holder": self.holder,
            "interval": self.interval,
            "policies": [record.to_dict() for record in self.records],
        }

    async def _take(self) -> HeldLease | None:
        path, slug = RETENTION_LEASE
        row = await self._store.read_lease(path, slug)
        stale = None
        if row is not None and not row.released and row.owner != self._owner:
            self.holder = row.owner
            seen = time.monotonic()
            observed = self._observed
            if observed is None or not observed[0].same_row(row):
                self._observed = (row, seen)
                return None
            if seen - observed[1] < self._ttl:
                return None
            stale = row
        started = time.monotonic()
        self._observed = None
        taken = await self._store.try_acquire(
            LeaseAsk(path, slug, self._owner, self._clock(), self._ttl, stale)
        )
        if taken is None:
            return None
        held = HeldLease(
            taken,
            self._store.check_fence,
            ttl=self._ttl,
            renewal_started=started,
            clock=self._clock,
        )
        self.held, self.holder = held, self._owner
        self._keep(held, lambda error: self._lost(held, error))
        _log.info(
            "retention.lease_acquired",
            generation=taken.generation,
            took_over=None if stale is None else stale.owner,
            policies=[record.policy.path for record in self.records],
        )
        return held

    def _lost(self, held: HeldLease, error: LeaseLost) -> None:
        _log.warning("retention.lease_lost", error=error.message)
        self._drop(held)

    def _drop(self, held: HeldLease) -> None:
        self._gone(held)
        if self.held is held:
            self.held = None

    async def _run_policy(self, record: PolicyRecord, held: HeldLease) -> None:
        policy = record.policy
        record.last_at = self._clock()
        try:
            held.check()
            run = await self._store.retention.run(policy.ask(fence=held.fence))
        except StreamkitError as exc:
            record.failures += 1
            record.last_error = {"code": exc.code, "message": exc.message, "at": record.last_at}
            _log.error("retention.run_failed", path=policy.path, code=exc.code, error=exc.message)
            if isinstance(exc, LeaseLost):
                self._drop(held)
            return
        record.runs += 1
        record.events_taken += run.events
        record.keys_forgotten += run.keys_forgotten
        record.last_run = run.to_dict()
        record.last_error = None
        if run.events or run.orphans_removed or run.keys_forgotten:
            _log.info(
                "retention.ran",
                path=policy.path,
                mode=run.mode,
                events=run.events,
                chunks=run.chunks,
                start=run.start_after,
                stopped_by=run.stopped_by,
                orphans_removed=run.orphans_removed,
                keys_forgotten=run.keys_forgotten,
                seconds=round(run.seconds, 3),
            )

"""Taking leases: when this host may start a processor that it does not run yet.

At every beat the :class:`LeaseAcquirer` looks at each runner without a
running engine. A lease that is free (never taken, or released) is taken at
once. One held by another owner is taken only once this host has watched the
very same row (owner, generation, beat) go unrenewed for a ttl of its own
monotonic time: that owner's ``expires_at`` is its own clock and never
trusted here, so no wall clock, fast or slow, can steal a live lease or pin a
dead one. A taken lease comes with the processor's claim, read from the log
(unknown: due now), and is handed to ``on_acquired``, which starts the
engine. A beat that fails is logged and tried again at the next one: a lease
lasts its ttl.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from streamkit.errors import StreamkitError
from streamkit.host._lease_keeper import HeldLease
from streamkit.host._runner import ProcessorRunner
from streamkit.log._log import Log
from streamkit.protocols import Clock, HostStore

__all__ = ["LeaseAcquirer"]

_log = structlog.get_logger("streamkit.host")


class LeaseAcquirer:
    """Takes the leases of a host's runners (see the module docstring)."""

    def __init__(
        self,
        *,
        log: Log,
        store: HostStore,
        owner: str,
        clock: Clock,
        ttl: float,
        on_acquired: Callable[[ProcessorRunner, HeldLease], None],
    ) -> None:
        self._log = log
        self._store = store
        self._owner = owner
        self._clock = clock
        self._ttl = ttl
        self._on_acquired = on_acquired

    async def beat_all(
        self, runners: Sequence[ProcessorRunner], stopping: Callable[[], bool]
    ) -> None:
        """One beat for every runner, until ``stopping()`` says the host is stopping."""
        for runner in runners:
            if stopping():
                return
            try:
                await self.beat(runner)
            except Exception as exc:
                # A busy or failing database must not stop the heartbeat: the lease
                # lasts ttl, and the next beat tries again.
                _log.warning("lease.heartbeat_failed", slug=runner.slug, error=repr(exc))

    async def beat(self, runner: ProcessorRunner) -> None:
        """Take ``runner``'s lease if it is free, or stale by this host's own watch."""
        if runner.held is not None and runner.engine is not None:
            return  # the lease keeper renews it, off the loop
        store, ttl = self._store, self._ttl
        row = await store.read_lease(runner.path, runner.slug)
        stale = None
        if row is not None and not row.released and row.owner != self._owner:
            seen = time.monotonic()
            observed = runner.observed
            if observed is None or not observed[0].same_row(row):
                runner.observed = (row, seen)
                return
            if seen - observed[1] < ttl:
                return
            stale = row
        started = time.monotonic()
        try:
            taken = await store.try_acquire(
                runner.path, runner.slug, self._owner, self._clock(), ttl, stale=stale
            )
        finally:
            runner.observed = None
        if taken is None:
            return
        held = HeldLease(
            taken, store.check_fence, ttl=ttl, renewal_started=started, clock=self._clock
        )
        try:
            claims = await self._log.stream(runner.path).claims()
        except StreamkitError as exc:
            # Unknown: assume due now; a revive that finds nothing owed costs little.
            _log.warning("claim.read_failed", slug=runner.slug, error=exc.message)
            claims = {runner.slug: self._clock()}
        runner.claim_due = claims.get(runner.slug)
        _log.info(
            "lease.acquired",
            slug=runner.slug,
            path=runner.path,
            generation=taken.generation,
            took_over=None if stale is None else stale.owner,
            claim_due=runner.claim_due,
        )
        self._on_acquired(runner, held)

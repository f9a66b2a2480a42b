"""Taking leases: when this host may start a processor that it does not run yet.

At every beat the :class:`LeaseAcquirer` first says this host is alive (and
what it can run) and reads which hosts are, then places every processor on
one live host (:mod:`._spread`): that host takes it, the others leave it.
A host that runs a processor placed on another live host (one that joined,
say) hands it off: it stops after the batch in flight and releases the
lease, and the other takes the free lease at its next beat. A host only
hands off to a host it saw alive at two beats in a row, so a late beat does
not move work about. A free lease placed elsewhere is still taken once it
has stayed free for two ttls (the host it was placed on may be unable to
start it), and a stale one after two ttls of watching, so no processor is
left without a host.

Then it looks at each runner without a running engine. A lease that is
free (never taken, or released) and placed here is taken at once. One held by another owner is taken only once this host has watched the
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
from streamkit.host._serving_watch import ServingWatch
from streamkit.host._spread import Key, assign, key_of
from streamkit.log import Log
from streamkit.protocols import Clock, HostStore, LeaseAsk

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
        on_hand_off: Callable[[ProcessorRunner], None] = lambda runner: None,
    ) -> None:
        self._log = log
        self._store = store
        self._owner = owner
        self._clock = clock
        self._ttl = ttl
        self._on_acquired = on_acquired
        self._on_hand_off = on_hand_off
        # Consecutive beats at which each host was seen alive (a hand-off needs two).
        self._seen: dict[str, int] = {}
        self.placed: dict[Key, str] = {}
        """Where the latest beat placed each processor: ``slug@path`` -> host."""
        self.serving = ServingWatch()
        """Whether a live host serves each processor this host is configured with."""

    async def beat_all(
        self, runners: Sequence[ProcessorRunner], stopping: Callable[[], bool]
    ) -> None:
        """One beat for every runner, until ``stopping()`` says the host is stopping."""
        placed: dict[Key, str] | None = None
        try:
            placed = await self._place(runners)
        except Exception as exc:
            # Without the picture every host takes what is free, as a lone host does.
            _log.warning("hosts.placement_failed", error=repr(exc))
        for runner in runners:
            if stopping():
                return
            try:
                await self.beat(runner, placed)
            except Exception as exc:
                # A busy or failing database must not stop the heartbeat: the lease
                # lasts ttl, and the next beat tries again.
                _log.warning("lease.heartbeat_failed", slug=runner.slug, error=repr(exc))

    async def _place(self, runners: Sequence[ProcessorRunner]) -> dict[Key, str]:
        """Beat, read who is alive and who holds what, and place every processor."""
        # A processor this code cannot read on (a payload newer than it) is not offered:
        # placement then hands it to a live host that offers it, one with newer code.
        # Nor is one whose version does not serve: it builds in the shadow, or stands aside.
        store = self._store
        keys = [
            key_of(r.slug, r.path)
            for r in runners
            if r.failures.ahead_of_code is None and r.role.offers_serving
        ]
        now = self._clock()
        await store.host_beat(self._owner, keys, now)
        hosts = await store.live_hosts(now, self._ttl)
        hosts[self._owner] = keys  # alive, whatever the read said
        holders = {
            key_of(lease.slug, lease.path): lease.owner
            for lease in await store.leases()
            if not lease.released
        }
        for runner in runners:
            if runner.engine is not None and not runner.role.shadow:
                holders[key_of(runner.slug, runner.path)] = self._owner
        self._seen = {owner: self._seen.get(owner, 0) + 1 for owner in hosts}
        self.serving.observe(runners, hosts, holders, now)
        placed = assign(hosts, holders)
        if placed != self.placed:
            mine = sorted(k for k, owner in placed.items() if owner == self._owner)
            _log.info("hosts.placed", hosts=len(hosts), here=mine)
        self.placed = placed
        return placed

    async def beat(self, runner: ProcessorRunner, placed: dict[Key, str] | None = None) -> None:
        """Take ``runner``'s lease if it is free, or stale by this host's own watch.

        ``placed`` says which live host each processor belongs on; without
        it (or for a processor placed here) a free lease is taken at once.
        """
        assignee = None if placed is None else placed.get(key_of(runner.slug, runner.path))
        elsewhere = assignee is not None and assignee != self._owner
        role = runner.role
        if runner.held is not None and runner.engine is not None:
            if runner.failures.cannot_build is not None:
                self._on_hand_off(runner)  # its shadow lease goes: nothing here can build it
            elif elsewhere and not role.shadow and self._seen.get(str(assignee), 0) >= 2:
                self._on_hand_off(runner)
            return  # the lease keeper renews it, off the loop
        if runner.failures.ahead_of_code is not None:
            return  # this code cannot read on; a host with newer code may take it
        if runner.failures.cannot_build is not None:
            return  # the history this version needs was deleted: it is never built here
        store, ttl = self._store, self._ttl
        role.read(*await store.version_rows(runner.slug, runner.version))
        if role.retired is not None:
            return  # a cutover replaced this version: hosts running the serving one serve it
        # A shadow is placed nowhere: the first host running the new version builds it.
        elsewhere = elsewhere and not role.shadow
        lease_slug = role.lease_slug()
        # A processor placed on another live host is left to it for longer.
        patience = 2 * ttl if elsewhere else ttl
        row = await store.read_lease(runner.path, lease_slug)
        stale = None
        seen = time.monotonic()
        if row is None or row.released:
            if elsewhere:
                if runner.free_since is None:
                    runner.free_since = seen
                if seen - runner.free_since < patience:
                    return
        elif row.owner != self._owner:
            observed = runner.observed
            if observed is None or not observed[0].same_row(row):
                runner.observed = (row, seen)
                return
            if seen - observed[1] < patience:
                return
            stale = row
        runner.free_since = None
        started = time.monotonic()
        try:
            taken = await store.try_acquire(
                LeaseAsk(runner.path, lease_slug, self._owner, self._clock(), ttl, stale)
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
            shadow=role.shadow or None,
            generation=taken.generation,
            took_over=None if stale is None else stale.owner,
            claim_due=runner.claim_due,
        )
        self._on_acquired(runner, held)

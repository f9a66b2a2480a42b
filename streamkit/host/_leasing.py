"""A host's leases: taking them at each beat, keeping them renewed, handing off, losing them.

:class:`HostLeases` is the part of a :class:`~streamkit.host.ProcessorHost`
that owns every lease-related piece of its state: the acquirer that takes
leases at each beat (:mod:`._acquire`), the keeper thread that renews the
held ones (:mod:`._lease_keeper`), and the hand-offs and losses in progress.
A lease acquired starts its runner's engine; a lease the keeper finds lost
stops the engine still running under it; a processor placed on another host
is handed off (its batch in flight finishes, its lease is released).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from streamkit.config import HostConfig
from streamkit.errors import LeaseLost, StreamkitError
from streamkit.host._acquire import LeaseAcquirer
from streamkit.host._lease_keeper import HeldLease, LeaseKeeper
from streamkit.host._retention_job import RetentionJob
from streamkit.host._runner import ProcessorRunner
from streamkit.log import Log
from streamkit.protocols import Clock, HostStore, Lease, LeaseExchange

__all__ = ["HostLeases"]

_log = structlog.get_logger("streamkit.host")


class HostLeases:
    """The leases of one started host's runners (see the module docstring).

    ``changed`` is called when a lease was taken (the alarm re-reads the
    claims); ``served_after_cutover(runner)`` once a cutover's new engine
    serves (watchers re-seed from it); ``stopping()`` says whether the host is
    stopping (no lease is taken or handed off then).
    """

    def __init__(
        self,
        *,
        config: HostConfig,
        log: Log,
        store: HostStore,
        owner: str,
        clock: Clock,
        runners: Sequence[ProcessorRunner],
        changed: Callable[[], None],
        served_after_cutover: Callable[[ProcessorRunner], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._config = config
        self._store = store
        self._owner = owner
        self._clock = clock
        self._runners = runners
        self._changed = changed
        self._served_after_cutover = served_after_cutover
        self._stopping = stopping
        self._tasks: set[asyncio.Task[None]] = set()
        self._handing_off: set[ProcessorRunner] = set()
        # HostConfig refuses ":memory:", so the keeper can always reach the file.
        self._keeper = LeaseKeeper(
            store.lease_renewer(min(5.0, config.lease.heartbeat_interval)),
            interval=config.lease.heartbeat_interval,
            ttl=config.lease.ttl,
            clock=clock,
            loop=asyncio.get_running_loop(),
        )
        self._acquirer = LeaseAcquirer(
            log=log,
            store=store,
            owner=owner,
            clock=clock,
            ttl=config.lease.ttl,
            on_acquired=self._acquired,
            on_hand_off=self._hand_off,
        )
        self._keeper.start()
        self.retention: RetentionJob | None = None
        """The retention job, when the configuration has policies."""
        self._retention_task: asyncio.Task[None] | None = None
        if config.retention:
            self.retention = RetentionJob(
                store=store,
                owner=owner,
                clock=clock,
                ttl=config.lease.ttl,
                interval=config.retention_interval,
                policies=config.retention,
                keep=self._keeper.hold,
                gone=self._keeper.drop,
            )
            self._retention_task = asyncio.get_running_loop().create_task(self.retention.run())

    async def beat(self) -> None:
        """Say this host is alive, take the leases placed here, hand off the others."""
        await self._acquirer.beat_all(self._runners, self._stopping)

    def unserved(self, runner: ProcessorRunner) -> dict[str, Any] | None:
        """Whether ``runner``'s processor runs on no live host (see :mod:`._serving_watch`)."""
        return self._acquirer.serving.unserved(runner)

    def gone(self, held: HeldLease) -> None:
        """A runner no longer holds ``held``: stop renewing it."""
        self._keeper.drop(held)

    async def stop(self) -> None:
        """Let hand-offs and losses in progress end, then stop renewing.

        After the runners stopped (their last batches needed the leases kept)
        and before the leases are released (a renewal must not race them).
        A retention run in flight is cancelled: its chunk in flight commits
        whole or not at all, and the next run goes on from there.
        """
        task, self._retention_task = self._retention_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._keeper.stop)

    async def release_all(self) -> None:
        """Release every lease still held (the host is stopping); a failure is logged."""
        if self.retention is not None:
            await self.retention.release()
        for runner in self._runners:
            lease = runner.lease
            if lease is None:
                continue
            try:
                if await self._store.release(lease):
                    _log.info("lease.released", slug=runner.slug, path=runner.path)
            except StreamkitError as exc:
                _log.warning("lease.release_failed", slug=runner.slug, error=exc.message)
            runner.held = None

    def _acquired(self, runner: ProcessorRunner, held: HeldLease) -> None:
        exchange = None
        if runner.role.shadow:
            exchange = LeaseExchange(
                slug=runner.slug,
                owner=self._owner,
                ttl=self._config.lease.ttl,
                clock=self._clock,
                shadow=lambda: held.lease,
                taken=functools.partial(self._cut_over, runner, held),
            )
        runner.start_engine(held, exchange)
        if runner.held is held:
            self._keeper.hold(held, functools.partial(self._lost_by_keeper, runner, held))
        self._changed()

    def _cut_over(
        self, runner: ProcessorRunner, shadow: HeldLease, lease: Lease, started: float
    ) -> None:
        """A shadow's cutover committed, taking the serving lease: serve under it from now on.

        The shadow lease was released in that transaction: the engine built
        under it may act no more (its next effect or write is refused here),
        and a new engine takes over under the serving lease, from the
        checkpoint the cutover wrote.
        """
        shadow.lost = LeaseLost(
            f"processor {runner.slug!r}: the shadow lease was exchanged for the serving lease "
            f"(generation {lease.generation}) by the cutover; the engine built under it acts no "
            "more, and a new one serves from the cutover's checkpoint",
            details={"slug": runner.slug, "path": runner.path, "generation": lease.generation},
        )
        self._keeper.drop(shadow)
        runner.role.cut_over()
        serving = HeldLease(
            lease,
            self._store.check_fence,
            ttl=self._config.lease.ttl,
            renewal_started=started,
            clock=self._clock,
        )
        _log.info(
            "processor.cut_over",
            slug=runner.slug,
            path=runner.path,
            version=runner.version,
            generation=lease.generation,
        )
        self._track(self._serve_after_cutover(runner, shadow, serving))

    async def _serve_after_cutover(
        self, runner: ProcessorRunner, shadow: HeldLease, serving: HeldLease
    ) -> None:
        try:
            if runner.held is shadow:
                await runner.lose_lease(None)
            if self._stopping():
                await self._store.release(serving.lease)
                return
            self._acquired(runner, serving)
        finally:
            runner.role.served()
        self._served_after_cutover(runner)

    def _hand_off(self, runner: ProcessorRunner) -> None:
        """Give ``runner``'s processor to the host it is placed on (see ``_acquire``)."""
        if runner in self._handing_off or self._stopping():
            return
        self._handing_off.add(runner)
        self._track(self._release_to_another(runner))

    async def _release_to_another(self, runner: ProcessorRunner) -> None:
        try:
            # Background work gets part of the ttl: the lease is renewed meanwhile.
            grace = min(self._config.shutdown_grace, self._config.lease.ttl / 2)
            held = await runner.hand_off(grace)
            if held is not None and await self._store.release(held.lease):
                _log.info("lease.released", slug=runner.slug, path=runner.path, handed_off=True)
        except StreamkitError as exc:
            # Kept or lost, the lease stays the arbiter: the other host takes it when free.
            _log.warning("lease.hand_off_failed", slug=runner.slug, error=exc.message)
        finally:
            self._handing_off.discard(runner)

    def _lost_by_keeper(self, runner: ProcessorRunner, held: HeldLease, error: LeaseLost) -> None:
        # On the loop, called by the keeper thread: stop the engine if it still
        # runs under this very lease (the runner may have moved on already).
        if runner.held is not held:
            return
        if _released_here(held, error):
            # Only a cutover releases a lease whose engine still runs (a stop or a
            # hand-off takes the engine off it first): its commit landed before the
            # engine heard it back, and `taken` moves the runner on. Stopping the
            # engine now would tell the operator who asked that it failed.
            _log.info("lease.released_by_cutover", slug=runner.slug, path=runner.path)
            return
        self._track(runner.lose_lease(error))

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _released_here(held: HeldLease, error: LeaseLost) -> bool:
    """Whether ``error`` says this very holder released ``held`` (at its generation)."""
    details, lease = error.details, held.lease
    return (
        details.get("holder") == lease.owner
        and details.get("holder_generation") == lease.generation
        and details.get("holder_expires_at", 0) is None
    )

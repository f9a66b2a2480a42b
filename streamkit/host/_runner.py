"""One processor inside the host: its lease, its engine, its follower, its retries.

A :class:`ProcessorRunner` owns one processor on one stream path. While it
holds the lease it has an engine, a follower of the path of its own and a
worker task that takes one item at a time: the revive after the engine is
built (it catches up from the log), each range its follower yields, and each
revive the alarm asks for. The follower's buffer is the one queue an event
passes between its commit and the engine, bounded by bytes; a runner that
falls so far behind that it overflows re-reads the log (the follower's
policy), and the follower's gap repair is the only one on the way. Every
runner has its own follower, so a slow processor never stalls another.

No crash loop: an item that fails is retried whole with exponential backoff
(``RetrySettings``), never in a hot loop; after ``stall_after`` consecutive
failures the runner reports itself stalled (with the error and the offset it
is stuck at) and keeps retrying at the capped delay. An operator's skip wakes
the retry at once. A failure the engine latched (a state too large to
checkpoint, say) cannot pass by retrying the same engine, so the runner builds
a fresh engine from the checkpoint after the backoff instead.

What its failures amount to (the run of them, the stall, the last error,
a payload newer than its code) is the runner's :class:`~._failures.Failures`.

A lost lease stops the engine at once, whoever learns of it first: the lease
keeper's renewal, the guard the engine asks before every effect, or the
fence inside a checkpoint or engine-append transaction
(:class:`~streamkit.errors.LeaseLost`). The batch in flight is cancelled, its
background work too, and the runner returns to waiting with the reason in
``failures.last_error``; the host's heartbeat takes the lease again when it is free.

It is one class at about 670 lines because its lease, engine, follower and
worker change together: each of the transitions above touches all four at
once, and its other state (the failures) is already a part of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import structlog

from streamkit.config import RetrySettings
from streamkit.contract import CutoverMode, StartFrom
from streamkit.engine import CANCEL_WAIT, BatchInfo, ProcessorEngine
from streamkit.errors import HistoryTruncated, LeaseLost
from streamkit.events import ScannedRange, StreamEvent
from streamkit.failure_policy import OnMalformed, OnReduceError
from streamkit.host._engine_stream import EngineStream
from streamkit.host._failures import Failures
from streamkit.host._first_start import FirstStart
from streamkit.host._foreground import Foreground
from streamkit.host._lease_keeper import HeldLease
from streamkit.host._metrics import ProcessorMetrics, parse_created_at
from streamkit.host._pacer import Pacer
from streamkit.host._version_role import VersionRole
from streamkit.log import Follow, Log
from streamkit.processor import StreamProcessor
from streamkit.protocols import Clock, HostStore, Lease, LeaseExchange
from streamkit.skips import without_skipped

__all__ = ["ProcessorRunner"]

_log = structlog.get_logger("streamkit.host")

REVIVE = "revive"
# A new engine's first work: catch up AND run the at-head pass. The host took the
# lease, so whatever a previous holder had in flight is gone; the pass restarts
# what state says is owed now, not when that holder's claim falls due.
START = "start"
Item = str | tuple[Sequence[StreamEvent], ScannedRange, bool]
"""A named step, or a range the follower yielded: its events, their proof, and whether it
reached the head (see :attr:`~streamkit.log.Follow.at_head`)."""

MIN_BATCH_GRACE = 5.0
"""Seconds a batch in flight may take to finish at shutdown, even with a shorter grace."""

FOLLOW_RETRY_SECONDS = 1.0
"""How long a runner waits before following again after its follower failed (a read error)."""


class ProcessorRunner:
    """Runs one processor of a host (see the module docstring)."""

    def __init__(
        self,
        processor: StreamProcessor[Any],
        *,
        path: str,
        label: str,
        on_malformed: OnMalformed | None = None,
        on_reduce_error: OnReduceError | None = None,
        cutover: CutoverMode | None = None,
        start: StartFrom | None = None,
        log: Log,
        store: HostStore,
        retry: RetrySettings,
        clock: Clock,
        skipped: set[int],
        on_claim: Callable[[], None],
        on_lease_gone: Callable[[HeldLease], None] = lambda held: None,
        publish_live: bool | Callable[[], bool] = True,
        pacer: Pacer | None = None,
        foreground: Foreground | None = None,
    ) -> None:
        self.processor = processor
        self._pacer = pacer
        self._foreground = Foreground(1.0) if foreground is None else foreground
        self.slug: str = processor.contract.slug
        self.version: str = processor.contract.version
        self.path = path
        self.label = label
        self._on_malformed = on_malformed
        self._on_reduce_error = on_reduce_error
        self._cutover = cutover
        self.first_start = FirstStart(
            start, processor, path=path, log=log, store=store, clock=clock
        )
        self.skipped = skipped
        self._engine: ProcessorEngine[Any] | None = None
        # Set (and replaced) each time the engine changes: what next_engine waits on.
        self._engine_changed = asyncio.Event()
        self.held: HeldLease | None = None
        # The other owner's lease row as this host first saw it, and when (monotonic):
        # unchanged for a ttl, it is stale and may be taken over.
        self.observed: tuple[Lease, float] | None = None
        # When this host first saw the lease free while it was placed on another host.
        self.free_since: float | None = None
        self.claim_due: float | None = None
        self.failures = Failures(self.slug, path, retry, clock)
        self.role = VersionRole(self.slug, self.version, path)
        # Set while it builds under a shadow lease: how its cutover takes the serving lease.
        self._exchange: LeaseExchange | None = None
        self.metrics = ProcessorMetrics()
        self.caught_up = False
        # Whether its batches publish live state (the host: while a client watches).
        self._publish_live = publish_live
        self._log = log
        self._store = store
        self._clock = clock
        self._on_claim = on_claim
        self._on_lease_gone = on_lease_gone
        self._follower: Follow | None = None
        self._due: str | None = None  # START or REVIVE: a revive to run before the next range
        self._overflows = 0
        self._wake = asyncio.Event()
        self._poke = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._item_is_push = False
        self._failing_offset: int | None = None
        self._engine_stream: EngineStream | None = None
        self._closing: set[asyncio.Task[None]] = set()
        # Held by the worker for each item it runs: a hand-off waits for the one in flight.
        self._item = asyncio.Lock()
        # Set while a hand-off waits for the item in flight: an item that keeps failing
        # gives up at its next retry instead of holding the hand-off forever.
        self._handing_off = False

    # -- the engine ----------------------------------------------------------------

    @property
    def engine(self) -> ProcessorEngine[Any] | None:
        """The engine running the processor here now (None: this host does not run it)."""
        return self._engine

    @engine.setter
    def engine(self, engine: ProcessorEngine[Any] | None) -> None:
        self._engine = engine
        changed, self._engine_changed = self._engine_changed, asyncio.Event()
        changed.set()

    async def next_engine(
        self,
        timeout: float,  # noqa: ASYNC109 - a wait for a state change, not an I/O deadline
        *,
        than: ProcessorEngine[Any] | None = None,
        patient: bool = True,
    ) -> ProcessorEngine[Any] | None:
        """The engine running the processor here (other than ``than``), once there is one.

        Waits at most ``timeout`` seconds for one to be built, woken by the
        change itself (no polling); None when none came. Not ``patient``: waits
        only while one is on its way (a cutover swapping the engine here),
        otherwise answers at once.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            engine = self._engine
            if engine is not None and engine is not than:
                return engine
            if not patient and not self.role.switching:
                return None
            left = deadline - loop.time()
            if left <= 0:
                return None
            changed = self._engine_changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                return None

    def builds_in_shadow(self, engine: ProcessorEngine[Any]) -> bool:
        """Whether ``engine`` builds a version that does not serve yet (its state is partial)."""
        return self.role.shadow or engine.in_shadow()

    # -- state for status ----------------------------------------------------------

    @property
    def state(self) -> str:
        """``running`` (holds the lease), ``waiting`` (another host holds it), ``retired``
        (a cutover replaced this version: it is left to hosts running the serving one) or
        ``stopped``."""
        if self._stopping:
            return "stopped"
        if self.engine is None:
            return "retired" if self.role.retired is not None else "waiting"
        return "running"

    @property
    def lease(self) -> Lease | None:
        """The lease this host holds for the processor (as last renewed), or None."""
        return None if self.held is None else self.held.lease

    @property
    def queued(self) -> int:
        """Commits this runner's follower holds that the engine has not taken yet."""
        return 0 if self._follower is None else self._follower.pending

    @property
    def cursor(self) -> int | None:
        """The engine's cursor, or None while this host does not run the processor."""
        return None if self.engine is None else self.engine.cursor

    # -- what the host calls ---------------------------------------------------------

    def start_engine(self, held: HeldLease, exchange: LeaseExchange | None = None) -> None:
        """Build an engine under ``held`` and queue its catch-up.

        ``exchange`` is given when ``held`` is this version's shadow lease: its
        cutover takes the serving lease over (see :mod:`._version_role`).
        """
        self.held = held
        self._exchange = exchange
        if self._stopping:
            return  # the host is stopping: it releases this lease without running
        self.first_start.arm(
            held, never_served=self.role.serving_version is None and not self.role.shadow
        )
        self._build_engine()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work())

    def _build_engine(self) -> None:
        held = self.held
        assert held is not None
        view = self._log.stream(self.path).for_processor(self.slug)
        self._engine_stream = EngineStream(view, held, self.skipped, self.claim_changed)
        self.engine = ProcessorEngine(
            self.processor,
            stream=self._engine_stream,
            storage=self._store.checkpoints(held, self.path, self._exchange),
            fed_by_pushes=True,
            clock=self._clock,
            on_batch=self._on_batch,
            guard=held.check,
            clients_first=None if self._pacer is None else self._pacer.pacing,
            publish_live=self._publish_live,
            on_malformed=self._on_malformed,
            on_reduce_error=self._on_reduce_error,
            cutover=self._cutover,
            give_way=self._foreground.give_way,
            before_load=self.first_start.before_load,
        )
        self.caught_up = False
        # Followed from before the revive's catch-up, so that commits made while it
        # reads (ephemerals too) wait in the follower; the revive then moves it on.
        self._follow()
        self._due = START
        self._wake.set()

    def _follow(self) -> None:
        self._unfollow()
        self._follower = self._log.stream(self.path).follow(0)
        self._overflows = 0

    def _unfollow(self) -> None:
        if self._follower is not None:
            self._follower.close()
            self._follower = None

    def request_revive(self) -> None:
        """Run a revive (the alarm's call) before the next range, unless one is due already."""
        if self.engine is None or self._stopping or self._due is not None:
            return
        self._due = REVIVE
        self._nudge()

    def _nudge(self) -> None:
        self._wake.set()
        if self._follower is not None:
            self._follower.wake()

    def claim_changed(self, at: float | None) -> None:
        """The engine sent a claim: remember it and wake the alarm."""
        previous, self.claim_due = self.claim_due, at
        if at != previous:
            _log.info("claim.set" if at is not None else "claim.released", slug=self.slug, at=at)
        self._on_claim()

    def skip(self, offset: int, *, by: object, recorded_at: int, reason: str | None = None) -> None:
        """Hide the event at ``offset`` from this processor and retry a failing item at once.

        ``by`` and ``reason`` are the skip record's, ``recorded_at`` the offset of its
        event; a skip this runner has already seen changes nothing.
        """
        if offset in self.skipped:
            return
        self.skipped.add(offset)
        self.failures.skipped(offset)
        self._poke.set()
        _log.warning(
            "processor.event_skipped",
            slug=self.slug,
            path=self.path,
            offset=offset,
            by=by,
            reason=reason,
            recorded_at=recorded_at,
        )

    async def lose_lease(self, error: LeaseLost | None) -> None:
        """Stop the engine at once (the batch in flight and background work cancelled), wait.

        With ``error`` None the host gives the lease up on purpose (it is
        stopping); otherwise the reason is logged and kept in ``last_error``.
        """
        engine = self.engine
        held = self.held
        if engine is None:
            return
        self.engine = None
        self.held = None
        self._due = None
        self._unfollow()
        self._poke.set()
        if held is not None:
            self._on_lease_gone(held)
        reason = error or LeaseLost(
            f"processor {self.slug!r} at {self.path!r} was stopped in this host; nothing more "
            "was started",
            details={"slug": self.slug, "path": self.path},
        )
        engine.abort(reason)
        if error is not None:
            self.failures.keep(error.message, error.code, None, engine.cursor)
            successor = await self.role.replaced_by(self._store, error)
            # A cutover fences the version it replaces: in a rolling deploy that is the
            # plan, not a fault, so it is said at info with the version that took over.
            (_log.warning if successor is None else _log.info)(
                "lease.lost",
                slug=self.slug,
                path=self.path,
                cursor=engine.cursor,
                error=error.message,
                cut_over_to=successor,
            )
        await engine.aclose(0.0)

    async def hand_off(self, grace: float) -> HeldLease | None:
        """Stop running here after the item in flight, so another host can take over.

        The engine takes no new item; the one in flight finishes (its
        checkpoint written), background work gets ``grace`` seconds, then the
        lease is returned for the host to release. The runner waits again,
        like one whose lease another host holds. None if it ran nothing.
        """
        if self.engine is None:
            return None
        self.engine.yield_catch_up()  # a backlog is left to the next holder
        self._handing_off = True
        self._poke.set()
        if self._follower is not None:
            self._follower.wake()
        try:
            async with self._item:  # the batch in flight ends first; none starts after
                engine, held = self.engine, self.held
                if engine is None or held is None:
                    return None  # the lease went meanwhile (lost, or the host stopped)
                self.engine = None
                self.held = None
                self._due = None
                self._unfollow()
        finally:
            self._handing_off = False
        # Renewed until the background work is done: it may still append under the lease.
        await engine.aclose(grace)
        self._on_lease_gone(held)
        _log.info("processor.handed_off", slug=self.slug, path=self.path, cursor=engine.cursor)
        return held

    async def stop(self, grace: float) -> None:
        """Finish the item in flight, stop taking work, give background work ``grace`` s.

        The item in flight gets ``max(grace, MIN_BATCH_GRACE)`` seconds, then is
        cancelled (a cancelled batch wrote nothing).
        """
        self._stopping = True
        if self.engine is not None:
            # The batch in flight ends at the event it is on, checkpointed: a stop
            # re-runs no effect of it (see ProcessorEngine.yield_catch_up).
            self.engine.yield_catch_up()
        self._nudge()
        self._poke.set()
        deadline = time.monotonic() + grace
        task = self._task
        if task is not None:
            # The batch in flight may finish (within the grace, and at least a few
            # seconds); one stuck in a blocker is then cancelled: it wrote nothing,
            # and the next host redoes it.
            _, pending = await asyncio.wait((task,), timeout=max(grace, MIN_BATCH_GRACE))
            if pending:
                task.cancel()
                # A blocker that ignores its cancel would hold the stop for ever: it is
                # counted as a stray instead, and the stop goes on without it.
                _, still = await asyncio.wait((task,), timeout=CANCEL_WAIT)
                _log.warning("processor.batch_abandoned", slug=self.slug, path=self.path)
                if still and self.engine is not None:
                    self.engine.track_cancelled(task, f"a batch of {self.slug}")
        self._unfollow()
        engine = self.engine
        if engine is not None:
            await engine.aclose(max(0.0, deadline - time.monotonic()))
        if self._closing:
            await asyncio.wait(self._closing)

    # -- the worker ------------------------------------------------------------------

    async def _work(self) -> None:
        while not self._stopping:
            engine, follower = self.engine, self._follower
            if engine is None or follower is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            due = self._due
            if due is not None:
                self._due = None
                async with self._item:
                    await self._until_done(due)
                if engine is self.engine:
                    follower.skip_to(engine.cursor)  # what the revive read needs no push
                continue
            pacer = self._pacer
            try:
                if pacer is not None:
                    # Clients first (see the pacer's module), decided once there is a range
                    # to take, so that a caller waiting for it is known by then.
                    await follower.ready_or_woken()
                    await pacer.turn(awaited=engine.awaited, wait_awaited=engine.wait_awaited)
                got = await follower.next_or_woken()
            except StopAsyncIteration:
                if follower is self._follower:
                    self._follower = None  # the log closed; the host is stopping
                continue
            except Exception as exc:
                # A read of the follower failed: the log has every event, so follow again
                # from the cursor after a pause (the engine skips what it has reduced).
                _log.error(
                    "follow.failed",
                    slug=self.slug,
                    path=self.path,
                    error=repr(exc),
                    retry_in=FOLLOW_RETRY_SECONDS,
                )
                await self._backoff(FOLLOW_RETRY_SECONDS)
                if follower is self._follower and engine is self.engine:
                    self._follow()
                    self._follower.skip_to(engine.cursor)
                continue
            if got is None or follower is not self._follower:
                continue  # woken (a revive is due, or the runner stops or lost its lease)
            if follower.overflows != self._overflows:
                self._overflows = follower.overflows
                _log.warning(
                    "processor.backlog_dropped",
                    slug=self.slug,
                    path=self.path,
                    overflows=self._overflows,
                    detail="fell too far behind to be held in memory: reading the log instead",
                )
            events, scanned = got
            async with self._item:
                began = time.monotonic()  # (not the wait for the item lock: no work)
                await self._until_done((events, scanned, follower.at_head))
                took = time.monotonic() - began
            if pacer is not None:
                pacer.ran(took)

    async def _until_done(self, item: Item) -> None:
        while not self._stopping:
            engine = self.engine
            if engine is None or self.failures.cannot_build is not None:
                return  # (a build that cannot be done waits for the host to take its lease)
            started = time.perf_counter()
            # Read for the catch-up's log line only: a snapshot per range would cost
            # every live event its construction.
            catching_up = item == START and not self.caught_up
            reduced_before = engine.statistics().events_reduced if catching_up else 0
            # A rebuild in the shadow gives way to this range, unless it is the rebuild.
            serving: AbstractContextManager[None] = (
                nullcontext() if self.role.shadow else self._foreground.serving()
            )
            try:
                with serving:
                    if self.failures.count and await self._step(engine):
                        continue
                    await self._run(engine, item)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if engine is self.engine or (current is not None and current.cancelling()):
                    raise  # the worker itself is being cancelled (the host stops)
                return  # the engine was aborted (lease lost): its batch is gone, by design
            except LeaseLost as exc:
                if engine is self.engine:
                    await self.lose_lease(exc)
                return
            except Exception as exc:
                if engine is not self.engine:
                    return  # the lease went meanwhile; nothing of this engine matters
                delay = self._failed(engine, item, exc)
                await self._backoff(delay)
                if self._handing_off:
                    return  # the next holder starts from the checkpoint; the item goes
                if (
                    (engine.latched_error is not None or self._skipped_where_stopped(engine))
                    and engine is self.engine
                    and not self._stopping
                ):
                    # The same engine can only fail the same way (a latched refusal, or a
                    # fold stopped before an event since skipped): start over from the
                    # checkpoint.
                    _log.warning("processor.rebuilt", slug=self.slug, path=self.path)
                    self._closing_engine(engine)
                    self._build_engine()
                    return
                continue
            self._succeeded(engine, item, started, reduced_before)
            return

    def _skipped_where_stopped(self, engine: ProcessorEngine[Any]) -> bool:
        """Whether ``engine`` stopped before an event an operator has skipped since."""
        stopped_at = engine.statistics().stopped_at
        return stopped_at is not None and stopped_at in self.skipped

    async def _step(self, engine: ProcessorEngine[Any]) -> bool:
        """After a failure, process the next durable event alone; False if none is pending.

        Retrying one event at a time pins a failure on the exact offset that
        causes it (a batch of 500 tells only that one of them failed), so
        ``status`` and the ``skip`` an operator runs name the right event. The
        events before it are checkpointed on the way.
        """
        stream = self._engine_stream
        assert stream is not None  # built with the engine
        cursor = engine.cursor
        page = await stream.read(cursor, 1)
        if page.scanned_through_offset <= cursor:
            self._failing_offset = None
            return False
        self._failing_offset = page.events[0].offset if page.events else None
        await engine.process_event_batch(
            page.events, ScannedRange(cursor, page.scanned_through_offset)
        )
        self._failing_offset = None
        return True

    async def _run(self, engine: ProcessorEngine[Any], item: Item) -> None:
        self._item_is_push = not isinstance(item, str)
        try:
            if item == START:
                await engine.revive()
            elif item == REVIVE:
                _log.info("processor.revive", slug=self.slug, path=self.path)
                await engine.revive()
            else:
                assert not isinstance(item, str)
                events, scanned, at_head = item
                if self.skipped:
                    events = without_skipped(events, self.skipped)
                await engine.process_event_batch(events, scanned, at_head=at_head)
        finally:
            self._item_is_push = False

    def _succeeded(
        self, engine: ProcessorEngine[Any], item: Item, started: float, reduced_before: int
    ) -> None:
        self.failures.succeeded(engine.cursor)
        if item == START and not self.caught_up:
            self.caught_up = True
            seconds = time.perf_counter() - started
            reduced = engine.statistics().events_reduced - reduced_before
            _log.info(
                "catch_up.done",
                slug=self.slug,
                path=self.path,
                cursor=engine.cursor,
                events=reduced,
                seconds=round(seconds, 3),
                events_per_second=round(reduced / seconds, 1) if seconds > 0 else None,
            )

    def _failed(self, engine: ProcessorEngine[Any], item: Item, exc: Exception) -> float:
        self.metrics.batch_failed(time.monotonic())
        # The event whose effect failed, else the one a one-at-a-time retry read,
        # else the first the item held (a read or a checkpoint write failed).
        statistics = engine.statistics()
        offset = (
            statistics.failed_at
            or statistics.stopped_at
            or self._failing_offset
            or _first_pending(item, engine.cursor)
        )
        delay = self.failures.failed(exc, offset, engine.cursor)
        if isinstance(exc, HistoryTruncated) and self.role.shadow and exc.details.get("deleted"):
            self.failures.cannot_build_past(exc, self.version)
        return delay

    async def _backoff(self, delay: float) -> None:
        self._poke.clear()
        if self._stopping:
            return
        try:
            async with asyncio.timeout(delay):
                await self._poke.wait()
        except TimeoutError:
            pass

    def _closing_engine(self, engine: ProcessorEngine[Any]) -> None:
        task = asyncio.get_running_loop().create_task(engine.aclose(0.0))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _on_batch(self, info: BatchInfo) -> None:
        latency = None
        if self._item_is_push and info.wrote_checkpoint:
            newest = next(
                (e for e in reversed(info.events) if not e.ephemeral and e.created_at), None
            )
            stamp = None if newest is None else parse_created_at(newest.created_at)
            if stamp is not None:
                latency = self._clock() - stamp
        self.metrics.batch_done(info.delivered, time.monotonic(), latency)


def _first_pending(item: Item, cursor: int) -> int:
    """The first durable offset past ``cursor`` that ``item`` would process (a best guess)."""
    if not isinstance(item, str):
        events, _, _ = item
        for event in events:
            if not event.ephemeral and event.offset > cursor:
                return event.offset
    return cursor + 1

"""One processor inside the host: its lease, its engine, its queue, its retries.

A :class:`ProcessorRunner` owns one processor on one stream path. While it
holds the lease it has an engine and a worker task that takes work from its
own queue, one item at a time: the catch-up after the engine is built, each
push the host's follower fans out, and each revive the alarm asks for. Every
runner has its own queue, so a slow processor never stalls another.

No crash loop: an item that fails is retried whole with exponential backoff
(``RetrySettings``), never in a hot loop; after ``stall_after`` consecutive
failures the runner reports itself stalled (with the error and the offset it
is stuck at) and keeps retrying at the capped delay. An operator's skip wakes
the retry at once. A failure the engine latched (a state too large to
checkpoint, say) cannot pass by retrying the same engine, so the runner builds
a fresh engine from the checkpoint after the backoff instead.

A lost lease stops the engine at once, whoever learns of it first: the lease
keeper's renewal, the guard the engine asks before every effect, or the
fence inside a checkpoint or engine-append transaction
(:class:`~streamkit.errors.LeaseLost`). The batch in flight is cancelled, its
background work too, and the runner returns to waiting with the reason in
``last_error``; the host's heartbeat takes the lease again when it is free.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from streamkit.config import RetrySettings
from streamkit.engine._engine import BatchInfo, ProcessorEngine
from streamkit.errors import LeaseLost, StreamkitError
from streamkit.events import EventInput, ReadPage, ScannedRange, StreamEvent
from streamkit.host._lease_keeper import HeldLease
from streamkit.host._metrics import ProcessorMetrics, parse_created_at
from streamkit.log._log import Log, ProcessorStreamView
from streamkit.processor import StreamProcessor
from streamkit.protocols import Clock, HostStore, Lease
from streamkit.skips import filter_page, without_skipped

__all__ = ["ProcessorRunner"]

_log = structlog.get_logger("streamkit.host")

CATCH_UP = "catch-up"
REVIVE = "revive"
# A new engine's first work: catch up AND run the at-head pass. The host took the
# lease, so whatever a previous holder had in flight is gone; the pass restarts
# what state says is owed now, not when that holder's claim falls due.
START = "start"
Item = str | tuple[Sequence[StreamEvent], ScannedRange, int]
"""A named step, or a push: its events, their proof, and the bytes of stored JSON they hold."""

MIN_BATCH_GRACE = 5.0
"""Seconds a batch in flight may take to finish at shutdown, even with a shorter grace."""

MAX_QUEUED = 10_000
"""Pushes a runner buffers at most; past that it drops them and catches up from the log."""

MAX_QUEUED_BYTES = 16 * 1024 * 1024
"""The stored JSON of the pushes a runner buffers at most; past that, the same as above."""


class _EngineStream:
    """The stream an engine sees: the processor's view, minus skipped events, claims reported.

    One per engine incarnation, bound to the lease that engine runs under: its
    appends are fenced by that lease and no other, so an old engine's late
    append can never pass under a lease taken again later.
    """

    __slots__ = ("_held", "_runner", "_view")

    def __init__(self, view: ProcessorStreamView, runner: ProcessorRunner, held: HeldLease) -> None:
        self._view = view
        self._runner = runner
        self._held = held

    @property
    def path(self) -> str:
        return self._view.path

    async def append(self, *events: EventInput | Mapping[str, Any]) -> list[StreamEvent]:
        # Every durable append of the engine commits only under its own lease.
        held = self._held
        lease = held.lease
        stamp = {"owner": lease.owner, "generation": lease.generation}
        return await self._view.append(*(_with_lease(e, stamp) for e in events), fence=held.fence)

    async def read(self, after_offset: int = 0, limit: int = 500) -> ReadPage:
        page = await self._view.read(after_offset, limit)
        return filter_page(page, self._runner.skipped)

    async def claim(self, at: float | None) -> None:
        await self._view.claim(at)
        self._runner.claim_changed(at)


class ProcessorRunner:
    """Runs one processor of a host (see the module docstring)."""

    def __init__(
        self,
        processor: StreamProcessor[Any],
        *,
        path: str,
        label: str,
        log: Log,
        store: HostStore,
        retry: RetrySettings,
        clock: Clock,
        skipped: set[int],
        on_claim: Callable[[], None],
        on_lease_gone: Callable[[HeldLease], None] = lambda held: None,
    ) -> None:
        self.processor = processor
        self.slug: str = processor.contract.slug
        self.version: str = processor.contract.version
        self.path = path
        self.label = label
        self.skipped = skipped
        self.engine: ProcessorEngine[Any] | None = None
        self.held: HeldLease | None = None
        # The other owner's lease row as this host first saw it, and when (monotonic):
        # unchanged for a ttl, it is stale and may be taken over.
        self.observed: tuple[Lease, float] | None = None
        self.claim_due: float | None = None
        self.failures = 0
        self.stalled = False
        self.stalled_at: int | None = None
        self.last_error: dict[str, Any] | None = None
        self.metrics = ProcessorMetrics()
        self.caught_up = False
        self._log = log
        self._store = store
        self._retry = retry
        self._clock = clock
        self._on_claim = on_claim
        self._on_lease_gone = on_lease_gone
        self._queue: deque[Item] = deque()
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self._poke = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._item_is_push = False
        self._failing_offset: int | None = None
        self._engine_stream: _EngineStream | None = None
        self._closing: set[asyncio.Task[None]] = set()

    # -- state for status ----------------------------------------------------------

    @property
    def state(self) -> str:
        """``running`` (holds the lease), ``waiting`` (another host holds it) or ``stopped``."""
        if self._stopping:
            return "stopped"
        return "waiting" if self.engine is None else "running"

    @property
    def lease(self) -> Lease | None:
        """The lease this host holds for the processor (as last renewed), or None."""
        return None if self.held is None else self.held.lease

    @property
    def queued(self) -> int:
        """Work items waiting in this runner's queue."""
        return len(self._queue)

    @property
    def cursor(self) -> int | None:
        """The engine's cursor, or None while this host does not run the processor."""
        return None if self.engine is None else self.engine.cursor

    # -- what the host calls ---------------------------------------------------------

    def start_engine(self, held: HeldLease) -> None:
        """Build an engine under ``held`` and queue its catch-up."""
        self.held = held
        if self._stopping:
            return  # the host is stopping: it releases this lease without running
        self._build_engine()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work())

    def _build_engine(self) -> None:
        held = self.held
        assert held is not None
        view = self._log.stream(self.path).for_processor(self.slug)
        self._engine_stream = _EngineStream(view, self, held)
        self.engine = ProcessorEngine(
            self.processor,
            stream=self._engine_stream,
            storage=self._store.checkpoints(held),
            fed_by_pushes=True,
            clock=self._clock,
            on_batch=self._on_batch,
            guard=held.check,
        )
        self.caught_up = False
        self._queue.clear()
        self._queued_bytes = 0
        self._queue.append(START)
        self._wake.set()

    def push(self, events: Sequence[StreamEvent], scanned: ScannedRange, size: int = 0) -> None:
        """Queue one commit for the engine (dropped while this host does not run it).

        ``size`` is the bytes of stored JSON its events hold: the queue is
        bounded by bytes as well as by count.
        """
        if self.engine is None or self._stopping:
            return
        if len(self._queue) >= MAX_QUEUED or (
            self._queued_bytes and self._queued_bytes + size > MAX_QUEUED_BYTES
        ):
            # A processor far behind: the log has every durable event, so re-read it
            # (page by page, each bounded) rather than hold an unbounded backlog;
            # only its missed ephemerals are gone.
            _log.warning(
                "processor.backlog_dropped",
                slug=self.slug,
                path=self.path,
                queued=len(self._queue),
                queued_bytes=self._queued_bytes,
                detail="catching up from the log instead",
            )
            self._queue.clear()
            self._queued_bytes = 0
            self._queue.append(CATCH_UP)
        self._queue.append((events, scanned, size))
        self._queued_bytes += size
        self._wake.set()

    def request_revive(self) -> None:
        """Queue a revive (the alarm's call), unless one is already queued."""
        if self.engine is None or self._stopping or REVIVE in self._queue:
            return
        self._queue.append(REVIVE)
        self._wake.set()

    def claim_changed(self, at: float | None) -> None:
        """The engine sent a claim: remember it and wake the alarm."""
        previous, self.claim_due = self.claim_due, at
        if at != previous:
            _log.info("claim.set" if at is not None else "claim.released", slug=self.slug, at=at)
        self._on_claim()

    def skip(self, offset: int) -> None:
        """Hide the event at ``offset`` from this processor and retry a failing item at once."""
        self.skipped.add(offset)
        self._poke.set()

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
        self._queue.clear()
        self._queued_bytes = 0
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
            self.last_error = {
                "error": error.message[:1000],
                "code": error.code,
                "offset": None,
                "cursor": engine.cursor,
                "failures": self.failures,
                "at": self._clock(),
            }
            _log.warning(
                "lease.lost",
                slug=self.slug,
                path=self.path,
                cursor=engine.cursor,
                error=error.message,
            )
        await engine.aclose(0.0)

    async def stop(self, grace: float) -> None:
        """Finish the item in flight, stop taking work, give background work ``grace`` s.

        The item in flight gets ``max(grace, MIN_BATCH_GRACE)`` seconds, then is
        cancelled (a cancelled batch wrote nothing).
        """
        self._stopping = True
        self._wake.set()
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
                await asyncio.wait((task,))
                _log.warning("processor.batch_abandoned", slug=self.slug, path=self.path)
        engine = self.engine
        if engine is not None:
            await engine.aclose(max(0.0, deadline - time.monotonic()))
        if self._closing:
            await asyncio.wait(self._closing)

    # -- the worker ------------------------------------------------------------------

    async def _work(self) -> None:
        while not self._stopping:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            item = self._queue.popleft()
            if not isinstance(item, str):
                self._queued_bytes -= item[2]
            await self._until_done(item)

    async def _until_done(self, item: Item) -> None:
        while not self._stopping:
            engine = self.engine
            if engine is None:
                return
            started = time.perf_counter()
            reduced_before = engine.events_reduced
            try:
                if self.failures and await self._step(engine):
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
                if (
                    engine.latched_error is not None
                    and engine is self.engine
                    and not self._stopping
                ):
                    # The same engine can only fail the same way: start over from the checkpoint.
                    _log.warning("processor.rebuilt", slug=self.slug, path=self.path)
                    self._closing_engine(engine)
                    self._build_engine()
                    return
                continue
            self._succeeded(engine, item, started, reduced_before)
            return

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
            if item == CATCH_UP:
                await engine.catch_up_from_log()
            elif item == START:
                await engine.revive()
            elif item == REVIVE:
                _log.info("processor.revive", slug=self.slug, path=self.path)
                await engine.revive()
            else:
                assert not isinstance(item, str)
                events, scanned, _ = item
                if scanned.after > engine.cursor:
                    _log.info(
                        "gap.repair",
                        slug=self.slug,
                        path=self.path,
                        cursor=engine.cursor,
                        push_after=scanned.after,
                        detail="reading the missing range from the log first",
                    )
                if self.skipped:
                    events = without_skipped(events, self.skipped)
                await engine.process_event_batch(events, scanned)
        finally:
            self._item_is_push = False

    def _succeeded(
        self, engine: ProcessorEngine[Any], item: Item, started: float, reduced_before: int
    ) -> None:
        if self.failures:
            _log.info(
                "processor.recovered",
                slug=self.slug,
                path=self.path,
                failures=self.failures,
                cursor=engine.cursor,
            )
        self.failures = 0
        self.stalled = False
        self.stalled_at = None
        if item in (CATCH_UP, START) and not self.caught_up:
            self.caught_up = True
            seconds = time.perf_counter() - started
            reduced = engine.events_reduced - reduced_before
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
        self.failures += 1
        self.metrics.batch_failures += 1
        delay = self._retry.delay(self.failures)
        # The event whose effect failed, else the one a one-at-a-time retry read,
        # else the first the item held (a read or a checkpoint write failed).
        offset = engine.failed_at or self._failing_offset or _first_pending(item, engine.cursor)
        self.last_error = {
            "error": repr(exc)[:1000],
            "code": exc.code if isinstance(exc, StreamkitError) else None,
            "offset": offset,
            "cursor": engine.cursor,
            "failures": self.failures,
            "at": self._clock(),
        }
        _log.warning(
            "batch.failed",
            slug=self.slug,
            path=self.path,
            cursor=engine.cursor,
            offset=offset,
            failures=self.failures,
            retry_in=round(delay, 3),
            error=repr(exc)[:500],
        )
        if self.failures >= self._retry.stall_after:
            if not self.stalled:
                _log.error(
                    "processor.stalled",
                    slug=self.slug,
                    path=self.path,
                    offset=offset,
                    failures=self.failures,
                    error=repr(exc)[:500],
                    detail=f"retrying every {self._retry.max_delay:g} s at most; "
                    f"`streamkit skip {self.slug} --offset {offset}` moves past the event",
                )
            self.stalled = True
            self.stalled_at = offset
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


def _with_lease(
    event: EventInput | Mapping[str, Any], stamp: dict[str, Any]
) -> EventInput | Mapping[str, Any]:
    """An engine's event with ``source.processor.lease`` naming the lease it is written under.

    The engine stamps ``source.processor`` on what the processor appends; the
    host adds which owner and generation wrote it, so the log itself shows
    that no stale holder wrote after a takeover.
    """
    if not isinstance(event, Mapping):
        return event
    source = event.get("source")
    processor = source.get("processor") if isinstance(source, Mapping) else None
    if not isinstance(processor, Mapping):
        return event
    assert isinstance(source, Mapping)
    return {**event, "source": {**source, "processor": {**processor, "lease": stamp}}}

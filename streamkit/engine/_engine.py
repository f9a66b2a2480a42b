"""The processor engine: drives one :class:`~streamkit.processor.StreamProcessor` over a stream.

The engine folds events into checkpointed state, runs the processor's effects in
a strict order, repairs gaps, revives work a dead host left unfinished, and
publishes the processor's live state. Its rules:

1. One serial chain per processor: batches never interleave.
2. One event at a time inside a batch: an event's ``block_processor_while``
   work, including blockers registered by blockers, completes before the next
   event's ``process_event`` starts.
3. ``run_in_background`` work is not awaited. An attempt starts under a claim
   ("revive me by start + 20 s" at the latest); the claim is written only when
   that moves its deadline earlier, and stands until the revive it comes due
   for, which ends it when nothing is in flight. An attempt still in flight at
   a :meth:`~ProcessorEngine.revive` claims again with the delay doubled, up
   to 30 minutes.
4. One durable commit per batch, after every event's blocking work settled:
   the checkpoint (cursor and state, one row, one statement) is written before
   the cursor moves. A failed batch persists nothing and leaves the engine as
   it was; the error reaches the caller, who retries the batch whole. A batch of
   only ephemeral events writes nothing; a stale re-push writes nothing.
5. The at-head pass: the last consumable event of a batch that reaches the head
   is delivered with ``delivery.caught_up = True``; a batch that reaches the
   head without one gets one extra ``process_event`` with ``event=None``.

Delivery is push-first: :meth:`~ProcessorEngine.process_event_batch` takes the
events of one commit and the :class:`~streamkit.events.ScannedRange` it proves.
The cursor advances by the range, never by counting events. Durable events are
reduced at most once per engine (offset above the cursor); ephemeral events in a
push are always delivered when consumed. The cursor never regresses.

Persist first, then emit: the live-state delta of a batch goes out after its
checkpoint is written, so a crash in between loses a notification, never state.

Live state costs nothing while nobody wants it (``publish_live``, see
:mod:`._live`): the revision chain rules never change.

The engine is a coordinator of parts, each owning its state (the checkpoint,
the pages, the live projection, the batch runner, the fold, the claims, the
effects, the waiters, the strays, the shadow build). What stays here is one
thing: the serial chain that alone owns the state and the cursor, with the
read verbs and the effect-host calls that reach it. It stays whole past 600
lines for that reason: cut further, the cursor would again be written in
several modules (the parts hand positions back; none writes the cursor).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.contract import CutoverMode, ProcessorContract
from streamkit.engine._batch import BatchInfo, BatchRunner
from streamkit.engine._checkpointer import Checkpointer
from streamkit.engine._claims import REVIVE_AFTER, REVIVE_AFTER_MAX, ClaimKeeper
from streamkit.engine._cutover_gate import CutoverGate
from streamkit.engine._effects import EffectAppender
from streamkit.engine._fold import Fold, report
from streamkit.engine._live import LiveProjection
from streamkit.engine._pages import MAX_CATCH_UP_PAGE, PAGE_SIZE, PageReader
from streamkit.engine._shadow import ShadowBuild
from streamkit.engine._statistics import EngineStatistics
from streamkit.engine._strays import Strays
from streamkit.engine._waiters import CursorWaiters
from streamkit.errors import (
    InvalidContract,
    InvalidRequest,
    StreamkitError,
)
from streamkit.events import EventInput, ReadPage, ScannedRange, StreamEvent
from streamkit.failure_policy import OnMalformed, OnReduceError
from streamkit.live_state import LiveSnapshot
from streamkit.processor import ProcessEventArgs, StreamProcessor, Work, retain_of
from streamkit.protocols import (
    CheckpointStorage,
    Clock,
    ProcessorStream,
    StreamAccess,
)

__all__ = [
    "MAX_CATCH_UP_PAGE",
    "PAGE_SIZE",
    "REVIVE_AFTER",
    "REVIVE_AFTER_MAX",
    "BatchInfo",
    "EngineStatistics",
    "ProcessorEngine",
    "ProcessorSnapshot",
]

S = TypeVar("S")


class ProcessorSnapshot(NamedTuple, Generic[S]):
    """The reduced state and the offset it was reduced through, read together."""

    offset: int
    state: S


class ProcessorEngine(Generic[S]):
    """Drives ``processor`` over ``stream``, checkpointing into ``storage``.

    ``fed_by_pushes=True`` is the host's word that every commit the processor
    consumes reaches it through :meth:`process_event_batch`; the read verbs
    then trust the head a catch-up read reached and skip reading the log until a
    push shows a later one. ``clock`` gives epoch seconds for claims and
    wakeups. ``on_batch`` is called after each committed batch (a failure in it
    is reported and ignored). ``clients_first`` is the host's word that its
    clients are appending and it paces its processors meanwhile (what
    ``args.yield_to_clients()`` tells the processor); without it, never.

    ``publish_live`` says whether batches publish live-state deltas: ``True``
    (the default) after every batch; ``False`` never by themselves (only
    :meth:`live_snapshot` and :meth:`publish_live_state` bring the live state
    to the present); or a callable asked after each batch, such as "does
    anyone watch?" (the host's choice). A callable that raises counts as
    ``True``.

    ``on_malformed`` (``"skip"`` or ``"stall"``) overrides the contract's
    choice for a stored payload that does not validate (the host's config),
    ``on_reduce_error`` its choice for an event the reduce raises on (both
    ``"stall"`` when nobody chose: :func:`~streamkit.contract.failure_choice`);
    ``cutover`` (``"auto"`` or ``"manual"``) the contract's choice of when a
    version built in the shadow takes over (see :meth:`cut_over`).
    ``give_way(seconds)`` is awaited between the pages of such a build,
    with how long the last page took: the host's serving processors go
    first (``streamkit.host``'s foreground); it returns the seconds it waited.

    The checkpoint is loaded by the first piece of work on the chain, so
    building an engine does no I/O. ``before_load`` is awaited on the chain
    before each attempt to load it (the host writes the first checkpoint of
    a processor declared to start past offset 1 there); a failure fails that
    piece of work, as a failed load does. Everything runs on the event loop of its
    first call.
    """

    def __init__(
        self,
        processor: StreamProcessor[S],
        *,
        stream: ProcessorStream,
        storage: CheckpointStorage,
        fed_by_pushes: bool = False,
        clock: Clock = time.time,
        on_batch: Callable[[BatchInfo], None] | None = None,
        guard: Callable[[], None] | None = None,
        clients_first: Callable[[], bool] | None = None,
        publish_live: bool | Callable[[], bool] = True,
        on_malformed: OnMalformed | None = None,
        on_reduce_error: OnReduceError | None = None,
        cutover: CutoverMode | None = None,
        give_way: Callable[[float], Awaitable[float]] | None = None,
        before_load: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        contract: ProcessorContract[S] | None = getattr(processor, "contract", None)
        if not isinstance(contract, ProcessorContract):
            raise InvalidContract(
                f"{type(processor).__name__} has no contract; set a class attribute "
                "`contract = define_processor_contract(...)`; no engine was built",
                details={"processor": type(processor).__name__},
            )
        self._processor = processor
        self._contract = contract
        self._slug: str = contract.slug
        self._version: str = contract.version
        self._stream = stream
        self._fed_by_pushes = fed_by_pushes
        self._clock = clock
        self._on_batch = on_batch
        self._guard = guard
        self._clients_first = clients_first
        self._before_load = before_load
        self._chain_tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

        # The engine's own state: the reduced state, the offset it is reduced
        # through, and where the chain stands. Only this module writes them.
        self._loaded = False
        self._state: S = contract.initial_state()
        self._cursor = 0
        # The offset whose delivery is under way, and the one a failed batch stopped at.
        self._delivering: int | None = None
        self._failed_at: int | None = None
        # The highest `through` any push showed: what decides whether a push
        # reaches the head (rule 5).
        self._pushed_through: int | None = None
        # The highest durable head a push proved, and (fed by pushes) the head a
        # catch-up read reached: what the read verbs trust as "the head". A push
        # of ephemerals only proves no durable lies in its range, so it shows a
        # durable head of at most its `after` (else every live-state delta would
        # send the next snapshot to the log for nothing).
        self._durable_shown: int | None = None
        self._head_read_from_log: int | None = None
        self._latched: StreamkitError | None = None
        self._yielding = False
        # Whether an at-head pass is owed: some batch ran without one since the last.
        self._owes_at_head_pass = True
        self._last_batch_at_head = False
        self._events_reduced = 0
        self._batches = 0
        self._batch_failures = 0
        self._last_error: BaseException | None = None

        # The parts, each owning its own state.
        self._fold: Fold[S] = Fold(
            processor,
            on_error=self._note_error,
            on_malformed=on_malformed,
            on_reduce_error=on_reduce_error,
        )
        self._pages: PageReader[S] = PageReader(stream, self._fold)
        self._checkpoints: Checkpointer[S] = Checkpointer(
            contract, storage, self._latch, retain_of(processor), self._fold.tally
        )
        self._live: LiveProjection[S] = LiveProjection(processor, publish_live, self._swallowed)
        self._waiters = CursorWaiters(self._slug, lambda: self._cursor)
        self._strays = Strays(self._slug)
        self._claims = ClaimKeeper(stream, clock, self._swallowed, self._strays)
        self._effects = EffectAppender(contract, stream, self._swallowed)
        self._shadow: ShadowBuild[S] = ShadowBuild(
            self._slug,
            self._version,
            pages=self._pages,
            checkpoints=self._checkpoints,
            gate=CutoverGate(cutover or contract.cutover),
            tally=self._fold.tally,
            give_way=give_way,
            yielding=lambda: self._yielding,
            latched=lambda: self._latched,
            resume=self._resume,
        )
        # Without an overridden process_event there are no effects to run, so
        # the batch loop skips building their arguments altogether.
        self._has_effects = type(processor).process_event is not StreamProcessor.process_event
        self._batch: BatchRunner[S] = BatchRunner(
            fold=self._fold,
            pages=self._pages,
            checkpoints=self._checkpoints,
            deliver=self._deliver,
            has_effects=self._has_effects,
            advance=self._advance,
            yielding=lambda: self._yielding,
        )

    # -- driving the reduce --------------------------------------------------------

    def process_event_batch(
        self,
        events: Sequence[StreamEvent],
        range: ScannedRange | tuple[int, int],
        *,
        at_head: bool | None = None,
    ) -> asyncio.Task[None]:
        """Process the events of one commit, which ``range`` proves are all of ``(after, through]``.

        Returns a task (already scheduled, so the call is fire-and-forget safe;
        await it to see the outcome). A range that starts past the cursor first
        repairs the gap from the log (durable events up to ``after``, never
        delivered as caught up); the push itself is always processed after.
        Never await this from inside a batch of the same engine: the chain is
        serial, so that would wait for itself.

        ``at_head`` says whether the range reaches the head (the at-head pass
        runs then); by default it does when no range given so far ends
        later. A caller that knows more (a follower with pushes queued behind
        this one: :attr:`~streamkit.log.Follow.at_head`) says so.
        """
        after, through = range
        if (
            isinstance(after, bool)
            or isinstance(through, bool)
            or not isinstance(after, int)
            or not isinstance(through, int)
            or not 0 <= after <= through
        ):
            raise InvalidRequest(
                f"a scanned range must be two integers 0 <= after <= through, got {range!r}; "
                "nothing was processed",
                details={"range": repr(range)[:200]},
            )
        scanned = ScannedRange(after, through)
        # Recorded now, not when the task runs: a read verb called right after
        # this push must know that the head moved.
        if self._pushed_through is None or through > self._pushed_through:
            self._pushed_through = through
        batch = tuple(events)
        shown = through if any(not e.ephemeral for e in batch) else after
        if self._durable_shown is None or shown > self._durable_shown:
            self._durable_shown = shown
        return self._on_chain(lambda: self._push(batch, scanned, at_head))

    def catch_up_from_log(self) -> asyncio.Task[None]:
        """Read and process the log from the cursor to its head, page by page.

        Returns a scheduled task. The last page's ``at_head`` decides the
        caught-up pass.
        """
        return self._on_chain(self._catch_up)

    async def revive(self) -> None:
        """The alarm's call: catch up, run the at-head pass, and claim again if work is in flight.

        A catch-up that reached the head already ran the at-head pass; one that
        found nothing new runs it here. An attempt still in flight claims
        again with the delay doubled (capped at 30 minutes). Returns once the
        new claim has reached the stream.
        """
        self._raise_if_latched()
        self._last_batch_at_head = False
        claim_before = self._claims.last_sent
        await self.catch_up_from_log()
        if self._yielding:
            return  # not caught up, and not to be: see yield_catch_up
        if not self._last_batch_at_head:
            await self._on_chain(self._eventless_at_head_pass)
        self._claims.revived()
        # The host spent the claim that revived us: unless this revive already
        # sent one, send ours even if it looks unchanged.
        claim = self._claims.sync(force=self._claims.last_sent is claim_before)
        if claim is None:
            claim = self._claims.last_sent
        if claim is not None:
            await asyncio.wait((claim,))

    # -- the read verbs ------------------------------------------------------------

    async def snapshot(self) -> ProcessorSnapshot[S]:
        """``(offset, state)``, reading the log first unless the head shown so far is reduced."""
        self._raise_if_latched()
        if not self._reduced_through_shown_head():
            await self.catch_up_from_log()
        return ProcessorSnapshot(self._cursor, self._state)

    async def live_snapshot(self) -> LiveSnapshot:
        """``(rev, projection)`` for a live-state client's seed, caught up like :meth:`snapshot`."""
        self._raise_if_latched()
        if not self._reduced_through_shown_head():
            await self.catch_up_from_log()
        # A lagging live state is brought to the present for this seed without
        # a delta nobody needs.
        return self._live.snapshot(self._state)

    # The timeout is part of this verb's contract (SPEC 4), hence the noqa.
    async def wait_until_processed(
        self,
        offset: int,
        timeout: float | None = 10.0,  # noqa: ASYNC109
    ) -> None:
        """Return once the cursor reaches ``offset``.

        Starts a catch-up; a catch-up that fails raises its own error here. An
        engine ``fed_by_pushes`` that has caught up once waits for the push
        instead, and starts the catch-up only if the wait lasts past
        :data:`~streamkit.engine._waiters.PUSH_GRACE`. On timeout raises
        :class:`~streamkit.errors.ProcessorTimeout` and the waiter leaves the
        list. An ephemeral's offset is reached only by the push that carried it
        (the log proves nothing past the durable head).
        """
        self._raise_if_latched()
        if self._loaded and self._cursor >= offset:
            return
        # An engine that read the log to its head once, and whose host pushes every
        # later commit, gives the push its grace first: a read now would only race it
        # (two batches, one of them stale, for one event).
        await self._waiters.wait(
            offset,
            timeout,
            self.catch_up_from_log,
            push_first=self._fed_by_pushes and self._head_read_from_log is not None,
        )

    async def aclose(self, grace: float = 0.0) -> None:
        """Give background attempts ``grace`` seconds to settle, then abandon the rest.

        An abandoned attempt keeps its claim, so the next host revives the
        processor and the at-head pass restarts what state says is owed. Writes
        a state whose write was deferred, if no batch is in flight (so the next
        start replays nothing; skipping it, or a failure, costs only that
        replay; closing never waits behind a batch for it). Waits for queued
        claims and live-state deltas to reach the stream.
        """
        await self._claims.abandon(grace)
        if (
            self._loaded
            and self._latched is None
            and not self._lock.locked()
            and not self._checkpoints.persisted(self._state)
        ):
            try:
                await self._on_chain(self._write_state_now)
            except Exception as exc:
                self._swallowed("processor.state_write_failed", exc, None)
        await self._live.drain()

    # -- the chain ------------------------------------------------------------------

    def abort(self, error: StreamkitError) -> None:
        """Stop this engine now: ``error`` is latched and the work in flight is cancelled.

        For a host that learned it may no longer run the processor (its lease
        was lost): the batch in flight is cancelled at its next await, so no
        further ``process_event``, blocker or append of this engine starts;
        background attempts are cancelled, their claim kept for the next host.
        A cancelled batch persisted nothing. Every later call fails with
        ``error`` until a new engine is built.
        """
        self._latch(error)
        for task in list(self._chain_tasks):
            task.cancel()
            self._strays.watch(task, "a batch (its process_event or blocking work)")
        self._claims.cancel_all()

    def yield_catch_up(self) -> None:
        """End catch-ups at the event in flight, its checkpoint written, from now on.

        For a host handing the processor to another, or stopping: a catch-up
        batch of a processor with effects ends once the event it is
        delivering has settled (its blockers done) and checkpoints through
        it, so the next holder runs none of its effects again; one without
        effects finishes its page. What is left unread is the next holder's,
        and so is the at-head pass (which only a caught-up engine may run);
        the claim stays as stored, for the next holder to read. Pushed
        batches still run: each is one batch.
        """
        self._yielding = True

    def guard(self) -> None:
        """Raise unless this engine may still start an effect (latched, or its host's guard)."""
        self._raise_if_latched()
        if self._guard is not None:
            self._guard()

    def _on_chain(self, work: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._chained(work))
        self._chain_tasks.add(task)
        task.add_done_callback(self._chain_tasks.discard)
        return task

    async def _chained(self, work: Callable[[], Awaitable[None]]) -> None:
        self._raise_if_latched()  # at once, not after the batches queued ahead
        async with self._lock:
            self._raise_if_latched()
            self._delivering = None
            try:
                await self._load()
                await self._build_in_shadow()
                await work()
            except Exception as exc:
                self._batch_failures += 1
                self._last_error = exc
                self._failed_at = self._delivering
                raise
            finally:
                self._delivering = None

    def _raise_if_latched(self) -> None:
        if self._latched is not None:
            # A fresh traceback each time: re-raising one instance would grow it forever.
            raise self._latched.with_traceback(None)

    def _latch(self, error: StreamkitError) -> None:
        self._latched = error
        self._waiters.fail(error)

    # -- the state and the cursor (written here and nowhere else) -------------------

    async def _load(self) -> None:
        """Restore the checkpoint once, replaying a deferred state's events (reduce only)."""
        if self._loaded:
            return
        if self._before_load is not None:
            await self._before_load()
        restored = await self._checkpoints.restore()
        state = restored.state
        if restored.state_offset < restored.cursor:
            # The events between were processed (their effects ran) by an earlier
            # incarnation that had not written its state since; none was ephemeral
            # (a batch that reduced one writes its state). A failing read leaves
            # the engine unloaded for the next work to retry.
            state, replayed = await self._pages.replay(
                state, restored.state_offset, restored.cursor, MAX_CATCH_UP_PAGE
            )
            self._checkpoints.replayed(state, replayed)
        self._state = state
        self._cursor = restored.cursor
        self._shadow.stale_through = restored.stale_through
        self._live.start(
            self._stream, self._slug, state if restored.stale_through is None else restored.seed
        )
        self._loaded = True
        self._waiters.advanced(self._cursor)

    async def _build_in_shadow(self) -> None:
        """Build this version in the shadow and cut over (see :mod:`._shadow`); serve from there."""
        try:
            built = await self._shadow.build(self._state, self._cursor)
        except BaseException:
            # The next work restores again: the serving row, and this version's own row
            # where its rebuild resumes, may have moved meanwhile.
            self._loaded = False
            raise
        if built is None:
            return
        self._events_reduced += built.folded
        self._advance(built.through, built.state)
        self._live.publish(built.state)

    def _resume(self, through: int, state: S) -> None:
        """The shadow's row was written at ``through``: a failure or a stop leaves the engine here."""
        self._state, self._cursor = state, through

    async def _write_state_now(self) -> None:
        """Write a deferred state at the cursor (a clean close): a restart then replays nothing."""
        if self._loaded and not self._checkpoints.persisted(self._state):
            await self._checkpoints.write_state(self._cursor, self._state)

    async def _run_batch(
        self,
        events: Sequence[StreamEvent],
        scanned: ScannedRange,
        at_head: bool,
        *,
        from_read: bool = False,
        read_ahead: int = 0,
    ) -> ReadPage | None:
        """One batch (see :mod:`._batch`), then the cursor, the counters and the live state."""
        started = time.perf_counter()
        outcome = await self._batch.run(
            events,
            scanned,
            at_head,
            cursor=self._cursor,
            state=self._state,
            owes_at_head_pass=self._owes_at_head_pass,
            from_read=from_read,
            read_ahead=read_ahead,
        )
        self._advance(outcome.through, outcome.state)
        if not outcome.ran:
            return None
        self._events_reduced += outcome.delivered
        self._batches += 1
        self._last_batch_at_head = outcome.at_head
        self._owes_at_head_pass = not outcome.at_head
        self._live.publish(self._state)
        if self._on_batch is not None:
            info = BatchInfo(
                scanned,
                events,
                outcome.delivered,
                outcome.wrote,
                outcome.at_head,
                started,
                time.perf_counter(),
            )
            try:
                self._on_batch(info)
            except Exception as exc:
                report("processor.on_batch_failed", exc, slug=self._slug, offset=self._cursor)
        # The batch checkpointed what lay before a payload newer than this code; the
        # caller learns of it now, not at the next batch.
        self._fold.raise_if_stopped()
        return outcome.ahead

    def _advance(self, through: int, state: S) -> None:
        """Take ``state``, reduced through ``through``: the cursor never regresses."""
        self._state = state
        if through > self._cursor:
            self._cursor = through
            self._waiters.advanced(through)

    async def _push(
        self, events: Sequence[StreamEvent], scanned: ScannedRange, at_head: bool | None
    ) -> None:
        # Gap repair: heal the durable prefix up to the push's start from the
        # log, and no further; the push carries ephemerals the log cannot
        # return, so it is processed after, never replaced.
        while self._cursor < scanned.after:
            after = self._cursor
            page = await self._pages.read(after, PAGE_SIZE)
            if page.scanned_through_offset <= after:
                break  # the rest of the gap is offsets handed to ephemerals
            limit = scanned.after
            await self._run_batch(
                [e for e in page.events if e.offset <= limit],
                ScannedRange(after, min(page.scanned_through_offset, limit)),
                at_head=False,
                from_read=True,
            )
        if at_head is None:
            at_head = scanned.through >= (self._pushed_through or 0)
        await self._run_batch(events, scanned, at_head=at_head)

    async def _catch_up(self) -> None:
        page: ReadPage | None = None
        limit = PAGE_SIZE
        while True:
            after = self._cursor
            if page is None:
                page = await self._pages.read(after, limit)
            through = page.scanned_through_offset
            ahead: ReadPage | None = None
            if not page.at_head:
                # A backlog: spread the batch's fixed costs over more events.
                limit = min(limit * 2, MAX_CATCH_UP_PAGE)
            if through > after:
                ahead = await self._run_batch(
                    page.events,
                    ScannedRange(after, through),
                    page.at_head,
                    from_read=True,
                    # Reading the next page while the checkpoint commits: a speed trick.
                    read_ahead=0 if page.at_head or not SPEED_TRICKS else limit,
                )
            if self._yielding and (not page.at_head or self._cursor < through):
                return  # handed to another host, or stopping: see yield_catch_up
            if through <= after or page.at_head:
                if page.at_head and self._fed_by_pushes:
                    head = max(after, through)
                    if self._head_read_from_log is None or head > self._head_read_from_log:
                        self._head_read_from_log = head
                return
            # The next page, if the batch read it while its checkpoint was being
            # written; it was read from the cursor the batch moved to.
            page = ahead if ahead is not None and self._cursor == through else None

    async def _eventless_at_head_pass(self) -> None:
        if self._has_effects:
            await self._deliver(None, self._state, self._state, caught_up=True)
        self._owes_at_head_pass = False
        self._last_batch_at_head = True
        self._live.publish(self._state)

    def _reduced_through_shown_head(self) -> bool:
        shown = self._durable_shown
        if self._fed_by_pushes and self._head_read_from_log is not None:
            shown = max(shown or 0, self._head_read_from_log)
        return self._loaded and shown is not None and self._cursor >= shown

    async def _deliver(
        self, event: StreamEvent | None, state: S, previous: S, caught_up: bool
    ) -> list[asyncio.Task[list[StreamEvent]]]:
        """Run ``process_event`` for one event and drain its blockers to a fixed point.

        Returns the appends it started, which the batch's checkpoint waits for.
        """
        self._delivering = None if event is None else event.offset
        if caught_up:
            # Wakeups are re-derived by every at-head pass: start from none.
            self._claims.forget_wakeups()
        args = ProcessEventArgs(self, event, state, previous, caught_up)
        appends = await args._deliver_to(self._processor)
        if caught_up:
            self._claims.sync()
        return appends

    def _note_error(self, exc: BaseException) -> None:
        self._last_error = exc

    def _swallowed(self, what: str, exc: BaseException, event: StreamEvent | None) -> None:
        self._last_error = exc
        report(
            what,
            exc,
            slug=self._slug,
            offset=self._cursor if event is None else event.offset,
            type=None if event is None else event.type,
        )

    # -- live state -----------------------------------------------------------------

    def status_summary(self) -> Mapping[str, Any] | None:
        """The processor's :meth:`~StreamProcessor.status_summary` of the state now (no I/O).

        None before the checkpoint is loaded, while a version builds in the
        shadow (its state is partial), or when the hook raised (reported).
        """
        if not self._loaded or self._shadow.in_shadow:
            return None
        try:
            return self._processor.status_summary(self._state)
        except Exception as exc:
            report("processor.status_summary_failed", exc, slug=self._slug, offset=self._cursor)
            return None

    def publish_live_state(self) -> None:
        """Re-project the state and send a live-state delta if the projection changed.

        The engine does this after every batch; a host calls it when a runtime
        field of the processor changed outside a batch. While ``publish_live``
        says no, it only notes that the live state is behind. A projection that
        raises costs only this notification. Before the checkpoint is loaded
        there is nothing to publish.
        """
        self._live.publish(self._state)

    @property
    def live_behind(self) -> bool:
        """Whether batches ran unpublished since the last delta (``publish_live`` said no)."""
        return self._live.behind

    # -- what the engine reports --------------------------------------------------------

    @property
    def processor(self) -> StreamProcessor[S]:
        """The processor this engine drives."""
        return self._processor

    @property
    def slug(self) -> str:
        """The processor's contract slug (its checkpoint and live-state key)."""
        return self._slug

    @property
    def version(self) -> str:
        """The contract version the state is reduced under."""
        return self._version

    @property
    def cursor(self) -> int:
        """The offset the state is reduced through (0 before the checkpoint is loaded)."""
        return self._cursor

    @property
    def latched_error(self) -> StreamkitError | None:
        """The non-retryable refusal every later call fails with, if one was latched."""
        return self._latched

    async def cut_over(self, timeout: float | None = 60.0) -> int:  # noqa: ASYNC109
        """Cut this version, built in the shadow, over now; the cutover offset once committed.

        For a manual cutover (the contract's or the config's ``cutover =
        "manual"``): built up to the serving cursor, the version holds there,
        following the serving version, until this is called. Asked during
        the build, it cuts over as soon as the build is done. The cutover is
        the automatic one's: fenced, one transaction. Raises
        :class:`~streamkit.errors.InvalidRequest` when the cutover is
        automatic or this version serves already, the attempt's error if it
        ended without a cutover (ask again), and
        :class:`~streamkit.errors.ProcessorTimeout` after ``timeout`` seconds
        (the cutover may still happen).
        """
        self._raise_if_latched()
        asked = self._shadow.ask(self._loaded)
        if not self._loaded:
            self.catch_up_from_log()  # the build starts (if no work did yet) and sees the ask
        return await self._shadow.committed(asked, timeout)

    def in_shadow(self) -> bool:
        """Whether this version still builds in the shadow (another version serves meanwhile).

        Known once the checkpoints were read (the engine's first work); False before.
        """
        return self._shadow.in_shadow

    def statistics(self) -> EngineStatistics:
        """The engine's counters and incidents now, as one frozen snapshot (no I/O)."""
        fold = self._fold
        tally = fold.tally
        claims = self._claims
        return EngineStatistics(
            events_reduced=self._events_reduced,
            batches=self._batches,
            batch_failures=self._batch_failures,
            last_error=self._last_error,
            failed_at=self._failed_at,
            malformed_payloads=tally.malformed,
            last_malformed=tally.last_malformed,
            malformed_by_type=tally.malformed_by_type(),
            reduce_failures=tally.reduce_failures,
            last_reduce_failure=tally.last_reduce_failure,
            reduce_failures_by_type=tally.reduce_failures_by_type(),
            dropped_events=tally.dropped,
            stopped_at=fold.stopped_at,
            refusing_cancel=tuple(self._strays.refusing_cancel),
            refused_cancel=self._strays.refused_cancel,
            background_in_flight=claims.in_flight,
            pending_waiters=len(self._waiters),
            claimed_at=claims.wanted,
            claim_held=claims.held,
            live_behind=self._live.behind,
            rebuild=self._shadow.snapshot(),
        )

    # -- effects (the EffectHost protocol of ProcessEventArgs) ----------------------

    def emit(
        self, during: StreamEvent | None, events: Sequence[EventInput | Mapping[str, Any]]
    ) -> asyncio.Task[list[StreamEvent]]:
        """Check, stamp and start an append made by ``process_event`` (see ``args.append``)."""
        self.guard()
        return self._effects.emit(during, events)

    def start_background(self, during: StreamEvent | None, work: Work) -> None:
        """Start one ``run_in_background`` attempt (see ``args.run_in_background``)."""
        self.guard()
        self._claims.start(during, work)

    def request_wakeup(self, at: float) -> None:
        """Record a wakeup request (see ``args.schedule_wakeup``)."""
        self._claims.wake_at(at)

    def track_cancelled(self, work: asyncio.Future[Any], label: str) -> None:
        """Count ``work`` as a stray if it outlives its cancel (see ``args.track_cancelled``)."""
        self._strays.watch(work, label)

    def now(self) -> float:
        """The engine's clock, epoch seconds (see ``args.now``)."""
        return self._clock()

    @property
    def stream(self) -> StreamAccess:
        """The stream this engine runs over (see ``args.stream``)."""
        return self._stream

    def awaited(self) -> bool:
        """Whether a caller waits now for the cursor to reach an offset (:meth:`wait_until_processed`)."""
        return len(self._waiters) > 0

    async def wait_awaited(self, timeout: float) -> None:  # noqa: ASYNC109 (a bounded pause)
        """Return once a caller waits for the cursor (:meth:`awaited`), or after ``timeout`` s."""
        await self._waiters.wait_arrival(timeout)

    def clients_first(self) -> bool:
        """Whether the host gives its clients first claim now (see ``args.yield_to_clients``)."""
        return self._clients_first is not None and self._clients_first()

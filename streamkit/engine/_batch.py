"""One batch of a processor: the engine's rules 2 to 5 over one proven range.

:meth:`BatchRunner.run` takes the events of one range the caller already made
contiguous with the cursor (a push, a catch-up page, a gap repair) and runs
it whole: each durable event at most once (above the cursor and inside the
range's proof), ephemerals always; one event at a time through the fold and
``process_event`` with its blockers drained; the at-head pass when the range
reaches the head; then one checkpoint for the batch. It returns what the
batch did as a :class:`BatchOutcome`, and the engine moves its cursor and
state by it only then: a batch that fails persists nothing and leaves the
engine as it was.

A batch is a unit of work, so its position and state are values passed down
and returned, never fields of the long-lived runner. The one exception is a
long batch with effects: it checkpoints every :data:`EFFECTS_PER_CHECKPOINT`
events, and hands each such checkpoint to the engine's ``advance`` at once,
so a failure later in the batch keeps what was written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.engine._checkpointer import Checkpointer
from streamkit.engine._fold import SLICE_SECONDS, Fold
from streamkit.engine._pages import PageReader
from streamkit.errors import (
    IdempotencyConflict,
    InvalidEvent,
    InvalidRequest,
    OffsetConflict,
    StorageError,
    StreamkitError,
    UndeclaredEmit,
)
from streamkit.events import ReadPage, ScannedRange, StreamEvent

__all__ = ["EFFECTS_PER_CHECKPOINT", "REFUSALS", "BatchInfo", "BatchOutcome", "BatchRunner"]

S = TypeVar("S")

EFFECTS_PER_CHECKPOINT = 100
"""The most events a processor with effects delivers between two checkpoints.

Effects run as events are delivered, and a checkpoint records them done: a
crash re-runs the effects of every event delivered since the last one. A
catch-up page (up to 4,000 events) is checkpointed every this many events,
so a crash re-runs at most this many events' effects; a stop or a hand-off
ends a page at the event in flight and re-runs none. A processor without
effects folds whole pages (a replayed fold is harmless).
"""

REFUSALS = (IdempotencyConflict, InvalidEvent, InvalidRequest, OffsetConflict, UndeclaredEmit)
"""Refusals of what an effect's event is: the same append is refused again on every retry.

An effect refused so is reported and its batch still checkpoints; any other
failure of an effect's append fails the batch (see :func:`_landed`).
"""

Appends = list[asyncio.Task[list[StreamEvent]]]
"""The appends one delivery started (``args.append``), awaited or not."""

Deliver = Callable[[StreamEvent | None, S, S, bool], Awaitable[Appends]]
"""``process_event`` for one event (or the eventless at-head pass), blockers drained."""


class BatchInfo(NamedTuple):
    """What one committed batch did (given to the ``on_batch`` hook).

    ``started`` and ``finished`` are :func:`time.perf_counter` readings.
    """

    range: ScannedRange
    events: Sequence[StreamEvent]
    delivered: int
    wrote_checkpoint: bool
    at_head: bool
    started: float
    finished: float


class BatchOutcome(NamedTuple, Generic[S]):
    """What one batch leaves behind: the engine's next state and cursor, and its counts.

    ``ran`` is False for a batch with nothing new for the processor (a stale
    re-push, ephemerals it ignores): no pass ran and nothing was written.
    ``at_head`` is False when a stop or hand-off ended the batch early.
    ``ahead`` is the next page, read while the checkpoint committed.
    """

    state: S
    through: int
    ran: bool
    delivered: int
    wrote: bool
    at_head: bool
    ahead: ReadPage | None


class BatchRunner(Generic[S]):
    """Runs the batches of one engine (see the module docstring).

    ``advance(through, state)`` is the engine's: it moves the cursor and
    state after a checkpoint inside a batch. ``yielding()`` says whether a
    stop or hand-off asked catch-ups to end at the event in flight.
    """

    def __init__(
        self,
        *,
        fold: Fold[S],
        pages: PageReader[S],
        checkpoints: Checkpointer[S],
        deliver: Deliver[S],
        has_effects: bool,
        advance: Callable[[int, S], None],
        yielding: Callable[[], bool],
    ) -> None:
        self._fold = fold
        self._pages = pages
        self._checkpoints = checkpoints
        self._deliver = deliver
        self._has_effects = has_effects
        self._advance = advance
        self._yielding = yielding

    async def run(
        self,
        events: Sequence[StreamEvent],
        scanned: ScannedRange,
        at_head: bool,
        *,
        cursor: int,
        state: S,
        owes_at_head_pass: bool,
        from_read: bool = False,
        read_ahead: int = 0,
    ) -> BatchOutcome[S]:
        """Rules 2-5 over one range from ``cursor`` and ``state``; the caller repaired any gap.

        With ``read_ahead`` (a catch-up page short of the head: the size of
        the next page) the page after ``scanned.through`` is read while the
        checkpoint is being written and returned in the outcome, so the log
        read overlaps the commit.
        """
        # A payload newer than this code (or one that does not validate, for a
        # processor that stalls on those) at the cursor's next event: nothing past
        # it is folded, skipped or checkpointed by this engine.
        self._fold.raise_if_stopped()
        through = scanned.through
        fresh: Sequence[StreamEvent]
        if (
            SPEED_TRICKS
            and from_read
            and events
            and events[0].offset > cursor
            and events[-1].offset <= through
        ):
            # A page read after the cursor is durable, ascending and inside its
            # proof by the read contract; checking its ends is enough.
            fresh, fresh_durable = events, True
        else:
            fresh, fresh_durable = _fresh(events, cursor, through)
        reduces = self._fold.reduces
        if (
            not fresh_durable
            and not (at_head and owes_at_head_pass)
            and not any(map(reduces, fresh))
        ):
            # Nothing new for this processor: no pass and no write, else every
            # live-state delta would wake every processor.
            return BatchOutcome(state, through, False, 0, False, at_head, None)

        if not from_read and any(e.ephemeral and reduces(e) for e in fresh):
            # The log cannot replay an ephemeral: the state it reduces must be
            # written by the next checkpoint, whatever it would defer.
            self._checkpoints.mark_unreplayable()
        # Events delivered since the last checkpoint this batch wrote, and the
        # appends their deliveries started.
        unsaved = 0
        started: Appends = []
        if not self._has_effects:
            # The catch-up hot path: nothing to deliver, only the fold.
            state, delivered = await self._fold.fold_paced(fresh, state)
            unsaved = delivered
            stopped = self._fold.stopped
            if stopped is not None:
                through, at_head, read_ahead = _before(stopped), False, 0
        else:
            delivered = 0
            apply = self._fold.apply
            consumable = [event for event in fresh if reduces(event)]
            caught_up_delivered = False
            final = len(consumable) - 1
            yielded_at = time.perf_counter()
            for index, event in enumerate(consumable):
                if time.perf_counter() - yielded_at > SLICE_SECONDS:
                    # Blockers that never wait (or reduces that are slow) would hold
                    # the loop for the whole page: let the rest of the host run.
                    await asyncio.sleep(0)
                    yielded_at = time.perf_counter()
                previous = state
                state, normalized = apply(event, state)
                if normalized is None:
                    stopped = self._fold.stopped
                    if stopped is not None:
                        through, at_head, read_ahead = _before(stopped), False, 0
                        break
                    continue  # malformed or dropped: no reduce, no effects, counted
                delivered += 1
                unsaved += 1
                caught_up = at_head and index == final
                started += await self._deliver(normalized, state, previous, caught_up)
                caught_up_delivered = caught_up_delivered or caught_up
                if index == final or normalized.ephemeral:
                    continue
                if from_read and self._yielding():
                    # A stop or a hand-off: end here, at an event boundary, and
                    # checkpoint what was done; the rest is the next holder's.
                    through, at_head, read_ahead = normalized.offset, False, 0
                    break
                if unsaved >= EFFECTS_PER_CHECKPOINT:
                    # Effects ran for these events: a crash now re-runs them all, so
                    # a long batch checkpoints as it goes (see EFFECTS_PER_CHECKPOINT).
                    await _landed(started)
                    started = []
                    await self._checkpoints.save(normalized.offset, state, unsaved)
                    self._advance(normalized.offset, state)
                    cursor, unsaved = normalized.offset, 0
            if at_head and not caught_up_delivered:
                # Rule 5: reached the head with no caught-up event (the last one
                # was filtered out or malformed): one eventless pass.
                started += await self._deliver(None, state, state, True)

        ahead: ReadPage | None = None
        if fresh_durable:
            await _landed(started)
            new_cursor = through if through > cursor else cursor
            if read_ahead:
                limit = read_ahead
                ahead = await self._checkpoints.save(
                    new_cursor, state, unsaved, lambda: self._pages.read(new_cursor, limit)
                )
            else:
                await self._checkpoints.save(new_cursor, state, unsaved)
        return BatchOutcome(state, through, True, delivered, fresh_durable, at_head, ahead)


async def _landed(appends: Appends) -> None:
    """Wait for the appends of the events a checkpoint is about to record; fail if one did not land.

    ``args.append`` starts an append that ``process_event`` need not await. A
    checkpoint written past an event whose effect never reached the log
    would lose that effect for good: so the checkpoint waits for every
    append its events started, and one that failed for any reason but a
    refusal of the event itself fails the batch, which is retried whole,
    its idempotency keys keeping a rerun single. That covers a storage
    failure (a broken connection, a lock wait past its timeout: the write
    did not land, or may not have), a fence that refused the write
    (``LeaseLost``: this host's trust in its lease lapsed between starting
    the append and committing it; a renewal may restore that trust before
    the checkpoint's own fence runs, so the checkpoint's success proves
    nothing about the effect), and anything unforeseen. A refusal of what
    the event is (:data:`REFUSALS`: an idempotency conflict, an invalid
    event) would be refused again on every retry: it is reported
    (``processor.append_failed``), not retried. Appends made by background
    work belong to no batch.
    """
    if not appends:
        return
    pending = [task for task in appends if not task.done()]
    if pending:
        await asyncio.wait(pending)
    for task in appends:
        if task.cancelled():
            raise StorageError(
                "an append started by this batch's events was cancelled before it was known "
                "to land; the batch is not checkpointed and runs again",
                retryable=True,
            )
        error = task.exception()
        if error is not None and not isinstance(error, REFUSALS):
            raise error


def _before(stopped: StreamkitError) -> int:
    """The last offset before the event a fold stopped at."""
    offset: int = stopped.details["offset"]
    return offset - 1


def _fresh(
    events: Sequence[StreamEvent], cursor: int, through: int
) -> tuple[list[StreamEvent], bool]:
    """The events not delivered before, and whether a durable one is among them."""
    fresh: list[StreamEvent] = []
    fresh_durable = False
    last = cursor
    for event in events:
        if not event.ephemeral:
            offset = event.offset
            if offset <= last or offset > through:
                continue
            last = offset
            fresh_durable = True
        fresh.append(event)
    return fresh, fresh_durable

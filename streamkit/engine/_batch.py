"""One batch of a processor: the engine's rules 2 to 5 over one proven range.

:meth:`BatchRules._run_batch` takes the events of one range the caller
already made contiguous with the cursor (a push, a catch-up page, a gap
repair) and runs it whole: each durable event at most once (above the cursor
and inside the range's proof), ephemerals always; one event at a time through
the fold and ``process_event`` with its blockers drained; the at-head pass when
the range reaches the head; then one checkpoint for the batch, and only then
the cursor moves and the live state is published. A batch that fails
persists nothing and leaves the engine as it was.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from streamkit.engine._checkpointed import CheckpointedState
from streamkit.engine._fold import SLICE_SECONDS, report
from streamkit.events import ReadPage, ScannedRange, StreamEvent

__all__ = ["EFFECTS_PER_CHECKPOINT", "BatchInfo", "BatchRules"]

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


class BatchRules(CheckpointedState[S], Generic[S]):
    """The batch half of :class:`~streamkit.engine.ProcessorEngine` (which inherits it).

    The attributes below are the engine's; they are named here so each
    method's use of them is checked.
    """

    _has_effects: bool
    _yielding: bool
    _owes_at_head_pass: bool
    _last_batch_at_head: bool
    _delivering: int | None
    _batches: int
    _on_batch: Callable[[BatchInfo], None] | None

    if TYPE_CHECKING:

        async def _deliver(
            self, event: StreamEvent | None, state: S, previous: S, caught_up: bool
        ) -> None: ...

    async def _run_batch(
        self,
        events: Sequence[StreamEvent],
        scanned: ScannedRange,
        at_head: bool,
        *,
        from_read: bool = False,
        read_ahead: int = 0,
    ) -> ReadPage | None:
        """Rules 2-5 over one range; the caller repaired any gap before it.

        With ``read_ahead`` (a catch-up page short of the head: the size of
        the next page) the page after ``scanned.through`` is read while the
        checkpoint is being written and returned, so the log read overlaps the
        commit; a read that fails returns None (the caller reads again and
        meets the error there).
        """
        started = time.perf_counter()
        cursor_before = self._cursor
        state = self._state
        # At most once, in order: a durable at or below the cursor (or repeated,
        # or outside the range) was, or will be, delivered by another batch.
        # Ephemerals ride exactly one push, so they are always fresh.
        through = scanned.through
        fresh: Sequence[StreamEvent]
        if (
            from_read
            and events
            and events[0].offset > cursor_before
            and events[-1].offset <= through
        ):
            # A page read after the cursor is durable, ascending and inside its
            # proof by the read contract; checking its ends is enough.
            fresh, fresh_durable = events, True
        else:
            fresh, fresh_durable = self._fresh(events, cursor_before, through)
        reduces = self._fold.reduces
        if (
            not fresh_durable
            and not (at_head and self._owes_at_head_pass)
            and not any(map(reduces, fresh))
        ):
            # Nothing new for this processor (a stale re-push, or ephemerals it
            # ignores): no pass and no write, else every live-state delta would
            # wake every processor.
            self._advance(cursor_before, through, state)
            return None

        if not from_read and any(e.ephemeral and reduces(e) for e in fresh):
            # The log cannot replay an ephemeral: the state it reduces must be
            # written by the next checkpoint, whatever it would defer.
            self._unreplayable = True
        delivered = 0
        # Events delivered since the last checkpoint this batch wrote (see below).
        unsaved = 0
        if not self._has_effects:
            # The catch-up hot path: nothing to deliver, only the fold.
            state, delivered = await self._fold.fold_paced(fresh, state)
            unsaved = delivered
        else:
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
                    continue  # malformed: skipped for reduce and effects, already reported
                delivered += 1
                unsaved += 1
                caught_up = at_head and index == final
                await self._deliver(normalized, state, previous, caught_up)
                caught_up_delivered = caught_up_delivered or caught_up
                if index == final or normalized.ephemeral:
                    continue
                if from_read and self._yielding:
                    # A stop or a hand-off: end here, at an event boundary, and
                    # checkpoint what was done; the rest is the next holder's.
                    through, at_head, read_ahead = normalized.offset, False, 0
                    break
                if unsaved >= EFFECTS_PER_CHECKPOINT:
                    # Effects ran for these events: a crash now re-runs them all, so
                    # a long batch checkpoints as it goes (see EFFECTS_PER_CHECKPOINT).
                    await self._checkpoint_within(normalized.offset, state, unsaved)
                    cursor_before, unsaved = normalized.offset, 0
            if at_head and not caught_up_delivered:
                # Rule 5: reached the head with no caught-up event (the last one
                # was filtered out or malformed): one eventless pass.
                await self._deliver(None, state, state, caught_up=True)

        new_cursor = through if through > cursor_before else cursor_before
        wrote = False
        ahead: ReadPage | None = None
        if fresh_durable:
            state_json = self._state_to_write(state, unsaved)
            state_offset = self._state_offset_for(state, state_json)
            if read_ahead:
                ahead = await self._save_reading_ahead(
                    new_cursor, state_json, state_offset, read_ahead
                )
            else:
                await self._save(new_cursor, state_json, state_offset)
            self._wrote_checkpoint(state, new_cursor, state_offset, unsaved)
            wrote = True
        self._events_reduced += delivered
        self._batches += 1
        self._advance(cursor_before, through, state)
        self._last_batch_at_head = at_head
        self._owes_at_head_pass = not at_head
        self.publish_live_state()
        if self._on_batch is not None:
            info = BatchInfo(
                scanned, events, delivered, wrote, at_head, started, time.perf_counter()
            )
            try:
                self._on_batch(info)
            except Exception as exc:
                report("processor.on_batch_failed", exc, slug=self._slug, offset=new_cursor)
        return ahead

    async def _checkpoint_within(self, offset: int, state: S, reduced: int) -> None:
        """Checkpoint a batch in progress through ``offset`` (a durable event it delivered).

        The cursor moves there at once: a failure of the rest of the batch
        then keeps what this wrote, and runs again only what came after.
        """
        state_json = self._state_to_write(state, reduced)
        state_offset = self._state_offset_for(state, state_json)
        await self._save(offset, state_json, state_offset)
        self._wrote_checkpoint(state, offset, state_offset, reduced)
        self._advance(self._cursor, offset, state)

    @staticmethod
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

    def _advance(self, cursor_before: int, through: int, state: S) -> None:
        self._state = state
        if through > cursor_before:
            self._cursor = through
            self._waiters.advanced(through)

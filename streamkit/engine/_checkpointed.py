"""An engine's checkpointed state: restored once at start, written once per batch.

Restoring: a checkpoint of the contract's version restores the state and the
cursor. A checkpoint of another version, or one whose state no longer
restores (a schema change without a version bump), is re-reduced from the
log up to its old cursor before anything else runs, reduce only, never past
that cursor; the live state is seeded with the projection the engine starts
from, so the re-reduce publishes the one delta that heals its clients.

Writing: one ``CheckpointStorage.save`` per batch. It always moves the
cursor; the state goes with it while it is small, and a large one (from
:data:`DEFER_STATE_FROM` bytes of JSON) only once its replay would cost more
than its write: after one reduced event per :data:`BYTES_PER_DEFERRED_EVENT`
bytes of state. Until then the row says which offset its state was reduced
through, and a restart reduces the durable events from there up to the
cursor again (reduce only: their effects ran). A batch that reduced an
ephemeral event, which the log cannot give back, always writes the state, and
so does a version re-reduce and a clean close.

A refusal that can only repeat (a state too large, a state that is not JSON)
latches the engine, so it fails at once until a new engine is built instead
of re-reducing into the same wall on every push. While the write commits, the
page after the new cursor is read as a head start for the next batch.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from streamkit.checkpoint import MAX_CHECKPOINT_STATE_BYTES
from streamkit.contract import ProcessorContract
from streamkit.engine._fold import Fold, report
from streamkit.engine._waiters import CursorWaiters
from streamkit.errors import StateNotSerializable, StreamkitError
from streamkit.events import ReadPage, StreamEvent
from streamkit.live_state import LiveState
from streamkit.processor import StreamProcessor
from streamkit.protocols import CheckpointStorage, ProcessorStream, TypedReads

__all__ = [
    "BYTES_PER_DEFERRED_EVENT",
    "DEFER_STATE_FROM",
    "MAX_CATCH_UP_PAGE",
    "PAGE_SIZE",
    "CheckpointedState",
]

S = TypeVar("S")

PAGE_SIZE = 500
"""Events per read when the engine repairs a gap, and in the first page of a catch-up."""

MAX_CATCH_UP_PAGE = 4000
"""The most events one catch-up page (one batch, one checkpoint) grows to.

A catch-up doubles its page after each full one, up to this, so a backlog
pays a batch's fixed costs (the checkpoint, the live-state projection, the
read's round trip) once per 4,000 events rather than per 500. A typed page
keeps no events (``TypedEvents``), so a larger one costs its rows and their
decoded JSON, not 4,000 live events for the garbage collector to scan; the
log caps the pages of a path several processors read at once, which it
shares at 500 (``SHARED_PAGE_EVENTS``). Measured on 1M events of a trivial
processor: 3.96-4.11 µs an event with pages of 4,000 against 4.60 µs with
pages of 500.
"""

DEFER_STATE_FROM = 64 * 1024
"""The state JSON (bytes, as last written) from which its write may wait for later batches.

Below it the state's encoding and write cost less than a restart's replay of
the events it would save, so every batch writes it.
"""

BYTES_PER_DEFERRED_EVENT = 512
"""A deferred state is written once one event per this many bytes of it was reduced since.

Encoding and writing a state costs about 10 ns per byte here, replaying an
event some 10-30 µs: a 600 KB state is then written every 1,200 events (about
4 µs per event) and a restart replays at most that many. The largest state
(2 MiB) waits for at most about 4,000.
"""


class CheckpointedState(Generic[S]):
    """The checkpoint half of :class:`~streamkit.engine.ProcessorEngine` (which inherits it).

    The attributes below are the engine's; they are named here so each
    method's use of them is checked.
    """

    _processor: StreamProcessor[S]
    _contract: ProcessorContract[S]
    _slug: str
    _version: str
    _stream: ProcessorStream
    _storage: CheckpointStorage
    _fold: Fold[S]
    _loaded: bool
    _state: S
    _persisted_state: object
    _state_offset: int
    _deferred_events: int
    _unreplayable: bool
    _cursor: int
    _stale_through: int | None
    _live: LiveState[Any] | None
    _live_behind: bool
    _state_bytes: int
    _events_since_size: int
    _growth_per_event: float
    _events_reduced: int
    _waiters: CursorWaiters

    _typed_reads: tuple[TypedReads, dict[str, type[BaseModel]]] | None

    if TYPE_CHECKING:

        def _swallowed(self, what: str, exc: BaseException, event: StreamEvent | None) -> None: ...

        def _latch(self, error: StreamkitError) -> None: ...

        def publish_live_state(self) -> None: ...

        def _live_wanted(self) -> bool: ...

    async def _load(self) -> None:
        if self._loaded:
            return
        contract = self._contract
        checkpoint = await self._storage.load(self._slug)
        state: Any = self._state
        seed_state: Any = state
        if checkpoint is not None:
            current = checkpoint.reducer_version == self._version
            restored: Any = state
            if checkpoint.state_json is not None:
                try:
                    restored = contract.load_state(checkpoint.state_json)
                except Exception as exc:
                    # A state of this version that no longer restores means the
                    # schema changed without a version bump: rebuild it as if
                    # it had been bumped rather than refuse to start.
                    if current:
                        report(
                            "processor.checkpoint_unreadable",
                            exc,
                            slug=self._slug,
                            offset=checkpoint.reduced_through_offset,
                            type=None,
                            detail="re-reducing from offset 0 as for a version bump",
                        )
                    current = False
            state_offset = checkpoint.state_through_offset
            if checkpoint.state_json is not None:
                self._state_bytes = len(checkpoint.state_json)
            if current:
                state = restored
                self._persisted_state = restored
                self._state_offset = state_offset
                if state_offset < checkpoint.reduced_through_offset:
                    state = await self._replay_deferred(
                        restored, state_offset, checkpoint.reduced_through_offset
                    )
                    # Measure the replayed state once: its size and its growth per event
                    # tell the next batches when a deferred state must be measured (a
                    # new engine after a failure must not let the ceiling pass unseen).
                    self._events_since_size = self._deferred_events
                    self._encode(state)
                self._cursor = checkpoint.reduced_through_offset
                seed_state = state
            else:
                self._stale_through = checkpoint.reduced_through_offset
                seed_state = restored
        else:
            self._persisted_state = state
        self._state = state
        # Seeded with the projection this incarnation starts from (after a
        # version bump, the old version's), so the re-reduce publishes the one
        # delta that heals clients of the old projection. Unwanted, it is not
        # projected at all: the first publish then sends the whole value.
        seed = None
        if self._live_wanted():
            try:
                seed = self._processor.project_live_state(seed_state)
            except Exception as exc:
                self._swallowed("processor.projection_failed", exc, None)
        else:
            self._live_behind = True
        self._live = LiveState(self._stream, self._slug, seed)
        self._loaded = True
        self._waiters.advanced(self._cursor)

    async def _replay_deferred(self, state: S, state_offset: int, cursor: int) -> S:
        """The stored state brought from its offset to the cursor: reduce only, no effects.

        The events between were processed (their effects ran) by an earlier
        incarnation that had not written its state since; none was ephemeral
        (a batch that reduced one writes its state). Raises what the log's
        read raises, leaving the engine unloaded for the next work to retry.
        """
        position = state_offset
        replayed = 0
        while position < cursor:
            page = await self._read_page(position, MAX_CATCH_UP_PAGE)
            below = [event for event in page.events if event.offset <= cursor]
            state, folded = await self._fold.fold_paced(below, state)
            replayed += folded
            if page.scanned_through_offset <= position:
                break  # the log holds nothing more below the cursor
            position = min(page.scanned_through_offset, cursor)
        self._deferred_events = replayed
        return state

    async def _read_page(self, after: int, limit: int) -> ReadPage:
        """A page to fold, its payloads typed by the stream when it can type them.

        The fold types what a plain read leaves decoded, so both give the same
        batch; a typed page saves building each event a second time.
        """
        typed = self._typed_reads
        if typed is None:
            return await self._stream.read(after, limit)
        stream, types = typed
        return await stream.read_typed(after, limit, types)

    def _state_to_write(self, state: S, reduced: int) -> str | None:
        """The state's JSON if this batch's checkpoint must carry it, else None (kept or deferred).

        ``reduced`` is how many events the batch reduced. The caller tells
        :meth:`_wrote_checkpoint` once the checkpoint is written.
        """
        if state is self._persisted_state:
            return None
        self._events_since_size += reduced
        if (
            not self._unreplayable
            and self._state_bytes >= DEFER_STATE_FROM
            and self._deferred_events + reduced < self._state_bytes // BYTES_PER_DEFERRED_EVENT
        ):
            # Deferred, so its size is not known without encoding it. Measure it once
            # the fastest growth seen could have carried it to the ceiling: a state
            # that outgrows it then fails this batch (and stalls the processor here),
            # not hundreds of events later at its next write.
            predicted = self._state_bytes + self._growth_per_event * self._events_since_size
            if predicted < MAX_CHECKPOINT_STATE_BYTES:
                return None
            text = self._encode(state)
            size = len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
            return text if size > MAX_CHECKPOINT_STATE_BYTES else None
        return self._encode(state)

    def _state_offset_for(self, state: S, state_json: str | None) -> int | None:
        """The ``state_offset`` a checkpoint of ``state`` stores: None when its state is current."""
        if state_json is not None or state is self._persisted_state:
            return None
        return self._state_offset

    def _wrote_checkpoint(
        self, state: S, cursor: int, state_offset: int | None, reduced: int
    ) -> None:
        """Note what the checkpoint just written holds."""
        if state_offset is None:
            self._persisted_state = state
            self._state_offset = cursor
            self._deferred_events = 0
            self._unreplayable = False
        else:
            self._deferred_events += reduced

    async def _write_state_now(self) -> None:
        """Write a deferred state at the cursor (a clean close): a restart then replays nothing."""
        if not self._loaded or self._state is self._persisted_state:
            return
        state, cursor = self._state, self._cursor
        await self._save(cursor, self._encode(state))
        self._wrote_checkpoint(state, cursor, None, 0)

    async def _rereduce_if_stale(self) -> None:
        """Re-reduce the durable log up to the old cursor: reduce only, then checkpoint.

        Never past the old cursor: a push queued behind this work would
        otherwise look stale and lose its effects.
        """
        target = self._stale_through
        if target is None:
            return
        state = self._contract.initial_state()
        position = 0
        while position < target:
            page = await self._read_page(position, PAGE_SIZE)
            below = [event for event in page.events if event.offset <= target]
            state, folded = await self._fold.fold_paced(below, state)
            self._events_reduced += folded
            if page.scanned_through_offset <= position:
                break  # the log holds nothing more below the old cursor
            position = min(page.scanned_through_offset, target)
        await self._save(target, self._encode(state))
        self._state = state
        self._wrote_checkpoint(state, target, None, 0)
        self._cursor = target
        self._stale_through = None
        self.publish_live_state()
        self._waiters.advanced(self._cursor)

    async def _save_reading_ahead(
        self, cursor: int, state_json: str | None, state_offset: int | None, limit: int
    ) -> ReadPage | None:
        """Write the checkpoint and, while it commits, read the page (``limit``) after ``cursor``.

        The write is the batch's outcome: its error is raised as from
        :meth:`_save`, whatever the read did. The read is only a head start
        for the next batch, so its own failure is dropped here.
        """
        saving = asyncio.ensure_future(self._save(cursor, state_json, state_offset))
        ahead: ReadPage | None = None
        try:
            # Let the write task take its first step (hand the write to the
            # storage) before reading: the log's read does not yield, so it
            # would otherwise run first and overlap nothing.
            await asyncio.sleep(0)
            ahead = await self._read_page(cursor, limit)
        except asyncio.CancelledError:
            saving.cancel()
            await asyncio.gather(saving, return_exceptions=True)
            raise
        except Exception:
            ahead = None
        await saving
        return ahead

    def _encode(self, state: S) -> str:
        try:
            text = self._contract.dump_state(state)
            size = len(text)
            if self._events_since_size:
                growth = (size - self._state_bytes) / self._events_since_size
                self._growth_per_event = max(self._growth_per_event, growth)
            self._state_bytes, self._events_since_size = size, 0
            return text
        except Exception as exc:
            error = StateNotSerializable(
                f'processor "{self._slug}": the reduced state cannot be written as JSON '
                f"({exc!r}), so it cannot be checkpointed; nothing was written; return only "
                "JSON-serializable values (or a pydantic model) from reduce",
                details={"slug": self._slug, "error": repr(exc)[:500]},
                retryable=False,
            )
            self._latch(error)
            raise error from exc

    async def _save(
        self, cursor: int, state_json: str | None, state_offset: int | None = None
    ) -> None:
        try:
            await self._storage.save(
                self._slug,
                reducer_version=self._version,
                reduced_through_offset=cursor,
                state_json=state_json,
                state_offset=state_offset,
            )
        except StreamkitError as exc:
            # A refusal that can only repeat (the same state, the same size):
            # fail everything at once until a new engine is built, rather than
            # re-reduce into the same wall on every push.
            if not exc.retryable:
                self._latch(exc)
            raise

"""An engine's checkpointed state: restored once at start, written once per batch.

Restoring: a checkpoint of the contract's version restores the state and the
cursor. A checkpoint of another version, or one whose state no longer
restores (a schema change without a version bump), is re-reduced from the
log up to its old cursor before anything else runs, reduce only, never past
that cursor; the live state is seeded with the projection the engine starts
from, so the re-reduce publishes the one delta that heals its clients.

Writing: one ``CheckpointStorage.save`` per batch. A refusal that can only
repeat (a state too large, a state that is not JSON) latches the engine, so
it fails at once until a new engine is built instead of re-reducing into
the same wall on every push. While the write commits, the page after the new
cursor is read as a head start for the next batch.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from streamkit.contract import ProcessorContract
from streamkit.engine._fold import Fold, report
from streamkit.engine._waiters import CursorWaiters
from streamkit.errors import StateNotSerializable, StreamkitError
from streamkit.events import ReadPage, StreamEvent
from streamkit.live_state import LiveState
from streamkit.processor import StreamProcessor
from streamkit.protocols import CheckpointStorage, ProcessorStream

__all__ = ["GROW_PAGES_AT", "MAX_CATCH_UP_PAGE", "PAGE_SIZE", "CheckpointedState"]

S = TypeVar("S")

PAGE_SIZE = 500
"""Events per read when the engine repairs a gap, and in the first page of a catch-up."""

MAX_CATCH_UP_PAGE = 4000
"""The most events one catch-up page (one batch, one checkpoint) grows to."""

GROW_PAGES_AT = 64 * 1024
"""The state JSON (bytes) from which a catch-up's pages grow.

While the state it checkpoints is at least this large, a catch-up doubles
its page after each full one, up to :data:`MAX_CATCH_UP_PAGE`: the state's
encoding and write, which grow with the state, are then paid once per 4,000
events rather than per 500. A smaller state's checkpoint costs less than
holding larger pages in memory (measured: a trivial processor catches up
about a quarter slower with pages of 4,000), so its pages stay at 500.
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
    _cursor: int
    _stale_through: int | None
    _live: LiveState[Any] | None
    _live_behind: bool
    _state_bytes: int
    _events_reduced: int
    _waiters: CursorWaiters

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
            if current:
                state = restored
                self._cursor = checkpoint.reduced_through_offset
            else:
                self._stale_through = checkpoint.reduced_through_offset
            seed_state = restored
        self._state = state
        self._persisted_state = state
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
            page = await self._stream.read(position, PAGE_SIZE)
            below = [event for event in page.events if event.offset <= target]
            state, folded = self._fold.fold_all(below, state)
            self._events_reduced += folded
            if page.scanned_through_offset <= position:
                break  # the log holds nothing more below the old cursor
            position = min(page.scanned_through_offset, target)
        await self._save(target, self._encode(state))
        self._state = state
        self._persisted_state = state
        self._cursor = target
        self._stale_through = None
        self.publish_live_state()
        self._waiters.advanced(self._cursor)

    async def _save_reading_ahead(
        self, cursor: int, state_json: str | None, limit: int
    ) -> ReadPage | None:
        """Write the checkpoint and, while it commits, read the page (``limit``) after ``cursor``.

        The write is the batch's outcome: its error is raised as from
        :meth:`_save`, whatever the read did. The read is only a head start
        for the next batch, so its own failure is dropped here.
        """
        saving = asyncio.ensure_future(self._save(cursor, state_json))
        ahead: ReadPage | None = None
        try:
            # Let the write task take its first step (hand the write to the
            # storage) before reading: the log's read does not yield, so it
            # would otherwise run first and overlap nothing.
            await asyncio.sleep(0)
            ahead = await self._stream.read(cursor, limit)
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
            self._state_bytes = len(text)
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

    async def _save(self, cursor: int, state_json: str | None) -> None:
        try:
            await self._storage.save(
                self._slug,
                reducer_version=self._version,
                reduced_through_offset=cursor,
                state_json=state_json,
            )
        except StreamkitError as exc:
            # A refusal that can only repeat (the same state, the same size):
            # fail everything at once until a new engine is built, rather than
            # re-reduce into the same wall on every push.
            if not exc.retryable:
                self._latch(exc)
            raise

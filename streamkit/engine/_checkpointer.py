"""An engine's checkpoint: restored once at start, written once per batch.

Restoring (:meth:`Checkpointer.restore`): checkpoints are kept per contract
version, one version serving (:mod:`streamkit.checkpoint`). When the serving
one is the contract's, it restores the state and the cursor. When another
version serves, or the serving state no longer restores (a schema change
without a version bump), this version builds in the *shadow*: the engine
reduces the log up to the serving cursor before anything else runs, reduce
only, never past it, checkpointing its own row as it goes (a crash resumes
there, not at 0), and then cuts over (:meth:`Checkpointer.cut_over`): its
effects run for the events after that offset only. The replaced version's
row is kept.

Writing (:meth:`Checkpointer.save`): one ``CheckpointStorage.save`` per
batch. It always moves the cursor; the state goes with it while it is small,
and a large one (from :data:`DEFER_STATE_FROM` bytes of JSON) only once its
replay would cost more than its write: after one reduced event per
:data:`BYTES_PER_DEFERRED_EVENT` bytes of state. Until then the row says
which offset its state was reduced through, and a restart reduces the
durable events from there up to the cursor again (reduce only: their effects
ran). A batch that reduced an ephemeral event, which the log cannot give
back, always writes the state (:meth:`Checkpointer.mark_unreplayable`), and
so do a shadow's rebuild and a clean close (:meth:`Checkpointer.write_state`).
A write after the version's skip tally changed carries the tally, when the
storage keeps one (:mod:`._skip_tally`); restoring restores the tally too.

A deferred state's size is not known without encoding it, so the fastest
growth per event seen between two encodings says when it must be measured:
a state that outgrows the checkpoint ceiling then fails its batch at once,
not hundreds of events later at its next write.

A refusal that can only repeat (a state too large, a state that is not JSON)
latches the engine through the ``latch`` it was given, so the engine fails
at once until a new one is built instead of re-reducing into the same wall
on every push.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic, NamedTuple, TypeVar

from streamkit.checkpoint import (
    MAX_CHECKPOINT_STATE_BYTES,
    ReduceCheckpoint,
    check_cutover,
    check_not_retired,
)
from streamkit.contract import ProcessorContract
from streamkit.engine._fold import report
from streamkit.engine._skip_tally import SkipTally
from streamkit.errors import RetainFromInvalid, StateNotSerializable, StreamkitError
from streamkit.events import MAX_OFFSET, ReadPage
from streamkit.protocols import CheckpointStorage, IncidentStorage

__all__ = ["BYTES_PER_DEFERRED_EVENT", "DEFER_STATE_FROM", "Checkpointer", "Restored"]

S = TypeVar("S")

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


class Restored(NamedTuple, Generic[S]):
    """What a stored checkpoint gives an engine to start from.

    ``state`` is reduced through ``state_offset``; the engine replays the
    durable events up to ``cursor`` into it (reduce only) when that is
    lower. ``stale_through`` is set while this version builds in the shadow:
    the serving version's cursor, which the engine reduces up to (reduce
    only) before it cuts over; ``state`` and ``cursor`` are then where that
    rebuild resumes (the initial state at 0, or the shadow's own last
    checkpoint), and ``seed`` what the serving version last projected from.
    """

    state: S
    state_offset: int
    cursor: int
    stale_through: int | None
    seed: Any


class Checkpointer(Generic[S]):
    """Restores and writes one processor's checkpoint (see the module docstring)."""

    def __init__(
        self,
        contract: ProcessorContract[S],
        storage: CheckpointStorage,
        latch: Callable[[StreamkitError], None],
        retain: Callable[[S], int | None] | None = None,
        tally: SkipTally | None = None,
    ) -> None:
        self._contract = contract
        # What this version skipped: restored with the row, written with the next checkpoint
        # after it changed, when the storage keeps it (see streamkit.engine._skip_tally).
        self._tally = tally
        self._incidents = storage if isinstance(storage, IncidentStorage) else None
        self._tally_written = 0 if tally is None else tally.changes
        # The processor's retain_from, when it has one of its own (None: it keeps nothing back).
        self._retain = retain
        # What the state last written needs, as stored with it.
        self._retain_from: int | None = None
        self._slug = contract.slug
        self._version = contract.version
        self._storage = storage
        self._latch = latch
        # The state the stored row holds, the offset it was reduced through,
        # and the events reduced since it was written (a large state's write waits).
        self._persisted: object = None
        self._state_offset = 0
        self._deferred_events = 0
        # An ephemeral was reduced since the state was last written: write it next.
        self._unreplayable = False
        # The serving version this one is built to replace, while it builds in the shadow.
        self._replacing: str | None = None
        # The size of the state JSON last encoded, the events reduced since, and
        # the fastest growth per event seen between two encodings.
        self._state_bytes = 0
        self._events_since_size = 0
        self._growth_per_event = 0.0

    @property
    def state_bytes(self) -> int:
        """The size of the state JSON last encoded (or restored), in characters."""
        return self._state_bytes

    async def restore(self) -> Restored[S]:
        """Read the stored checkpoints: what the engine starts from (see :class:`Restored`).

        The serving version's row says where effects ran through. Of this
        version: serving, its row restores; in the shadow, its own row (if
        any, and not past the serving cursor) is where the rebuild resumes,
        and the serving cursor is the target. On a slug nobody ran yet this
        version starts at 0, and serves (its first write makes it so).
        """
        initial = self._contract.initial_state()
        await self._restore_tally()
        serving = await self._storage.load(self._slug)
        if serving is None:
            self._persisted = initial
            return Restored(initial, 0, 0, None, initial)
        target = serving.reduced_through_offset
        if serving.reducer_version == self._version:
            state = self._load(serving, initial)
            if state is None:
                # Its state no longer restores: this version rebuilds itself.
                self._replacing = self._version
                return Restored(initial, 0, 0, target, initial)
            resumed = serving
        else:
            own = await self._storage.load(self._slug, self._version)
            check_not_retired(self._slug, own, serving)
            self._replacing = serving.reducer_version
            seed = self._load(serving, initial)
            # A row past the serving cursor served once, further than the present
            # serving version has come since: it cannot be resumed, only rebuilt.
            usable = own is not None and own.reduced_through_offset <= target
            state = self._load(own, initial) if own is not None and usable else None
            if own is None or state is None:
                return Restored(initial, 0, 0, target, initial if seed is None else seed)
            resumed = own
        self._persisted = state
        self._state_offset = offset = resumed.state_through_offset
        cursor = resumed.reduced_through_offset
        if self._replacing is None:
            return Restored(state, offset, cursor, None, state)
        # A shadow resumes its rebuild where its last checkpoint left it.
        return Restored(state, offset, cursor, target, seed)

    async def _restore_tally(self) -> None:
        tally, incidents = self._tally, self._incidents
        if tally is None or incidents is None:
            return
        stored = await incidents.load_incidents(self._slug, self._version)
        if stored is not None:
            tally.restore(json.loads(stored))
            self._tally_written = tally.changes

    async def replaced_tally(self) -> dict[str, Any] | None:
        """The skip tally kept for the version this one replaces (None: none kept, or none)."""
        incidents, replacing = self._incidents, self._replacing
        if incidents is None or replacing is None:
            return None
        stored = await incidents.load_incidents(self._slug, replacing)
        return None if stored is None else dict(json.loads(stored))

    def _stage_tally(self) -> int | None:
        """Stage the tally with the write about to be made if it changed; its ``changes`` then."""
        tally, incidents = self._tally, self._incidents
        if tally is None or incidents is None or tally.changes == self._tally_written:
            return None
        incidents.stage_incidents(
            self._slug, self._version, json.dumps(tally.record(), separators=(",", ":"))
        )
        return tally.changes

    def _tally_carried(self, changes: int | None) -> None:
        if changes is not None:
            self._tally_written = changes

    def _load(self, checkpoint: ReduceCheckpoint, initial: S) -> S | None:
        """The state ``checkpoint`` holds under this contract, or None if it does not restore."""
        if checkpoint.state_json is None:
            return initial
        try:
            state = self._contract.load_state(checkpoint.state_json)
        except Exception as exc:
            if checkpoint.reducer_version == self._version:
                # A state of this version that no longer restores means the
                # schema changed without a version bump: rebuild it as if
                # it had been bumped rather than refuse to start.
                report(
                    "processor.checkpoint_unreadable",
                    exc,
                    slug=self._slug,
                    offset=checkpoint.reduced_through_offset,
                    type=None,
                    detail="re-reducing from offset 0 as for a version bump",
                )
            return None
        if checkpoint.reducer_version == self._version:
            self._state_bytes = len(checkpoint.state_json)
        return state

    @property
    def replacing(self) -> str | None:
        """The serving version this one is built to replace (None: this one serves)."""
        return self._replacing

    async def fence_serving(self) -> int:
        """Stop the serving version from moving; its final cursor (what to reduce up to).

        CutoverRaced if another version serves by now (a cutover elsewhere):
        the next work restores again and sees it.
        """
        await self._storage.fence_serving(self._slug)
        serving = await self._storage.load(self._slug)
        replacing = self._replacing
        check_cutover(
            self._slug,
            self._version,
            MAX_OFFSET if serving is None else serving.reduced_through_offset,
            serving,
            replacing,
        )
        return 0 if serving is None else serving.reduced_through_offset

    async def serving_cursor(self) -> int:
        """The serving version's cursor now (a shadow waiting for a manual cutover follows it).

        CutoverRaced if the version this one replaces serves no more.
        """
        serving = await self._storage.load(self._slug)
        through = MAX_OFFSET if serving is None else serving.reduced_through_offset
        check_cutover(self._slug, self._version, through, serving, self._replacing)
        return 0 if serving is None else serving.reduced_through_offset

    async def cut_over(self, cursor: int, state: S) -> None:
        """Make this version the serving one at ``cursor`` with ``state`` (the end of a rebuild)."""
        retain_from = self._needs(state)
        staged = self._stage_tally()
        await self._storage.cut_over(
            self._slug,
            reducer_version=self._version,
            reduced_through_offset=cursor,
            state_json=self._encode(state),
            replacing=self._replacing,
            retain_from=retain_from,
        )
        self._tally_carried(staged)
        self._retain_from = retain_from
        self._replacing = None
        self._persisted = state
        self._state_offset = cursor
        self._deferred_events = 0
        self._unreplayable = False

    def replayed(self, state: S, events: int) -> None:
        """Note that ``events`` were replayed into the restored state, giving ``state``.

        The replayed state is measured once: its size and its growth per
        event tell later batches when a deferred state must be measured (a
        new engine after a failure must not let the ceiling pass unseen).
        """
        self._deferred_events = events
        self._events_since_size = events
        self._encode(state)

    def persisted(self, state: S) -> bool:
        """Whether the stored row holds ``state`` itself (nothing to write for it)."""
        return state is self._persisted

    def mark_unreplayable(self) -> None:
        """The state reduced an ephemeral event: the next checkpoint must carry it."""
        self._unreplayable = True

    async def save(
        self,
        cursor: int,
        state: S,
        reduced: int,
        read_ahead: Callable[[], Awaitable[ReadPage]] | None = None,
    ) -> ReadPage | None:
        """Write the checkpoint of a batch that reduced ``reduced`` events into ``state``.

        With ``read_ahead`` the next page is read while the write commits
        and returned (a read that fails returns None: it was only a head
        start). The write is the batch's outcome: its error is raised.
        """
        state_json = self._state_to_write(state, reduced)
        state_offset = (
            None if state_json is not None or state is self._persisted else self._state_offset
        )
        retain_from = self._retain_from if state is self._persisted else self._needs(state)
        ahead: ReadPage | None = None
        if read_ahead is None:
            await self._write(cursor, state_json, state_offset, retain_from)
        else:
            ahead = await self._write_reading_ahead(
                cursor, state_json, state_offset, retain_from, read_ahead
            )
        self._retain_from = retain_from
        if state_offset is None:
            self._persisted = state
            self._state_offset = cursor
            self._deferred_events = 0
            self._unreplayable = False
        else:
            self._deferred_events += reduced
        return ahead

    async def write_state(self, cursor: int, state: S) -> None:
        """Write ``state`` whole at ``cursor`` (a clean close, a re-reduce): nothing to replay."""
        retain_from = self._needs(state)
        await self._write(cursor, self._encode(state), None, retain_from)
        self._retain_from = retain_from
        self._persisted = state
        self._state_offset = cursor
        self._deferred_events = 0
        self._unreplayable = False

    def _state_to_write(self, state: S, reduced: int) -> str | None:
        """The state's JSON if this checkpoint must carry it, else None (kept or deferred)."""
        if state is self._persisted:
            return None
        self._events_since_size += reduced
        if (
            not self._unreplayable
            and self._state_bytes >= DEFER_STATE_FROM
            and self._deferred_events + reduced < self._state_bytes // BYTES_PER_DEFERRED_EVENT
        ):
            # Deferred: measured only once the fastest growth seen could have
            # carried it to the ceiling (see the module docstring).
            predicted = self._state_bytes + self._growth_per_event * self._events_since_size
            if predicted < MAX_CHECKPOINT_STATE_BYTES:
                return None
            text = self._encode(state)
            size = len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
            return text if size > MAX_CHECKPOINT_STATE_BYTES else None
        return self._encode(state)

    def _needs(self, state: S) -> int | None:
        """What ``state`` still needs from the log (its processor's ``retain_from``), checked.

        A wrong answer could let history go that the state needs, and it can
        only repeat for the same state: it latches the engine, nothing written.
        """
        retain = self._retain
        if retain is None:
            return None
        try:
            needs = retain(state)
        except Exception as exc:
            problem: str = f"raised {exc!r}"
        else:
            if needs is None or (
                isinstance(needs, int) and not isinstance(needs, bool) and needs >= 0
            ):
                return needs
            problem = f"returned {needs!r}, not None or an integer >= 0"
        error = RetainFromInvalid(
            f'processor "{self._slug}": retain_from(state) {problem[:300]}; the checkpoint was '
            "not written (retention must know what the state needs before it moves on); fix "
            "retain_from and restart the processor",
            details={"slug": self._slug, "problem": problem[:500]},
            retryable=False,
        )
        self._latch(error)
        raise error

    def _encode(self, state: S) -> str:
        try:
            text = self._contract.dump_state(state)
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
        size = len(text)
        if self._events_since_size:
            growth = (size - self._state_bytes) / self._events_since_size
            self._growth_per_event = max(self._growth_per_event, growth)
        self._state_bytes, self._events_since_size = size, 0
        return text

    async def _write_reading_ahead(
        self,
        cursor: int,
        state_json: str | None,
        state_offset: int | None,
        retain_from: int | None,
        read_ahead: Callable[[], Awaitable[ReadPage]],
    ) -> ReadPage | None:
        writing = asyncio.ensure_future(self._write(cursor, state_json, state_offset, retain_from))
        ahead: ReadPage | None = None
        try:
            # Let the write take its first step (hand the row to the storage)
            # before reading: the log's read does not yield, so it would
            # otherwise run first and overlap nothing.
            await asyncio.sleep(0)
            ahead = await read_ahead()
        except asyncio.CancelledError:
            writing.cancel()
            await asyncio.gather(writing, return_exceptions=True)
            raise
        except Exception:
            ahead = None
        await writing
        return ahead

    async def _write(
        self,
        cursor: int,
        state_json: str | None,
        state_offset: int | None,
        retain_from: int | None,
    ) -> None:
        staged = self._stage_tally()
        try:
            await self._storage.save(
                self._slug,
                reducer_version=self._version,
                reduced_through_offset=cursor,
                state_json=state_json,
                state_offset=state_offset,
                retain_from=retain_from,
            )
            self._tally_carried(staged)
        except StreamkitError as exc:
            # A refusal that can only repeat (the same state, the same size):
            # see the module docstring.
            if not exc.retryable:
                self._latch(exc)
            raise

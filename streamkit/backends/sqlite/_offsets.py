"""Offsets of a SQLite log, per stream path: the one offset rule and ephemeral reservations.

- The durable head is ``max(offset)`` of the path, read inside the transaction
  (cached while ``PRAGMA data_version`` says no other connection committed).
- Ephemerals draw offsets from a block reserved with one write to
  ``streamkit_heads(path, reserved_through, reserved_by)``; ``reserved_by`` is
  the writer's random token. A durable append lands at
  ``max(head, last own ephemeral)`` + 1 while the block is this writer's, else
  at ``max(head, reserved_through)`` + 1 (:func:`next_offset`), so no durable
  event ever lands at or below an offset another process may have handed to an
  ephemeral, and one process's durable-ephemeral-durable gets 1, 2, 3. The
  heads row is written only to reserve (and, on a clean close, to give back the
  unused rest).
- A block is void once another process reserved or the head passed its end.
  Blocks double (:data:`BLOCK_MIN` up to :data:`BLOCK_MAX`) while one writer
  keeps using them up and shrink back when another writer takes the row or its
  durable append skips past the block: such a skip is the hole a live
  neighbour leaves, so it must stay small.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "BLOCK_MAX",
    "BLOCK_MIN",
    "RELEASE",
    "RESERVATION",
    "RESERVE",
    "PathState",
    "next_ephemeral",
    "next_offset",
    "next_plain",
]

BLOCK_MIN = 256
BLOCK_MAX = 4096
RESERVE = (
    "INSERT INTO streamkit_heads (path, reserved_through, reserved_by) VALUES (?, ?, ?) "
    "ON CONFLICT (path) DO UPDATE SET reserved_through = excluded.reserved_through, "
    "reserved_by = excluded.reserved_by"
)
RESERVATION = "SELECT reserved_through, reserved_by FROM streamkit_heads WHERE path = ?"
RELEASE = (
    "UPDATE streamkit_heads SET reserved_through = ?, reserved_by = '' "
    "WHERE path = ? AND reserved_by = ?"
)


Snapshot = tuple[int | None, int | None, bool, int, int]
"""A :class:`PathState` saved before a group, restored if the group fails."""


@dataclass(slots=True)
class PathState:
    """What the writer knows of one path; ``None`` means re-read it in the next transaction."""

    head: int | None = None
    reserved_through: int | None = None
    mine: bool = False
    last_ephemeral: int = 0
    block: int = BLOCK_MIN

    def snapshot(self) -> Snapshot:
        return (self.head, self.reserved_through, self.mine, self.last_ephemeral, self.block)

    def restore(self, saved: Snapshot) -> None:
        (self.head, self.reserved_through, self.mine, self.last_ephemeral, self.block) = saved


def next_plain(state: PathState) -> int:
    """The offset a durable event takes next: past the head and past any ephemeral handed out.

    Ephemerals of this writer come from its reserved block (past the last one
    given); another writer's block is skipped whole, so no offset is used twice.
    """
    head = state.head
    floor = state.last_ephemeral if state.mine else state.reserved_through
    assert head is not None
    assert floor is not None
    return next_offset(head, floor)


def next_offset(head: int, floor: int) -> int:
    """The offset rule, in one place: one past the durable head and past the ephemeral floor."""
    return (head if head > floor else floor) + 1


def next_ephemeral(
    path: str, state: PathState, wanted: int, reserve: Callable[[str, int], None] | None
) -> tuple[int, int]:
    """The offset an ephemeral takes next, and 1 if a block had to be reserved for it (else 0).

    From this writer's block while it has room; otherwise a new block is
    reserved past everything handed out (``reserve(path, through)`` writes
    the heads row; it is ``None`` outside a write transaction, where no block
    may be reserved), at least ``wanted`` long, doubling while this writer
    alone uses its blocks up.
    """
    assert state.head is not None
    assert state.reserved_through is not None
    if state.mine:
        offset = max(state.head, state.last_ephemeral) + 1
        if offset <= state.reserved_through:
            state.last_ephemeral = offset
            return offset, 0
        if state.head > state.reserved_through:
            # Another writer's durable landed past the block (it had to skip it
            # whole): the block was voided, not used up, so do not grow it; under
            # contention small blocks keep the skipped holes small.
            block = BLOCK_MIN
        else:
            block = min(state.block * 2, BLOCK_MAX)  # used up by this writer alone: grow
    else:
        block = BLOCK_MIN
    if reserve is None:
        raise AssertionError("an ephemeral reservation needs the write transaction")
    start = max(state.head, state.reserved_through, state.last_ephemeral) + 1
    block = max(block, wanted)
    through = start + block - 1
    reserve(path, through)
    state.block = block
    state.reserved_through = through
    state.mine = True
    state.last_ephemeral = start
    return start, 1

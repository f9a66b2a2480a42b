"""The offset rule of every backend, and the blocks of offsets reserved for ephemerals.

Pure bookkeeping, no storage: a backend reads what it stores of a path into a
:class:`PathState` and asks these functions where the next event lands.

- A durable event lands at ``max(head, floor) + 1`` (:func:`next_offset`):
  the floor is this writer's last ephemeral while the reserved block is its
  own, else the end of the block another writer reserved. So no durable
  event ever lands at or below an offset another writer may have handed to
  an ephemeral, and one writer's durable-ephemeral-durable gets 1, 2, 3.
- Ephemerals draw offsets from a block reserved with one write
  (:func:`next_ephemeral`); a block is void once another writer reserved or
  the head passed its end. Blocks double (:data:`BLOCK_MIN` up to
  :data:`BLOCK_MAX`) while one writer keeps using them up and shrink back
  when another writer takes the row or its durable append skips past the
  block: such a skip is the hole a live neighbour leaves, so it must stay
  small.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamkit._requests import AppendCall, WriteCall

__all__ = [
    "BLOCK_MAX",
    "BLOCK_MIN",
    "PathState",
    "Snapshot",
    "ephemeral_needs",
    "next_ephemeral",
    "next_offset",
    "next_plain",
]

BLOCK_MIN = 256
BLOCK_MAX = 4096


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


def ephemeral_needs(calls: Sequence[WriteCall]) -> dict[str, int] | None:
    """Offsets per path a group of ephemerals only needs; None if the group has anything else.

    Such a group may be served from a writer's own blocks with no
    transaction; an ``expect_head`` precondition needs the head row read in
    one, so it disqualifies the group.
    """
    need: dict[str, int] = {}
    for call in calls:
        if (
            not isinstance(call, AppendCall)
            or call.ephemerals != len(call.events)
            or call.expect_head is not None
        ):
            return None
        need[call.path] = need.get(call.path, 0) + call.ephemerals
    return need

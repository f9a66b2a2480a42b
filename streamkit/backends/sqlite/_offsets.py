"""The SQLite statements of the offset rule: the heads row that records ephemeral blocks.

The rule itself is :mod:`streamkit.backends._blocks` (re-exported here for
the SQLite modules). In SQLite the durable head is the greater of the
``head`` of the path's ``streamkit_heads`` row and its newest row, read
inside the transaction (cached while ``PRAGMA data_version`` says no other
connection committed). The row is set by the path's first stored event
(``_group_commit.HEAD``) and raised, in the deleting transaction, by a
trigger whenever a row above it is deleted (``_layout.HEADS_TRIGGER``): it
is never taken from the rows alone, so deleting the newest rows does not
hand their offsets out again, and a commit writes no heads row (a page of
the WAL each: a fifth of an append's time at ``synchronous=NORMAL``). A block is reserved with one write to the same
row's ``reserved_through`` and ``reserved_by`` (the writer's random token),
and on a clean close the unused rest is given back.
"""

from __future__ import annotations

from streamkit.backends._blocks import (
    BLOCK_MAX,
    BLOCK_MIN,
    PathState,
    Snapshot,
    next_ephemeral,
    next_offset,
    next_plain,
)

__all__ = [
    "BLOCK_MAX",
    "BLOCK_MIN",
    "RELEASE",
    "RESERVATION",
    "RESERVE",
    "PathState",
    "Snapshot",
    "next_ephemeral",
    "next_offset",
    "next_plain",
]

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

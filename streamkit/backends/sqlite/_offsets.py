"""The SQLite statements of the offset rule: the heads row that records ephemeral blocks.

The rule itself is :mod:`streamkit.backends._blocks` (re-exported here for
the SQLite modules). In SQLite the durable head is the ``head`` of the
path's ``streamkit_heads`` row, which every commit that stores an event moves
in its own transaction (``_group_commit.HEAD``), read inside the transaction
(cached while ``PRAGMA data_version`` says no other connection committed).
It is never taken from the rows alone: deleting the newest rows must not
hand their offsets out again. A block is reserved with one write to the same
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

"""The offset rule on PostgreSQL: a per-path head row, taken inside the append's transaction.

Every append locks its path's row in ``streamkit_heads`` before it places an
event, and keeps it until its transaction ends, so:

- a second append to the same path waits for the first to commit or roll
  back, and then continues from the head it left: offsets of a path are
  handed out in commit order, and no offset becomes visible before a lower
  one;
- a rolled-back append rolls its head back too: no hole, no offset reused;
- appends to different paths never wait for each other.

A plain append (durable events, nothing refusable) takes its offsets with
:func:`take_offsets`, ONE statement (an upsert, so a new path needs no
second round trip): call it after everything that can be done before
(validation, encoding), so the row is held for this statement plus the
inserts and the commit. Any other append locks the row with
:func:`lock_head`, places its events with the shared rules of
:mod:`streamkit.backends._append_rules` and writes the row back with
:func:`store_head`. The rule is the one of :mod:`streamkit.backends._blocks`
(``take_offsets`` states it in SQL): one past the durable head and past the
block another writer reserved for ephemerals, or past this writer's own last
ephemeral if the block is its own (``writer`` names it).

The row also keeps the path's latest ``created_at``: each append stamps
``max(its clock, the row's stamp)`` under the lock, so stamps follow offset
order whichever host commits.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg

__all__ = ["TAKE", "HeadRow", "Taken", "lock_head", "read_heads", "store_head", "take_offsets"]

TAKE = """
INSERT INTO {s}.streamkit_heads AS h (path, head, stamped)
VALUES (%(path)s, %(count)s, %(now)s)
ON CONFLICT (path) DO UPDATE SET head = GREATEST(
    h.head,
    CASE WHEN h.reserved_by = %(writer)s THEN %(last_ephemeral)s ELSE h.reserved_through END
) + %(count)s, stamped = GREATEST(h.stamped, %(now)s)
RETURNING head, stamped
"""
_LOCK = """
INSERT INTO {s}.streamkit_heads AS h (path) VALUES (%s)
ON CONFLICT (path) DO UPDATE SET head = h.head
RETURNING head, reserved_through, reserved_by, stamped
"""
_STORE = """
UPDATE {s}.streamkit_heads
SET head = %s, reserved_through = %s, reserved_by = %s, stamped = %s WHERE path = %s
"""
_READ = """
SELECT path, head, reserved_through, reserved_by, stamped
FROM {s}.streamkit_heads WHERE path = ANY(%s)
"""


class Taken(NamedTuple):
    """Offsets taken by a plain append: the first of them, and the stamp they commit under."""

    first: int
    stamp: str


class HeadRow(NamedTuple):
    """A path's row as stored: its durable head, the reserved block and the latest stamp."""

    head: int
    reserved_through: int
    reserved_by: str
    stamped: str


def _sql(statement: str, schema: str) -> str:
    # Schema names are plain lower-case identifiers (_target), so quoting is this simple.
    return statement.replace("{s}", f'"{schema}"')


def take_offsets(
    conn: psycopg.Connection[Any],
    schema: str,
    path: str,
    count: int,
    *,
    writer: str,
    last_ephemeral: int = 0,
    now: str = "",
) -> Taken:
    """Take ``count`` (≥ 1) consecutive durable offsets of ``path`` and the stamp ``≥ now``.

    Must run inside the transaction that inserts the events. ``writer`` is
    this writer's token (never empty), ``last_ephemeral`` the last offset it
    handed to an ephemeral of ``path`` from its own block.
    """
    if count < 1 or not writer:
        raise ValueError("take_offsets needs count >= 1 and a writer token")
    row = conn.execute(
        _sql(TAKE, schema),
        {
            "path": path,
            "count": count,
            "writer": writer,
            "last_ephemeral": last_ephemeral,
            "now": now,
        },
    ).fetchone()
    assert row is not None  # an upsert with RETURNING always returns its row
    return Taken(int(row[0]) - count + 1, str(row[1]))


def lock_head(conn: psycopg.Connection[Any], schema: str, path: str) -> HeadRow:
    """Lock the row of ``path`` (making it if new) until the transaction ends; return it."""
    row = conn.execute(_sql(_LOCK, schema), (path,)).fetchone()
    assert row is not None
    return HeadRow(int(row[0]), int(row[1]), str(row[2]), str(row[3]))


def store_head(conn: psycopg.Connection[Any], schema: str, path: str, row: HeadRow) -> None:
    """Write back the row of ``path`` that :func:`lock_head` locked in this transaction."""
    conn.execute(_sql(_STORE, schema), (*row, path))


def read_heads(conn: psycopg.Connection[Any], schema: str, paths: list[str]) -> dict[str, HeadRow]:
    """The committed rows of ``paths`` (no lock; a path never appended to has none)."""
    rows = conn.execute(_sql(_READ, schema), (paths,)).fetchall()
    return {
        str(path): HeadRow(int(head), int(through), str(by), str(stamped))
        for path, head, through, by, stamped in rows
    }

"""The offset rule on PostgreSQL: a per-path head row, taken inside the append's transaction.

:func:`take_offsets` moves the path's row in ``streamkit_heads`` forward by
the number of durable events an append places and returns the first offset
they take, in ONE statement (an upsert, so a new path needs no second
round trip). The row stays locked until the transaction ends, so:

- a second append to the same path waits for the first to commit or roll
  back, and then continues from the head it left: offsets of a path are
  handed out in commit order, and no offset becomes visible before a lower
  one;
- a rolled-back append rolls its head back too: no hole, no offset reused;
- appends to different paths never wait for each other.

Call it after everything that can be done before (validation, encoding,
hashing), so the row is held for this one statement plus the inserts and
the commit. The rule itself is the SQLite backend's: one past the durable
head and past the block another writer reserved for ephemerals; past this
writer's own last ephemeral if the block is its own (``writer`` names it).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

__all__ = ["take_offsets"]

_TAKE = """
INSERT INTO {schema}.streamkit_heads AS h (path, head) VALUES (%(path)s, %(count)s)
ON CONFLICT (path) DO UPDATE SET head = GREATEST(
    h.head,
    CASE WHEN h.reserved_by = %(writer)s THEN %(last_ephemeral)s ELSE h.reserved_through END
) + %(count)s
RETURNING head
"""


def take_offsets(
    conn: psycopg.Connection[Any],
    schema: str,
    path: str,
    count: int,
    *,
    writer: str,
    last_ephemeral: int = 0,
) -> int:
    """Reserve ``count`` (≥ 1) consecutive durable offsets of ``path``; return the first.

    Must run inside the transaction that inserts the events. ``writer`` is
    this writer's token (never empty), ``last_ephemeral`` the last offset it
    handed to an ephemeral of ``path`` from its own block.
    """
    if count < 1 or not writer:
        raise ValueError("take_offsets needs count >= 1 and a writer token")
    row = conn.execute(
        sql.SQL(_TAKE).format(schema=sql.Identifier(schema)),
        {"path": path, "count": count, "writer": writer, "last_ephemeral": last_ephemeral},
    ).fetchone()
    assert row is not None  # an upsert with RETURNING always returns its row
    return int(row[0]) - count + 1

"""What the database alone says about processors: checkpoints, leases, claims, heads.

``streamkit status`` and ``streamkit snapshot`` use this when no host answers
on the control socket, and a running host merges its runtime view (stalled,
rates, queue) over it. Everything is read on the connection given (the
log's reader); nothing is written. Tables a host has not created yet read as empty.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from streamkit.backends._status_rows import status_rows
from streamkit.backends.sqlite._read import durable_head
from streamkit.backends.sqlite.checkpoints import DEFAULT_CHECKPOINT_TABLE, ReduceCheckpointTable
from streamkit.backends.sqlite.leases import LEASE_TABLE, leases

__all__ = ["durable_lag", "has_checkpoints", "read_status", "stream_heads"]


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {
        str(row[0])
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    }


def read_status(conn: sqlite3.Connection, now: float) -> list[dict[str, Any]]:
    """One row per known (path, slug): version, cursor, head, lag, lease and claim."""
    tables = _tables(conn)
    stored: list[Any] = []
    if DEFAULT_CHECKPOINT_TABLE in tables:
        table = ReduceCheckpointTable(conn, create_table=False)
        stored = [(slug, table.read(slug)) for slug in table.slugs()]

    def head_and_lag(path: str, cursor: int) -> tuple[int, int]:
        return durable_head(conn, path), durable_lag(conn, path, cursor)

    return status_rows(
        [(lease, lease.held_at(now)) for lease in leases(conn)] if LEASE_TABLE in tables else [],
        [
            (str(path), str(slug), float(due))
            for path, slug, due in conn.execute("SELECT path, slug, due_at FROM streamkit_claims")
        ],
        [(slug, checkpoint) for slug, checkpoint in stored if checkpoint is not None],
        head_and_lag,
    )


def durable_lag(conn: sqlite3.Connection, path: str, cursor: int) -> int:
    """How many durable events of ``path`` lie past ``cursor``: the lag, in events.

    Not ``head - cursor``: offsets taken by ephemerals (live-state deltas) and
    reserved blocks leave holes, which are no work for anybody.
    """
    row = conn.execute(
        'SELECT count(*) FROM streamkit_events WHERE path = ? AND "offset" > ?', (path, cursor)
    ).fetchone()
    return int(row[0])


def has_checkpoints(conn: sqlite3.Connection) -> bool:
    """Whether a host ever made the checkpoint table in this file."""
    return DEFAULT_CHECKPOINT_TABLE in _tables(conn)


# The heads row is a floor under the durable head (see ._offsets): the newest row may be past it.
_STREAM_HEADS = (
    'SELECT h.path, max(h.head, coalesce((SELECT max(e."offset") FROM streamkit_events AS e '
    "WHERE e.path = h.path), 0)) FROM streamkit_heads AS h WHERE h.head > 0 ORDER BY h.path"
)


def stream_heads(conn: sqlite3.Connection) -> list[tuple[str, int]]:
    """Every path that ever stored a durable event and its durable head, sorted by path."""
    return [(str(path), int(head)) for path, head in conn.execute(_STREAM_HEADS).fetchall()]

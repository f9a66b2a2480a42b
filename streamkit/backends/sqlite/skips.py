"""Operator skips: moving a stalled processor past one event, with the decision in the log.

A skip is two records written in ONE transaction. The durable event
``streamkit.event-skipped`` (payload ``{slug, offset, by, reason}``) on the
processor's stream path says who skipped what and why, for anyone reading
the log later. A row in ``streamkit_skips`` beside it names the skip event's
own offset, and lets a host load every skip at start without scanning the log.

Only the shared rules (:mod:`streamkit.backends._skip_rules`, through
``ProcessorHost.skip`` and ``streamkit skip``) write them, with this
module's :func:`insert`: the ``streamkit.`` type namespace is refused to every ordinary append,
and hosts obey the rows alone (:func:`recorded_skips`), so a forged skip event,
from a log written before the namespace was reserved say, is never obeyed. A
retried skip appends nothing new (an idempotency key), and the row is
written with it.

A host applies a skip made through it at once, and one recorded by another
process (the CLI when no host answers, another host) at its next heartbeat,
so a running processor needs no restart. A skipped event is hidden from that
one processor only: its reads and pushes never contain it, and its cursor
moves past it by the scanned range as usual.
"""

from __future__ import annotations

import sqlite3

from streamkit.backends.sqlite.checkpoints import DEFAULT_CHECKPOINT_TABLE, ReduceCheckpointTable
from streamkit.backends.sqlite.leases import LEASE_TABLE, read_lease

__all__ = [
    "SKIP_TABLE",
    "ensure_skip_table",
    "insert",
    "processor_facts",
    "recorded_at",
    "recorded_skips",
]

SKIP_TABLE = "streamkit_skips"


def ensure_skip_table(conn: sqlite3.Connection) -> None:
    """Create the skip table if missing (joins the caller's transaction)."""
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {SKIP_TABLE} ("
        " path TEXT NOT NULL,"
        " slug TEXT NOT NULL,"
        ' "offset" INTEGER NOT NULL,'
        " skip_event_offset INTEGER NOT NULL,"
        ' PRIMARY KEY (path, slug, "offset")'
        ") WITHOUT ROWID"
    )


def insert(conn: sqlite3.Connection, path: str, slug: str, offset: int, at: int) -> None:
    ensure_skip_table(conn)
    conn.execute(
        f'INSERT OR IGNORE INTO {SKIP_TABLE} (path, slug, "offset", skip_event_offset)'
        " VALUES (?, ?, ?, ?)",
        (path, slug, offset, at),
    )


def recorded_skips(conn: sqlite3.Connection) -> dict[tuple[str, str], dict[int, int]]:
    """Every recorded skip: ``(path, slug) -> {offset: offset of its skip event}``.

    Empty if the table is missing (no skip was ever recorded).
    """
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SKIP_TABLE,)
    ).fetchone()
    skips: dict[tuple[str, str], dict[int, int]] = {}
    if found is None:
        return skips
    for path, slug, offset, at in conn.execute(
        f'SELECT path, slug, "offset", skip_event_offset FROM {SKIP_TABLE}'
    ).fetchall():
        skips.setdefault((str(path), str(slug)), {})[int(offset)] = int(at)
    return skips


def processor_facts(conn: sqlite3.Connection, path: str, slug: str) -> tuple[bool, int | None]:
    """Whether ``slug`` ever ran on ``path`` (a checkpoint or a lease), and its cursor."""
    tables = {
        str(row[0])
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    }
    cursor = None
    if DEFAULT_CHECKPOINT_TABLE in tables:
        stored = ReduceCheckpointTable(conn, create_table=False).read(slug)
        cursor = None if stored is None else stored.reduced_through_offset
    leased = LEASE_TABLE in tables and read_lease(conn, path, slug) is not None
    return cursor is not None or leased, cursor


def recorded_at(conn: sqlite3.Connection, path: str, slug: str, offset: int) -> int | None:
    """The offset of the skip event recorded for ``(path, slug, offset)``, or None."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SKIP_TABLE,)
    ).fetchone()
    if exists is None:
        return None
    row = conn.execute(
        f'SELECT skip_event_offset FROM {SKIP_TABLE} WHERE path = ? AND slug = ? AND "offset" = ?',
        (path, slug, offset),
    ).fetchone()
    return None if row is None else int(row[0])

"""Each version's skips in SQLite: one row per processor slug and version, beside its checkpoint.

The row holds the version's :class:`~streamkit.engine._skip_tally.SkipTally`
record as JSON. It is written only with a checkpoint write (the fenced save
or the cutover of :mod:`streamkit.backends._fenced_checkpoints`, or a
:class:`~streamkit.ReduceCheckpointTable` write, in one transaction), so a
checkpoint never stands past a skip its row does not count, and it is kept
when the version stops serving: ``processor versions`` and a cutover's
check read both versions' rows. A file no host ran on has no table; every
read then finds nothing. A :class:`~streamkit.ReduceCheckpointTable` of
another name keeps its tallies in a table named after it
(``<name>_incidents``).
"""

from __future__ import annotations

import sqlite3

__all__ = ["INCIDENT_TABLE", "ensure_incident_table", "read_incidents", "write_incidents"]

INCIDENT_TABLE = "streamkit_version_incidents"


def ensure_incident_table(conn: sqlite3.Connection, table: str = INCIDENT_TABLE) -> None:
    """Create the table if missing (joins the caller's transaction)."""
    conn.execute(
        f'CREATE TABLE IF NOT EXISTS "{table}" ('
        " slug TEXT NOT NULL,"
        " reducer_version TEXT NOT NULL,"
        " record TEXT NOT NULL,"
        " PRIMARY KEY (slug, reducer_version)"
        ") WITHOUT ROWID"
    )


def write_incidents(
    conn: sqlite3.Connection, slug: str, version: str, record: str, table: str = INCIDENT_TABLE
) -> None:
    """Store ``record`` as the tally of ``slug`` at ``version`` (inside the caller's transaction)."""
    ensure_incident_table(conn, table)
    conn.execute(
        f'INSERT INTO "{table}" (slug, reducer_version, record) VALUES (?, ?, ?) '
        "ON CONFLICT (slug, reducer_version) DO UPDATE SET record = excluded.record",
        (slug, version, record),
    )


def read_incidents(
    conn: sqlite3.Connection, slug: str, table: str = INCIDENT_TABLE
) -> dict[str, str]:
    """``{version: record}`` of every version of ``slug`` that has one."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    if exists is None:
        return {}
    return {
        str(version): str(record)
        for version, record in conn.execute(
            f'SELECT reducer_version, record FROM "{table}" WHERE slug = ?', (slug,)
        ).fetchall()
    }

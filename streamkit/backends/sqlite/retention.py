"""Retention's rows in a SQLite log: checkpoint needs, holds and what hosts run.

The table operations :mod:`streamkit.backends._retention_rules` needs, over
the log's own file: the checkpoint table a host made (none yet: no rows),
``streamkit_holds`` (made at open), the heads and the host registry. Reads
run on the log's reader connection, writes inside the control event's
transaction on the writer connection.
"""

from __future__ import annotations

import json
import sqlite3

from streamkit.backends._retention_rules import (
    HOLD_COLUMNS,
    NEED_COLUMNS,
    RetentionFacts,
    hold_of,
    need_of,
)
from streamkit.backends.sqlite.checkpoints import DEFAULT_CHECKPOINT_TABLE
from streamkit.backends.sqlite.registry import HOSTS_TABLE
from streamkit.backends.sqlite.status import stream_heads
from streamkit.horizon import CheckpointNeed, Hold

__all__ = ["ROWS", "SqliteRetentionRows"]

_NEEDS = f"SELECT {NEED_COLUMNS} FROM {DEFAULT_CHECKPOINT_TABLE}"


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {
        str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }


class SqliteRetentionRows:
    """The retention rows of a SQLite log (see :class:`~streamkit.backends._retention_rules.RetentionRows`)."""

    @staticmethod
    def facts(conn: sqlite3.Connection) -> RetentionFacts:
        tables = _tables(conn)
        rows = (
            [need_of(row) for row in conn.execute(_NEEDS)]
            if DEFAULT_CHECKPOINT_TABLE in tables
            else []
        )
        holds = [
            hold_of(row)
            for row in conn.execute(
                f"SELECT {HOLD_COLUMNS} FROM streamkit_holds ORDER BY path, name"
            )
        ]
        running: list[str] = []
        if HOSTS_TABLE in tables:
            for (keys,) in conn.execute(f"SELECT processors FROM {HOSTS_TABLE}"):
                running.extend(str(key) for key in json.loads(keys))
        return RetentionFacts(stream_heads(conn), rows, holds, running)

    @staticmethod
    def insert_hold(conn: sqlite3.Connection, hold: Hold) -> Hold | None:
        found = conn.execute(
            f"SELECT {HOLD_COLUMNS} FROM streamkit_holds WHERE path = ? AND name = ?",
            (hold.path, hold.name),
        ).fetchone()
        if found is not None:
            return hold_of(found)
        conn.execute(
            f"INSERT INTO streamkit_holds ({HOLD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                hold.path,
                hold.name,
                hold.from_offset,
                hold.until,
                hold.placed_by,
                hold.reason,
                hold.placed_at,
            ),
        )
        return None

    @staticmethod
    def delete_hold(conn: sqlite3.Connection, path: str, name: str) -> Hold | None:
        found = conn.execute(
            f"DELETE FROM streamkit_holds WHERE path = ? AND name = ? RETURNING {HOLD_COLUMNS}",
            (path, name),
        ).fetchone()
        return None if found is None else hold_of(found)

    @staticmethod
    def delete_checkpoints(
        conn: sqlite3.Connection, slug: str, version: str | None
    ) -> list[CheckpointNeed]:
        if DEFAULT_CHECKPOINT_TABLE not in _tables(conn):
            return []
        returning = f" RETURNING {NEED_COLUMNS}"
        if version is None:
            found = conn.execute(
                f"DELETE FROM {DEFAULT_CHECKPOINT_TABLE} WHERE slug = ?{returning}", (slug,)
            ).fetchall()
        else:
            found = conn.execute(
                f"DELETE FROM {DEFAULT_CHECKPOINT_TABLE} WHERE slug = ? AND reducer_version = ?"
                f"{returning}",
                (slug, version),
            ).fetchall()
        return [need_of(row) for row in found]


ROWS = SqliteRetentionRows()

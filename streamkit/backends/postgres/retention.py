"""Retention's rows in a PostgreSQL log: checkpoint needs, holds and what hosts run.

The table operations :mod:`streamkit.backends._retention_rules` needs, over
the tables of the log's schema (all made when the log is opened). Reads run
on the log's reader threads, writes inside the control event's transaction
on the writer connection.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from streamkit.backends._retention_rules import (
    HOLD_COLUMNS,
    NEED_COLUMNS,
    RetentionFacts,
    hold_of,
    need_of,
)
from streamkit.horizon import CheckpointNeed, Hold

__all__ = ["PostgresRetentionRows"]


class PostgresRetentionRows:
    """The retention rows of the log in ``schema`` (see ``RetentionRows``)."""

    def __init__(self, schema: str) -> None:
        s = f'"{schema}"'
        self._needs = f"SELECT {NEED_COLUMNS} FROM {s}.streamkit_checkpoints"
        self._holds = (
            f'SELECT {HOLD_COLUMNS} FROM {s}.streamkit_holds ORDER BY path COLLATE "C", name'
        )
        self._heads = (
            f'SELECT path, head FROM {s}.streamkit_heads WHERE head > 0 ORDER BY path COLLATE "C"'
        )
        self._running = f"SELECT processors FROM {s}.streamkit_hosts"
        self._insert_hold = (
            f"INSERT INTO {s}.streamkit_holds ({HOLD_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (path, name) DO NOTHING"
        )
        self._hold = f"SELECT {HOLD_COLUMNS} FROM {s}.streamkit_holds WHERE path = %s AND name = %s"
        self._delete_hold = (
            f"DELETE FROM {s}.streamkit_holds WHERE path = %s AND name = %s "
            f"RETURNING {HOLD_COLUMNS}"
        )
        self._forget = (
            f"DELETE FROM {s}.streamkit_checkpoints WHERE slug = %(slug)s "
            f"AND (%(version)s::text IS NULL OR reducer_version = %(version)s) "
            f"RETURNING {NEED_COLUMNS}"
        )

    def facts(self, conn: psycopg.Connection[Any]) -> RetentionFacts:
        heads = [(str(path), int(head)) for path, head in conn.execute(self._heads)]
        rows = [need_of(row) for row in conn.execute(self._needs)]
        holds = [hold_of(row) for row in conn.execute(self._holds)]
        running = [str(key) for (keys,) in conn.execute(self._running) for key in json.loads(keys)]
        return RetentionFacts(heads, rows, holds, running)

    def insert_hold(self, conn: psycopg.Connection[Any], hold: Hold) -> Hold | None:
        inserted = conn.execute(
            self._insert_hold,
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
        if inserted.rowcount == 1:
            return None
        found = conn.execute(self._hold, (hold.path, hold.name)).fetchone()
        if found is None:  # released between the two statements: place it after all
            return self.insert_hold(conn, hold)
        return hold_of(found)

    def delete_hold(self, conn: psycopg.Connection[Any], path: str, name: str) -> Hold | None:
        found = conn.execute(self._delete_hold, (path, name)).fetchone()
        return None if found is None else hold_of(found)

    def delete_checkpoints(
        self, conn: psycopg.Connection[Any], slug: str, version: str | None
    ) -> list[CheckpointNeed]:
        found = conn.execute(self._forget, {"slug": slug, "version": version}).fetchall()
        return [need_of(row) for row in found]

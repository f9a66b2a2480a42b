"""Retention's rows in a PostgreSQL log: checkpoint needs, holds, what hosts run, and cuts.

The table operations :mod:`streamkit.backends._retention.rules` needs, over
the tables of the log's schema (all made when the log is opened). Reads run
on the log's reader threads, writes inside the control event's transaction
on a writer's connection (a cut's, on the writer of a log of its own).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from streamkit.backends._retention.cuts import Cut, check_start_unmoved, segment_values
from streamkit.backends._retention.key_windows import KEY_WINDOW_COLUMNS, key_window_of
from streamkit.backends._retention.rules import (
    HOLD_COLUMNS,
    NEED_COLUMNS,
    RetentionFacts,
    hold_of,
    hold_values,
    need_of,
)
from streamkit.backends._retention.segments import segment_of
from streamkit.backends._stored import Row
from streamkit.horizon import CheckpointNeed, Hold
from streamkit.key_window import KeyWindow
from streamkit.records import Segment

__all__ = ["PostgresRetentionRows"]


class PostgresRetentionRows:
    """The retention rows of the log in ``schema`` (see ``RetentionRows``)."""

    def __init__(self, schema: str) -> None:
        s = f'"{schema}"'
        self._windows = f"SELECT path, keep_for FROM {s}.streamkit_key_windows"
        self._window = f"SELECT {KEY_WINDOW_COLUMNS} FROM {s}.streamkit_key_windows WHERE path = %s"
        self._drop_window = f"DELETE FROM {s}.streamkit_key_windows WHERE path = %s"
        self._put_window = (
            f"INSERT INTO {s}.streamkit_key_windows ({KEY_WINDOW_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s)"
        )
        # A key's row records its event's created_at only once retention took the event.
        self._expired = (
            f"SELECT key FROM {s}.streamkit_keys WHERE path = %s "
            "AND created_at IS NOT NULL AND created_at < %s ORDER BY created_at LIMIT %s"
        )
        self._forget_keys = (
            f"DELETE FROM {s}.streamkit_keys WHERE path = %s AND key = ANY(%s) "
            "AND created_at IS NOT NULL AND created_at < %s"
        )
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
        segment_columns = "path, first_offset, last_offset, count, bytes, file, sha256, prev_sha256"
        self._truncated = f"SELECT truncated_through FROM {s}.streamkit_heads WHERE path = %s"
        self._starts = (
            f"SELECT path, truncated_through FROM {s}.streamkit_heads WHERE truncated_through > 0"
        )
        self._archived = (
            f"SELECT path, count(*), sum(bytes) FROM {s}.streamkit_segments GROUP BY path"
        )
        self._segments = (
            f"SELECT {segment_columns} FROM {s}.streamkit_segments "
            "WHERE %(path)s::text IS NULL OR path = %(path)s "
            'ORDER BY path COLLATE "C", first_offset'
        )
        self._rows = (
            'SELECT "offset", type, payload, metadata, source, idempotency_key, created_at, '
            f"coalesce(payload_version, 1) FROM {s}.streamkit_events "
            'WHERE path = %s AND "offset" > %s AND "offset" <= %s ORDER BY "offset" LIMIT %s'
        )
        # A transaction-scoped lock per (schema, path), taken by retention cuts only.
        self._one_run = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
        self._run_key = f"streamkit retention {schema} "
        self._insert_segment = (
            f"INSERT INTO {s}.streamkit_segments ({segment_columns}, created_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, "
            """to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))"""
        )
        # Every key of a chunk in one statement: one round trip, not one per key.
        self._record_keys = (
            f"UPDATE {s}.streamkit_keys AS k SET body_sha256 = u.sha, created_at = u.at "
            "FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[]) AS u(key, off, sha, at) "
            'WHERE k.path = %s AND k.key = u.key AND k."offset" = u.off'
        )
        self._take_types = (
            f"UPDATE {s}.streamkit_stored_types SET events = events - %s, "
            "first_offset = greatest(first_offset, %s) WHERE path = %s AND type = %s AND version = %s"
        )
        self._drop_types = f"DELETE FROM {s}.streamkit_stored_types WHERE path = %s AND events <= 0"
        self._delete = (
            f'DELETE FROM {s}.streamkit_events WHERE path = %s AND "offset" > %s AND "offset" <= %s'
        )
        self._move_start = f"UPDATE {s}.streamkit_heads SET truncated_through = %s WHERE path = %s"
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
        starts = {str(path): int(through) + 1 for path, through in conn.execute(self._starts)}
        archived = {
            str(path): (int(count), int(size)) for path, count, size in conn.execute(self._archived)
        }
        windows = {str(path): float(keep) for path, keep in conn.execute(self._windows)}
        return RetentionFacts(heads, rows, holds, running, starts, archived, windows)

    def key_window(self, conn: psycopg.Connection[Any], path: str) -> KeyWindow | None:
        found = conn.execute(self._window, (path,)).fetchone()
        return None if found is None else key_window_of(found)

    def put_key_window(
        self, conn: psycopg.Connection[Any], path: str, window: KeyWindow | None
    ) -> None:
        conn.execute(self._drop_window, (path,))
        if window is not None:
            conn.execute(
                self._put_window,
                (path, window.keep_for, window.set_by, window.reason, window.set_at),
            )

    def expired_keys(
        self, conn: psycopg.Connection[Any], path: str, before: str, limit: int
    ) -> list[str]:
        return [str(key) for (key,) in conn.execute(self._expired, (path, before, limit))]

    def forget_keys(
        self, conn: psycopg.Connection[Any], path: str, keys: list[str], before: str
    ) -> int:
        return conn.execute(self._forget_keys, (path, keys, before)).rowcount

    def insert_hold(self, conn: psycopg.Connection[Any], hold: Hold) -> Hold | None:
        inserted = conn.execute(
            self._insert_hold,
            hold_values(hold),
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

    def truncated_through(self, conn: psycopg.Connection[Any], path: str) -> int:
        row = conn.execute(self._truncated, (path,)).fetchone()
        return 0 if row is None else int(row[0])

    def segments(self, conn: psycopg.Connection[Any], path: str | None) -> list[Segment]:
        return [segment_of(row) for row in conn.execute(self._segments, {"path": path})]

    def stored_rows(
        self, conn: psycopg.Connection[Any], path: str, after: int, through: int, limit: int
    ) -> list[Row]:
        found = conn.execute(self._rows, (path, after, through, limit)).fetchall()
        return [
            (int(o), str(t), str(p), str(m), s, k, str(c), int(v))
            for o, t, p, m, s, k, c, v in found
        ]

    def reclaim_step(self, conn: psycopg.Connection[Any]) -> int:
        """Nothing to do: autovacuum makes the deleted rows' space reusable (docs/retention.md)."""
        del conn
        return 0

    def take(self, conn: psycopg.Connection[Any], cut: Cut) -> int:
        # Runs of one path wait for each other here, not at the path's head row (which
        # appends take): the second then finds the start moved and is refused.
        conn.execute(self._one_run, (self._run_key + cut.path,))
        check_start_unmoved(cut, self.truncated_through(conn, cut.path))
        segment = cut.segment
        if segment is not None:
            conn.execute(self._insert_segment, segment_values(segment))
        if cut.keys:
            keys, offsets, shas, ats = zip(*cut.keys, strict=True)
            conn.execute(
                self._record_keys, (list(keys), list(offsets), list(shas), list(ats), cut.path)
            )
        return int(conn.execute(self._delete, (cut.path, cut.after, cut.through)).rowcount)

    def move_start(self, conn: psycopg.Connection[Any], cut: Cut) -> None:
        with conn.cursor() as cursor:
            cursor.executemany(
                self._take_types,
                [(n, cut.through + 1, cut.path, t, v) for (t, v), n in cut.types.items()],
            )
        conn.execute(self._drop_types, (cut.path,))
        conn.execute(self._move_start, (cut.through, cut.path))

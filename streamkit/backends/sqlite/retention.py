"""Retention's rows in a SQLite log: checkpoint needs, holds, what hosts run, and cuts.

The table operations :mod:`streamkit.backends._retention.rules` needs, over
the log's own file: the checkpoint table a host made (none yet: no rows),
``streamkit_holds`` (made at open), the heads and the host registry. Reads
run on the log's reader connection, writes inside the control event's
transaction on the writer connection.
"""

from __future__ import annotations

import json
import sqlite3

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
from streamkit.backends.sqlite._summary import settle
from streamkit.backends.sqlite.checkpoints import DEFAULT_CHECKPOINT_TABLE
from streamkit.backends.sqlite.registry import HOSTS_TABLE
from streamkit.backends.sqlite.status import stream_heads
from streamkit.horizon import CheckpointNeed, Hold
from streamkit.key_window import KeyWindow
from streamkit.records import Segment

__all__ = ["RECLAIM_STEP", "ROWS", "SqliteRetentionRows", "reclaim_step"]

_NEEDS = f"SELECT {NEED_COLUMNS} FROM {DEFAULT_CHECKPOINT_TABLE}"
_SEGMENT_COLUMNS = "path, first_offset, last_offset, count, bytes, file, sha256, prev_sha256"
_ROWS = (
    'SELECT "offset", type, payload, metadata, source, idempotency_key, created_at,'
    " coalesce(payload_version, 1) FROM streamkit_events"
    ' WHERE path = ? AND "offset" > ? AND "offset" <= ? ORDER BY "offset" LIMIT ?'
)

_WINDOW = f"SELECT {KEY_WINDOW_COLUMNS} FROM streamkit_key_windows WHERE path = ?"
# A key's row records its event's created_at only once retention took the event.
_EXPIRED = (
    "SELECT key FROM streamkit_keys WHERE path = ? AND created_at IS NOT NULL"
    " AND created_at < ? ORDER BY created_at LIMIT ?"
)
_FORGET_KEY = (
    "DELETE FROM streamkit_keys WHERE path = ? AND key = ? AND created_at IS NOT NULL"
    " AND created_at < ?"
)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {
        str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }


_RAISE_HEAD = (
    'UPDATE streamkit_heads SET head = max(head, coalesce((SELECT max("offset") '
    "FROM streamkit_events WHERE path = ?1), 0)) WHERE path = ?1"
)


class SqliteRetentionRows:
    """The retention rows of a SQLite log (see :class:`~streamkit.backends._retention.rules.RetentionRows`)."""

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
        starts = {
            str(path): int(through) + 1
            for path, through in conn.execute(
                "SELECT path, truncated_through FROM streamkit_heads WHERE truncated_through > 0"
            )
        }
        archived = {
            str(path): (int(count), int(size))
            for path, count, size in conn.execute(
                "SELECT path, count(*), sum(bytes) FROM streamkit_segments GROUP BY path"
            )
        }
        windows = {
            str(path): float(keep)
            for path, keep in conn.execute("SELECT path, keep_for FROM streamkit_key_windows")
        }
        return RetentionFacts(stream_heads(conn), rows, holds, running, starts, archived, windows)

    @staticmethod
    def key_window(conn: sqlite3.Connection, path: str) -> KeyWindow | None:
        found = conn.execute(_WINDOW, (path,)).fetchone()
        return None if found is None else key_window_of(found)

    @staticmethod
    def put_key_window(conn: sqlite3.Connection, path: str, window: KeyWindow | None) -> None:
        conn.execute("DELETE FROM streamkit_key_windows WHERE path = ?", (path,))
        if window is not None:
            conn.execute(
                f"INSERT INTO streamkit_key_windows ({KEY_WINDOW_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                (path, window.keep_for, window.set_by, window.reason, window.set_at),
            )

    @staticmethod
    def expired_keys(conn: sqlite3.Connection, path: str, before: str, limit: int) -> list[str]:
        return [str(key) for (key,) in conn.execute(_EXPIRED, (path, before, limit))]

    @staticmethod
    def forget_keys(conn: sqlite3.Connection, path: str, keys: list[str], before: str) -> int:
        forgotten = 0
        for key in keys:
            forgotten += conn.execute(_FORGET_KEY, (path, key, before)).rowcount
        return forgotten

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
            hold_values(hold),
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

    @staticmethod
    def truncated_through(conn: sqlite3.Connection, path: str) -> int:
        row = conn.execute(
            "SELECT truncated_through FROM streamkit_heads WHERE path = ?", (path,)
        ).fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def segments(conn: sqlite3.Connection, path: str | None) -> list[Segment]:
        where, args = ("", ()) if path is None else (" WHERE path = ?", (path,))
        found = conn.execute(
            f"SELECT {_SEGMENT_COLUMNS} FROM streamkit_segments{where} ORDER BY path, first_offset",
            args,
        )
        return [segment_of(row) for row in found]

    @staticmethod
    def stored_rows(
        conn: sqlite3.Connection, path: str, after: int, through: int, limit: int
    ) -> list[Row]:
        return [tuple(row) for row in conn.execute(_ROWS, (path, after, through, limit))]

    @staticmethod
    def reclaim_step(conn: sqlite3.Connection) -> int:
        return reclaim_step(conn)

    @classmethod
    def take(cls, conn: sqlite3.Connection, cut: Cut) -> int:
        # The log's write transaction excludes every other writer: no second run gets here.
        check_start_unmoved(cut, cls.truncated_through(conn, cut.path))
        segment = cut.segment
        if segment is not None:
            conn.execute(
                f"INSERT INTO streamkit_segments ({_SEGMENT_COLUMNS}, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                segment_values(segment),
            )
        conn.executemany(
            "UPDATE streamkit_keys SET body_sha256 = ?, created_at = ? WHERE path = ? AND key = ?"
            ' AND "offset" = ?',
            [(sha, at, cut.path, key, offset) for key, offset, sha, at in cut.keys],
        )
        # The heads row first up to the newest row: every row deleted below lies under it,
        # so the trigger that keeps deleted offsets (_layout.HEADS_TRIGGER) does nothing.
        conn.execute(_RAISE_HEAD, (cut.path,))
        # The summary counts every row of the path before any goes: what a deleted chunk
        # takes out (move_start) and what an archived one keeps counted are in its rows.
        settle(conn, cut.path)
        deleted = conn.execute(
            'DELETE FROM streamkit_events WHERE path = ? AND "offset" > ? AND "offset" <= ?',
            (cut.path, cut.after, cut.through),
        ).rowcount
        return int(deleted)

    @staticmethod
    def move_start(conn: sqlite3.Connection, cut: Cut) -> None:
        # A row left at 0 events stays (reads leave it out): a writer that saw it made
        # inserts it no more (see ._summary).
        conn.executemany(
            "UPDATE streamkit_type_summary SET events = events - ?,"
            " first_offset = max(first_offset, ?) WHERE path = ? AND type = ? AND version = ?",
            [(n, cut.through + 1, cut.path, t, v) for (t, v), n in cut.types.items()],
        )
        conn.execute(
            "UPDATE streamkit_heads SET truncated_through = ? WHERE path = ?",
            (cut.through, cut.path),
        )


RECLAIM_STEP = 500
"""Pages one step of :func:`reclaim_step` frees (2 MB of 4 KiB pages: a few ms of writing)."""
_INCREMENTAL = 2


def reclaim_step(conn: sqlite3.Connection, step: int = RECLAIM_STEP) -> int:
    """Inside the log's write transaction: ``PRAGMA incremental_vacuum`` of ``step`` pages.

    The pages it gave back (0: none are free, or none could be now). A run
    repeats it, each step a transaction of the log's own writer, in order
    with appends: a connection of its own would wait on the file lock with
    SQLite's busy backoff and lose every race to a steady append load (it
    was starved for minutes). A file made before incremental vacuum
    (``auto_vacuum`` not INCREMENTAL) is left alone: it needs the offline
    ``VACUUM`` of docs/log.md. The pages leave the file at the writer's next
    checkpoint.
    """
    if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) != _INCREMENTAL:
        return 0
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    if free == 0:
        return 0
    conn.execute(f"PRAGMA incremental_vacuum({int(step)})").fetchall()
    left = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    return max(0, free - left)


ROWS = SqliteRetentionRows()

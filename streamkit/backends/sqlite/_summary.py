"""The summary of stored types on SQLite: a row per (path, type, version), settled in steps.

What it guarantees: :func:`~streamkit.backends.sqlite._read.stored_types` is
exact after every commit, the counts of archived events included, as
:mod:`streamkit.backends._stored_types` promises. How, without moving a row
in every commit:

- **The row exists from the first event on.** The commit that stores the
  first event of a (path, type, version) inserts its row if absent, in the
  same transaction (``events`` 0, its offset as first and last); the writer
  remembers the keys it saw committed and inserts nothing for them again.
  A writer that restarts remembers nothing and inserts-if-absent again. A
  row is never deleted (a retention cut that takes every event of a key
  leaves it at ``events`` 0, which reads leave out), so what a writer
  remembers stays true.
- **Counts are settled in steps.** Each path's heads row says through which
  offset the rows count its events (``summarized_through``); a read adds
  what the events table holds past that mark (an ordered walk of the
  primary key from it, so at most :data:`SETTLE_EVERY` rows a path as long
  as the writer keeps settling). A commit that takes a path
  :data:`SETTLE_EVERY` or more offsets past its mark settles it in the same
  transaction: one grouped upsert of the rows past the mark, then the mark
  moves to the newest row.
- **A retention cut settles its path first** (in its transaction, before it
  deletes), so the counts it takes out, and the archived events that stay
  counted, are all in the rows.

A speed trick: under ``STREAMKIT_PLAIN=1`` every commit settles the paths it
stored to (the summary moves in every commit, as before this part), with the
same reads and the same outcomes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from streamkit._speed import FAST
from streamkit.backends._stored_types import SummaryRow

__all__ = ["SETTLE", "SETTLE_EVERY", "TypeSummary", "settle"]

SETTLE_EVERY = 1024
"""Offsets a path may run past its settled mark before a commit settles it (reads scan at
most about this many rows a path past the rows; each settle reads that many once)."""

_FIRST = (
    "INSERT INTO streamkit_type_summary (path, type, version, events, first_offset, last_offset)"
    " VALUES (?, ?, ?, 0, ?, ?) ON CONFLICT (path, type, version) DO NOTHING"
)
"""A key's row, if it has none yet: its events are counted by reads until a settle."""

SETTLE = (
    """
INSERT INTO streamkit_type_summary (path, type, version, events, first_offset, last_offset)
SELECT path, type, coalesce(payload_version, 1), count(*), min("offset"), max("offset")
FROM streamkit_events
WHERE path = ?1 AND "offset" > (SELECT summarized_through FROM streamkit_heads WHERE path = ?1)
GROUP BY type, coalesce(payload_version, 1)
ON CONFLICT (path, type, version) DO UPDATE SET
    events = events + excluded.events,
    first_offset = CASE WHEN events > 0 THEN min(first_offset, excluded.first_offset)
        ELSE excluded.first_offset END,
    last_offset = CASE WHEN events > 0 THEN max(last_offset, excluded.last_offset)
        ELSE excluded.last_offset END
""",
    """
UPDATE streamkit_heads SET summarized_through = max(summarized_through,
    coalesce((SELECT max("offset") FROM streamkit_events WHERE path = ?1), 0))
WHERE path = ?1
""",
)
"""The rows of ``path`` moved by every event past its mark, then the mark to its newest row."""

_MARK = "SELECT summarized_through FROM streamkit_heads WHERE path = ?"


def settle(conn: sqlite3.Connection, path: str) -> None:
    """Count ``path``'s events past its mark into its rows (in the caller's write transaction)."""
    for statement in SETTLE:
        conn.execute(statement, (path,))


class TypeSummary:
    """One writer's part of the summary: the keys it knows have rows, each path's mark.

    :meth:`stage` runs inside a commit's transaction; :meth:`committed` takes
    in what it staged once the commit landed, :meth:`forget` drops
    everything after a failure (the transaction may be undone).
    """

    __slots__ = ("_every", "_known", "_marks", "_staged_keys", "_staged_marks")

    def __init__(self, every: int | None = None) -> None:
        self._every = (SETTLE_EVERY if FAST else 1) if every is None else every
        self._known: set[tuple[str, str, int]] = set()
        self._marks: dict[str, int] = {}
        self._staged_keys: list[tuple[str, str, int]] = []
        self._staged_marks: dict[str, int] = {}

    def stage(self, conn: sqlite3.Connection, summary: Sequence[SummaryRow]) -> None:
        """What a commit that stored ``summary`` (a group's rows) writes of the summary.

        After the commit's heads rows: a path's first commit makes its row here.
        """
        known, every = self._known, self._every
        staged_keys = self._staged_keys
        staged_keys.clear()
        self._staged_marks.clear()
        last: dict[str, int] = {}
        for path, type_, version, _count, first, newest in summary:
            key = (path, type_, version)
            if key not in known and every > 1:
                conn.execute(_FIRST, (path, type_, version, first, first))
                staged_keys.append(key)
            if newest > last.get(path, 0):
                last[path] = newest
        for path, newest in last.items():
            mark = self._marks.get(path)
            if mark is None:
                row = conn.execute(_MARK, (path,)).fetchone()
                mark = 0 if row is None else int(row[0])
            if newest - mark >= every:
                settle(conn, path)
                mark = newest
            self._staged_marks[path] = mark

    def committed(self) -> None:
        """The commit of the last :meth:`stage` landed: its keys have rows, its marks hold."""
        self._known.update(self._staged_keys)
        self._marks.update(self._staged_marks)

    def forget(self) -> None:
        """A commit failed or another process may have moved the marks: know nothing."""
        self._known.clear()
        self._marks.clear()

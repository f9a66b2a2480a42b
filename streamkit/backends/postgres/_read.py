"""Reading committed events out of PostgreSQL, one statement per page.

A page is ONE ``SELECT``, so it sees one snapshot: under READ COMMITTED a
statement never sees part of a commit, and since offsets of a path become
visible in offset order (:mod:`._offsets`), nothing can later appear below
the last row a page found. The proof is the shared rule
(:func:`~streamkit.backends._stored.page_of`).

The byte budget is counted by the server (a running sum of the payload and
metadata lengths), so a page of large events never ships rows past its cut.
"""

from __future__ import annotations

from typing import Any

import psycopg

from streamkit._requests import PageRead
from streamkit.backends._keys import KeptKey
from streamkit.backends._retention.segments import archive_page, archived_event, segment_of
from streamkit.backends._stored import MAX_PAGE_BYTES, decode_rows, page_of
from streamkit.backends._stored_types import stored_type
from streamkit.events import ReadPage, StreamEvent
from streamkit.history import history_truncated
from streamkit.records import StoredType

__all__ = ["Reads"]

_COLUMNS = (
    '"offset", type, payload, metadata, source, idempotency_key, created_at, '
    "coalesce(payload_version, 1) AS payload_version"
)


class Reads:
    """The read statements of one schema."""

    def __init__(self, schema: str) -> None:
        s = f'"{schema}"'
        # Rows in (after, upto], each with the stored JSON of the rows BEFORE it: a
        # row starts within the budget when that sum does, so the page's last row
        # (the one that may cross the budget) is the first past which nothing is sent.
        self._page = f"""
            SELECT {_COLUMNS}, before FROM (
                SELECT {_COLUMNS}, coalesce(sum(length(payload) + length(metadata)) OVER (
                    ORDER BY "offset" ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                    AS before
                FROM {s}.streamkit_events
                WHERE path = %(path)s AND "offset" > %(after)s AND "offset" <= %(upto)s
                AND %(after)s >= coalesce((SELECT truncated_through FROM {s}.streamkit_heads
                    WHERE path = %(path)s), 0)
                ORDER BY "offset" LIMIT %(limit)s
            ) page WHERE before <= %(budget)s ORDER BY "offset"
        """
        # (A read below the path's start gets no row: the archive or HISTORY_TRUNCATED
        # answers it, without the rows after the start, often the many
        # streamkit.truncated records of the runs that moved it, read for nothing.)
        # The heads row, which no deletion moves back (as on SQLite, a row written by
        # hand past it counts too).
        self._head = (
            f"SELECT greatest((SELECT head FROM {s}.streamkit_heads WHERE path = %(path)s), "
            f'(SELECT max("offset") FROM {s}.streamkit_events WHERE path = %(path)s))'
        )
        self._truncated = f"SELECT truncated_through FROM {s}.streamkit_heads WHERE path = %s"
        self._segment_files = (
            f"SELECT file, first_offset, last_offset FROM {s}.streamkit_segments "
            "WHERE path = %s ORDER BY first_offset"
        )
        # The segment that may hold ``after + 1`` (segments never overlap): one index probe.
        self._segment_at = (
            "SELECT path, first_offset, last_offset, count, bytes, file, sha256, prev_sha256 "
            f"FROM {s}.streamkit_segments WHERE path = %s AND first_offset <= %s "
            "ORDER BY first_offset DESC LIMIT 1"
        )
        self._key = (
            'SELECT k."offset", k.body_sha256, k.created_at, e."offset", e.type, e.payload, '
            "e.metadata, e.source, e.idempotency_key, e.created_at, "
            f"coalesce(e.payload_version, 1) FROM {s}.streamkit_keys AS k "
            f"LEFT JOIN {s}.streamkit_events AS e "
            'ON e.path = k.path AND e."offset" = k."offset" WHERE k.path = %s AND k.key = %s'
        )
        # One heads row per path, its committed head above 0 once a durable event
        # is; sorted by bytes, as the SQLite backend sorts.
        self._paths = (
            f'SELECT path FROM {s}.streamkit_heads WHERE head > 0 ORDER BY path COLLATE "C"'
        )
        self._stored_types = (
            f"SELECT path, type, version, events, first_offset, last_offset "
            f"FROM {s}.streamkit_stored_types"
        )
        self._claims = (
            f"SELECT slug, due_at FROM {s}.streamkit_claims WHERE path = %s ORDER BY slug"
        )

    def page_sized(
        self, conn: psycopg.Connection[Any], read: PageRead, max_bytes: int = MAX_PAGE_BYTES
    ) -> tuple[ReadPage, int]:
        """The page ``read`` asks for (``(after, upto]``, at most ``limit``), and its JSON bytes.

        Below the path's start: the archive's page with ``archive``, else
        HistoryTruncated (:mod:`streamkit.history`).
        """
        path, after, limit, upto = read.path, read.after, read.limit, read.upto
        types, archive = read.types, read.archive
        found = conn.execute(
            self._page,
            {
                "path": path,
                "after": after,
                "upto": 2**63 - 1 if upto is None else upto,
                "limit": limit + 1,
                "budget": max_bytes,
            },
        ).fetchall()
        rows: list[Any] = []
        size = 0
        full = False
        for row in found:
            row_size = len(row[2]) + len(row[3])
            if len(rows) == limit or (rows and size + row_size > max_bytes):
                full = True
                break
            rows.append(row[:8])
            size += row_size
        if not rows or rows[0][0] != after + 1:
            # Only a page that does not begin right after ``after`` can have stepped over a cut.
            row = conn.execute(self._truncated, (path,)).fetchone()
            through = 0 if row is None else int(row[0])
            if after < through:
                at = [segment_of(r) for r in conn.execute(self._segment_at, (path, after + 1))]
                page = archive_page(at, path, after, limit, upto, types) if archive else None
                if page is None:
                    files = [
                        (str(r[0]), int(r[1]), int(r[2]))
                        for r in conn.execute(self._segment_files, (path,))
                    ]
                    raise history_truncated(path, after, through, files)
                return page, 0
        return page_of(path, rows, after, upto, full, types), size

    def head(self, conn: psycopg.Connection[Any], path: str) -> int:
        """The highest offset a durable event of ``path`` ever took (0 if none was stored)."""
        row = conn.execute(self._head, {"path": path}).fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def key(
        self, conn: psycopg.Connection[Any], path: str, key: str
    ) -> StreamEvent | KeptKey | None:
        """The committed event of ``path`` an idempotency key names, what its row kept if the
        event is no longer stored (:mod:`streamkit.backends._keys`), or None for a new key."""
        row = conn.execute(self._key, (path, key)).fetchone()
        if row is None:
            return None
        if row[3] is None:
            offset = int(row[0])
            segment_at = self._segment_at

            def archived() -> StreamEvent | None:
                at = [segment_of(r) for r in conn.execute(segment_at, (path, offset))]
                return archived_event(at, path, offset)

            return KeptKey(offset, row[1], row[2], archived)
        return decode_rows(path, [row[3:]])[0]

    def paths(self, conn: psycopg.Connection[Any]) -> list[str]:
        """Every path holding at least one durable event, sorted."""
        return [str(row[0]) for row in conn.execute(self._paths).fetchall()]

    def stored_types(self, conn: psycopg.Connection[Any], path: str | None) -> list[StoredType]:
        """The summary of stored types (of ``path`` only if given), sorted: no scan of the events."""
        if path is None:
            rows = conn.execute(
                self._stored_types + ' ORDER BY path COLLATE "C", type COLLATE "C", version'
            )
        else:
            rows = conn.execute(
                self._stored_types + ' WHERE path = %s ORDER BY type COLLATE "C", version',
                (path,),
            )
        return [stored_type(row) for row in rows]

    def claims(self, conn: psycopg.Connection[Any], path: str) -> dict[str, float]:
        """Every claim on ``path``: claimant -> due epoch second."""
        return {str(slug): float(due) for slug, due in conn.execute(self._claims, (path,))}

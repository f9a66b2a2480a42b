"""Reading committed events out of the events table, with the scanned-range proof.

These functions take a connection and run synchronously; the log decides on
which thread. Decoding builds :class:`~streamkit.events.StreamEvent` straight
from the stored JSON (no validation: it was validated before it was written),
because a catch-up read decodes every event of a stream once.

The proof follows SPEC section 2: a full page proves through its last event;
a short page proves through ``max(after, durable head)``, and since it found
nothing past its last row, that head is the last row (or at most ``after``).
"""

from __future__ import annotations

import operator
import sqlite3
from typing import Any

from streamkit._requests import PageRead
from streamkit.backends._keys import KeptKey
from streamkit.backends._retention.segments import archive_page, archived_event, segment_of
from streamkit.backends._stored import MAX_PAGE_BYTES, decode_rows, page_of
from streamkit.backends._stored_types import stored_type
from streamkit.events import ReadPage, StreamEvent
from streamkit.history import history_truncated
from streamkit.protocols import PayloadTypes
from streamkit.records import StoredType

__all__ = [
    "MAX_PAGE_BYTES",
    "check_start",
    "durable_head",
    "read_page_sized",
    "select_key",
    "stored_types",
    "stream_paths",
]

_COLUMNS = (
    '"offset", type, payload, metadata, source, idempotency_key, created_at, '
    "coalesce(payload_version, 1) AS payload_version"
)
_PAGE = (
    f"SELECT {_COLUMNS} FROM streamkit_events "
    'WHERE path = ? AND "offset" > ? ORDER BY "offset" LIMIT ?'
)
_PAGE_BOUNDED = (
    f"SELECT {_COLUMNS} FROM streamkit_events "
    'WHERE path = ? AND "offset" > ? AND "offset" <= ? ORDER BY "offset" LIMIT ?'
)
# The heads row, which no deletion moves back; the last row too, so that a row
# written by hand past it can never be handed its offset again either.
_HEAD = (
    "SELECT max(coalesce((SELECT head FROM streamkit_heads WHERE path = ?1), 0), "
    'coalesce((SELECT max("offset") FROM streamkit_events WHERE path = ?1), 0))'
)
_KEY = (
    'SELECT k."offset", k.body_sha256, k.created_at, e."offset", e.type, e.payload, '
    "e.metadata, e.source, e.idempotency_key, e.created_at, coalesce(e.payload_version, 1) "
    'FROM streamkit_keys AS k LEFT JOIN streamkit_events AS e ON e.path = k.path AND e."offset" = '
    'k."offset" WHERE k.path = ? AND k.key = ?'
)
_TRUNCATED = "SELECT truncated_through FROM streamkit_heads WHERE path = ?"
_SEGMENT_FILES = (
    "SELECT file, first_offset, last_offset FROM streamkit_segments WHERE path = ? "
    "ORDER BY first_offset"
)
# The segment that may hold ``after + 1``: the last one starting at or before it (segments
# never overlap). One index probe per page, however many segments the path has.
_SEGMENT_AT = (
    "SELECT path, first_offset, last_offset, count, bytes, file, sha256, prev_sha256"
    " FROM streamkit_segments WHERE path = ? AND first_offset <= ?"
    " ORDER BY first_offset DESC LIMIT 1"
)
# A path is a stream once a durable event was stored in it (its head moved past 0).
_PATHS = "SELECT path FROM streamkit_heads WHERE head > 0 ORDER BY path"
# The rows, plus what each path holds past its settled mark (see ._summary): a walk of
# the primary key from the mark on, per path.
_STORED_TYPES = """
SELECT path, type, version, sum(events), min(first_offset), max(last_offset) FROM (
    SELECT path, type, version, events,
        CASE WHEN events > 0 THEN first_offset END AS first_offset,
        CASE WHEN events > 0 THEN last_offset END AS last_offset
    FROM streamkit_type_summary
    WHERE {where}
    UNION ALL
    SELECT e.path, e.type, coalesce(e.payload_version, 1), count(*), min(e."offset"),
        max(e."offset")
    FROM streamkit_heads h JOIN streamkit_events e
        ON e.path = h.path AND e."offset" > h.summarized_through
    WHERE {where_h}
    GROUP BY e.path, e.type, coalesce(e.payload_version, 1)
)
GROUP BY path, type, version HAVING sum(events) > 0 ORDER BY path, type, version
"""
_ALL_STORED_TYPES = _STORED_TYPES.format(where="1", where_h="1")
_PATH_STORED_TYPES = _STORED_TYPES.format(where="path = ?1", where_h="h.path = ?1")


# Rows fetched at a time, first and at most: a page of large events never holds
# many rows past its cut in memory, and one of small events takes few calls.
_FIRST_FETCH = 16
_MAX_FETCH = 512
_payload = operator.itemgetter(2)
_metadata = operator.itemgetter(3)


def read_page_sized(
    conn: sqlite3.Connection, read: PageRead, max_bytes: int = MAX_PAGE_BYTES
) -> tuple[ReadPage, int]:
    """The page ``read`` asks for, and the bytes of stored JSON (payload and metadata) it holds.

    The page holds the durable events in ``(after, upto]`` (``upto=None``: no
    bound), at most ``limit``.
    A page also stops before the event that would take its stored payload
    and metadata JSON past ``max_bytes``; its first event is always
    in it. A page cut short, by ``limit`` or by bytes, proves through its last
    event with ``at_head`` False. One extra row is fetched to learn whether a
    full page ends at the head, so a read costs one query. With ``upto`` the
    short-page proof is ``upto`` itself: the caller already knows nothing
    durable lies between the head and ``upto``.
    """
    path, after, limit, upto = read.path, read.after, read.limit, read.upto
    types, archive = read.types, read.archive
    if upto is None:
        cursor = conn.execute(_PAGE, (path, after, limit + 1))
    else:
        cursor = conn.execute(_PAGE_BOUNDED, (path, after, upto, limit + 1))
    rows: list[Any] = []
    size = 0
    full = False
    fetch = _FIRST_FETCH
    largest = 0
    wanted = limit + 1
    checked = False
    try:
        while len(rows) < wanted:
            chunk = cursor.fetchmany(min(fetch, wanted - len(rows)))
            if not chunk:
                break
            if not rows and chunk[0][0] != after + 1:
                # Only a page that does not begin right after ``after`` can have stepped
                # over a cut: looked at now, before the rest of a page that the archive
                # may answer instead (a path's start is often followed by the many
                # streamkit.truncated records of the runs that moved it).
                checked = True
                archived = check_start(conn, path, after, limit, upto, types, archive)
                if archived is not None:
                    return archived, 0
            # Counted at C speed (the JSON texts' lengths); the source, small by
            # nature, is left out of the count.
            payloads = list(map(len, map(_payload, chunk)))
            chunk_size = sum(payloads) + sum(map(len, map(_metadata, chunk)))
            if size + chunk_size <= max_bytes:
                rows.extend(chunk)
                size += chunk_size
                # As many rows next as the budget left holds at the largest payload
                # seen: many when events are small, one or two when they are huge.
                largest = max(largest, max(payloads))
                fetch = max(1, min(_MAX_FETCH, (max_bytes - size) // (largest + 1)))
                continue
            for row in chunk:  # the page ends inside this chunk: find the cut
                row_size = len(row[2]) + len(row[3])
                if rows and size + row_size > max_bytes:
                    full = True
                    break
                rows.append(row)
                size += row_size
            if full:
                break
    finally:
        cursor.close()
    if len(rows) > limit:
        del rows[limit:]
        full = True
    if not rows and not checked:
        archived = check_start(conn, path, after, limit, upto, types, archive)
        if archived is not None:
            return archived, 0
    return page_of(path, rows, after, upto, full, types), size


def check_start(
    conn: sqlite3.Connection,
    path: str,
    after: int,
    limit: int,
    upto: int | None,
    types: PayloadTypes | None,
    archive: bool,
) -> ReadPage | None:
    """Below ``path``'s start: the archive's page (``archive``), else HistoryTruncated.

    None when the read begins at or past the start.
    """
    row = conn.execute(_TRUNCATED, (path,)).fetchone()
    through = 0 if row is None else int(row[0])
    if after >= through:
        return None
    at = [segment_of(r) for r in conn.execute(_SEGMENT_AT, (path, after + 1))]
    page = archive_page(at, path, after, limit, upto, types) if archive else None
    if page is None:
        files = [(str(r[0]), int(r[1]), int(r[2])) for r in conn.execute(_SEGMENT_FILES, (path,))]
        raise history_truncated(path, after, through, files)
    return page


def durable_head(conn: sqlite3.Connection, path: str) -> int:
    """The highest offset a durable event of ``path`` ever took (0 if none was stored).

    Kept in the path's heads row by every commit, so rows deleted since (by
    hand, or one day by retention) never bring it back down.
    """
    row = conn.execute(_HEAD, (path,)).fetchone()
    return int(row[0])


def select_key(conn: sqlite3.Connection, path: str, key: str) -> StreamEvent | KeptKey | None:
    """The committed event of ``path`` an idempotency key names, what its row kept if the
    event is no longer stored (:mod:`streamkit.backends._keys`), or None for a new key."""
    row = conn.execute(_KEY, (path, key)).fetchone()
    if row is None:
        return None
    if row[3] is None:
        offset = int(row[0])

        def archived() -> StreamEvent | None:
            at = [segment_of(r) for r in conn.execute(_SEGMENT_AT, (path, offset))]
            return archived_event(at, path, offset)

        return KeptKey(offset, row[1], row[2], archived)
    return decode_rows(path, [row[3:]])[0]


def stream_paths(conn: sqlite3.Connection) -> list[str]:
    """Every stream path that ever stored a durable event, sorted."""
    return [row[0] for row in conn.execute(_PATHS).fetchall()]


def stored_types(conn: sqlite3.Connection, path: str | None = None) -> list[StoredType]:
    """The summary of stored types (of ``path`` only if given), sorted.

    Its rows and each path's events past its settled mark (:mod:`._summary`):
    no scan of the rest of the log.
    """
    if path is None:
        rows = conn.execute(_ALL_STORED_TYPES)
    else:
        rows = conn.execute(_PATH_STORED_TYPES, (path,))
    return [stored_type(row) for row in rows]

"""Operator skips: moving a stalled processor past one event, with the decision in the log.

A skip is two records written in ONE transaction. The durable event
``streamkit.event-skipped`` (payload ``{slug, offset, by, reason}``) on the
processor's stream path says who skipped what and why, for anyone reading
the log later. A row in ``streamkit_skips`` beside it names the skip event's
own offset, and lets a host load every skip at start without scanning the log.

Only :func:`record_skip` (``ProcessorHost.skip``, ``streamkit skip``) writes
them: the ``streamkit.`` type namespace is refused to every ordinary append,
and a host honours a skip event only if its row, naming that very event, is
there (:func:`verified_skip`). A forged skip event, from a log written before
the namespace was reserved say, is ignored and logged. A retried skip
appends nothing new (an idempotency key), and the row is written with it.

A host applies a skip the moment it sees the event in its stream (from any
process), so a running processor needs no restart. A skipped event is hidden
from that one processor only: its reads and pushes never contain it, and its
cursor moves past it by the scanned range as usual.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from streamkit.checkpoint import DEFAULT_CHECKPOINT_TABLE, ReduceCheckpointTable
from streamkit.errors import InvalidRequest
from streamkit.events import ReadPage, StreamEvent
from streamkit.log import Log

__all__ = [
    "SKIP_EVENT",
    "SKIP_TABLE",
    "ensure_skip_table",
    "filter_page",
    "load_skips",
    "record_skip",
    "skip_of",
    "verified_skip",
    "without_skipped",
]

SKIP_EVENT = "streamkit.event-skipped"
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


def _insert(conn: sqlite3.Connection, path: str, slug: str, offset: int, at: int) -> None:
    ensure_skip_table(conn)
    conn.execute(
        f'INSERT OR IGNORE INTO {SKIP_TABLE} (path, slug, "offset", skip_event_offset)'
        " VALUES (?, ?, ?, ?)",
        (path, slug, offset, at),
    )


async def load_skips(log: Log) -> dict[tuple[str, str], set[int]]:
    """Every recorded skip: ``(path, slug) -> {offsets}`` (empty if the table is missing)."""

    def read(conn: sqlite3.Connection) -> dict[tuple[str, str], set[int]]:
        found = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SKIP_TABLE,)
        ).fetchone()
        skips: dict[tuple[str, str], set[int]] = {}
        if found is None:
            return skips
        for path, slug, offset in conn.execute(
            f'SELECT path, slug, "offset" FROM {SKIP_TABLE}'
        ).fetchall():
            skips.setdefault((str(path), str(slug)), set()).add(int(offset))
        return skips

    return await log.query(read)


def skip_of(event: StreamEvent) -> tuple[str, int] | None:
    """``(slug, offset)`` if ``event`` is a well-formed durable skip record, else None."""
    if event.type != SKIP_EVENT or event.ephemeral:
        return None
    payload = event.payload
    if not isinstance(payload, dict):
        return None
    slug, offset = payload.get("slug"), payload.get("offset")
    if not isinstance(slug, str) or isinstance(offset, bool) or not isinstance(offset, int):
        return None
    return slug, offset


async def verified_skip(log: Log, event: StreamEvent) -> tuple[str, int] | None:
    """``(slug, offset)`` of a skip event written by :func:`record_skip`, else None.

    The skip's row must name this very event (its path and offset): the verb
    writes both in one transaction, so a skip event without its row did not
    come from the verb and is not obeyed.
    """
    found = skip_of(event)
    if found is None:
        return None
    slug, offset = found
    path, at = event.path, event.offset

    def read(conn: sqlite3.Connection) -> bool:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SKIP_TABLE,)
        ).fetchone()
        if exists is None:
            return False
        row = conn.execute(
            f'SELECT 1 FROM {SKIP_TABLE} WHERE path = ? AND slug = ? AND "offset" = ?'
            " AND skip_event_offset = ?",
            (path, slug, offset, at),
        ).fetchone()
        return row is not None

    return found if await log.query(read) else None


async def record_skip(
    log: Log, path: str, slug: str, offset: int, *, by: str, reason: str
) -> StreamEvent:
    """Skip the event at ``offset`` for processor ``slug`` on ``path``; return the skip event.

    Refused with :class:`~streamkit.errors.InvalidRequest` (nothing written)
    when no durable event has that offset, or the processor's checkpoint is
    already past it (there is nothing left to skip).
    """
    stream = log.stream(path)
    page = await stream.read(offset - 1, 1) if offset >= 1 else None
    if page is None or not page.events or page.events[0].offset != offset:
        raise InvalidRequest(
            f"there is no durable event at offset {offset} of {path!r} to skip for {slug!r}; "
            "nothing was written; `streamkit status` shows where the processor is stalled",
            details={"path": path, "slug": slug, "offset": offset},
        )
    checkpoint = await log.query(lambda conn: _checkpoint_cursor(conn, slug))
    if checkpoint is not None and checkpoint >= offset:
        raise InvalidRequest(
            f"processor {slug!r} is already checkpointed through offset {checkpoint}, past "
            f"{offset}; there is nothing to skip and nothing was written",
            details={"path": path, "slug": slug, "offset": offset, "cursor": checkpoint},
        )
    payload: dict[str, Any] = {"slug": slug, "offset": offset, "by": by, "reason": reason}

    def seal(conn: sqlite3.Connection, events: list[StreamEvent]) -> None:
        _insert(conn, path, slug, offset, events[0].offset)

    return await log.append_control(
        path,
        {
            "type": SKIP_EVENT,
            "payload": payload,
            "idempotency_key": f"{SKIP_EVENT}/{slug}@{offset}",
        },
        seal,
    )


def _checkpoint_cursor(conn: sqlite3.Connection, slug: str) -> int | None:
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
        (DEFAULT_CHECKPOINT_TABLE,),
    ).fetchone()
    if found is None:
        return None
    stored = ReduceCheckpointTable(conn, create_table=False).read(slug)
    return None if stored is None else stored.reduced_through_offset


def without_skipped(events: Sequence[StreamEvent], skipped: Iterable[int]) -> list[StreamEvent]:
    """``events`` minus the durable ones at a skipped offset."""
    skip = set(skipped)
    return [e for e in events if e.ephemeral or e.offset not in skip]


def filter_page(page: ReadPage, skipped: set[int]) -> ReadPage:
    """A read page minus skipped events; the scanned range (the proof) is unchanged."""
    if not skipped or not any(e.offset in skipped for e in page.events):
        return page
    return ReadPage(
        [e for e in page.events if e.offset not in skipped],
        page.scanned_through_offset,
        page.at_head,
    )

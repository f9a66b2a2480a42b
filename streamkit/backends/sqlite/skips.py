"""Operator skips: moving a stalled processor past one event, with the decision in the log.

A skip is two records written in ONE transaction. The durable event
``streamkit.event-skipped`` (payload ``{slug, offset, by, reason}``) on the
processor's stream path says who skipped what and why, for anyone reading
the log later. A row in ``streamkit_skips`` beside it names the skip event's
own offset, and lets a host load every skip at start without scanning the log.

Only :func:`record_skip` (``ProcessorHost.skip``, ``streamkit skip``) writes
them: the ``streamkit.`` type namespace is refused to every ordinary append,
and hosts obey the rows alone (:func:`load_skips`), so a forged skip event,
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
from typing import Any

from streamkit.backends.sqlite.checkpoints import DEFAULT_CHECKPOINT_TABLE, ReduceCheckpointTable
from streamkit.backends.sqlite.leases import LEASE_TABLE, read_lease
from streamkit.errors import InvalidRequest
from streamkit.events import MAX_OFFSET, StreamEvent
from streamkit.log._log import Log
from streamkit.skips import SKIP_EVENT

__all__ = ["SKIP_TABLE", "ensure_skip_table", "load_skips", "record_skip"]

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


async def load_skips(log: Log) -> dict[tuple[str, str], dict[int, int]]:
    """Every recorded skip: ``(path, slug) -> {offset: offset of its skip event}``.

    Empty if the table is missing (no skip was ever recorded).
    """

    def read(conn: sqlite3.Connection) -> dict[tuple[str, str], dict[int, int]]:
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

    return await log.query(read)


async def record_skip(
    log: Log, path: str, slug: str, offset: int, *, by: str, reason: str
) -> StreamEvent:
    """Skip the event at ``offset`` for processor ``slug`` on ``path``; return the skip event.

    Refused with :class:`~streamkit.errors.InvalidRequest` (nothing written)
    when the slug is empty or never ran on ``path`` here, no durable event has
    that offset, the processor's checkpoint is already past it (there is
    nothing left to skip), or it was skipped already with another ``by`` or
    ``reason`` (the message says by whom and why). The same skip again
    returns the event recorded the first time.
    """
    if isinstance(offset, bool) or not isinstance(offset, int) or not 1 <= offset <= MAX_OFFSET:
        raise InvalidRequest(
            f"the offset to skip must be an integer from 1 to {MAX_OFFSET} (2^63 - 1), got "
            f"{offset!r}; nothing was written",
            details={"path": path, "slug": slug, "offset": repr(offset)[:80]},
        )
    if not slug:
        raise InvalidRequest(
            "the processor slug to skip for is empty; name the processor (its contract slug, "
            "as `streamkit status` lists it); nothing was written",
            details={"path": path, "slug": slug, "offset": offset},
        )
    stream = log.stream(path)
    page = await stream.read(offset - 1, 1)
    if page is None or not page.events or page.events[0].offset != offset:
        raise InvalidRequest(
            f"there is no durable event at offset {offset} of {path!r} to skip for {slug!r}; "
            "nothing was written; `streamkit status` shows where the processor is stalled",
            details={"path": path, "slug": slug, "offset": offset},
        )
    earlier = await _existing_skip(log, path, slug, offset)
    if earlier is not None:
        previous = earlier.payload if isinstance(earlier.payload, dict) else {}
        if previous.get("by") == by and previous.get("reason") == reason:
            return earlier  # the same decision again: nothing new to record
        raise InvalidRequest(
            f"offset {offset} of {path!r} is already skipped for {slug!r}: by "
            f"{previous.get('by')!r}, because {previous.get('reason')!r} (recorded at offset "
            f"{earlier.offset}); a skip is recorded once, so nothing was written",
            details={
                "path": path,
                "slug": slug,
                "offset": offset,
                "by": previous.get("by"),
                "reason": previous.get("reason"),
                "recorded_at": earlier.offset,
            },
        )
    known, checkpoint = await log.query(lambda conn: _processor_facts(conn, path, slug))
    if not known:
        raise InvalidRequest(
            f"no processor {slug!r} has run on {path!r} of this log (it has no checkpoint or "
            "lease here), so there is nothing to skip for it; check the slug with `streamkit "
            "status`; nothing was written",
            details={"path": path, "slug": slug, "offset": offset},
        )
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


def _processor_facts(conn: sqlite3.Connection, path: str, slug: str) -> tuple[bool, int | None]:
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


async def _existing_skip(log: Log, path: str, slug: str, offset: int) -> StreamEvent | None:
    """The skip event already recorded for ``(path, slug, offset)``, if any."""
    at = await log.query(lambda conn: _recorded_at(conn, path, slug, offset))
    if at is None:
        return None
    page = await log.stream(path).read(at - 1, 1)
    return page.events[0] if page.events and page.events[0].offset == at else None


def _recorded_at(conn: sqlite3.Connection, path: str, slug: str, offset: int) -> int | None:
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

"""What the database alone says about processors: checkpoints, leases, claims, heads.

``streamkit status`` and ``streamkit snapshot`` use this when no host answers
on the control socket, and a running host merges its runtime view (stalled,
rates, queue) over it. Everything is read on the log's reader connection;
nothing is written. Tables a host has not created yet read as empty.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from streamkit.backends.sqlite.checkpoints import DEFAULT_CHECKPOINT_TABLE, ReduceCheckpointTable
from streamkit.backends.sqlite.leases import LEASE_TABLE, leases
from streamkit.checkpoint import shown_cursor
from streamkit.errors import InvalidRequest
from streamkit.log._log import Log

__all__ = ["checkpoint_snapshot", "durable_lag", "durable_status"]


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {
        str(row[0])
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    }


def _read(conn: sqlite3.Connection, now: float) -> list[dict[str, Any]]:
    tables = _tables(conn)
    rows: dict[tuple[str | None, str], dict[str, Any]] = {}

    def row(path: str | None, slug: str) -> dict[str, Any]:
        return rows.setdefault(
            (path, slug),
            {
                "path": path,
                "slug": slug,
                "version": None,
                "cursor": None,
                "head": None,
                "lag": None,
                "lease": None,
                "claim_due": None,
            },
        )

    if LEASE_TABLE in tables:
        for lease in leases(conn):
            data = lease.to_dict()
            data["held"] = lease.held_at(now)
            row(lease.path, lease.slug)["lease"] = data
    for path, slug, due in conn.execute("SELECT path, slug, due_at FROM streamkit_claims"):
        row(str(path), str(slug))["claim_due"] = float(due)
    if DEFAULT_CHECKPOINT_TABLE in tables:
        table = ReduceCheckpointTable(conn, create_table=False)
        for slug in table.slugs():
            checkpoint = table.read(slug)
            if checkpoint is None:
                continue
            targets = [r for (p, s), r in rows.items() if s == slug] or [row(None, slug)]
            for target in targets:
                target["version"] = checkpoint.reducer_version
                target["cursor"] = checkpoint.reduced_through_offset
    for (path, _), data in rows.items():
        if path is None:
            continue
        head = conn.execute(
            'SELECT COALESCE(MAX("offset"), 0) FROM streamkit_events WHERE path = ?', (path,)
        ).fetchone()[0]
        data["head"] = int(head)
        cursor = data["cursor"]
        data["lag"] = durable_lag(conn, path, cursor or 0)
        data["cursor"] = shown_cursor(cursor, int(head))
    return sorted(rows.values(), key=lambda r: (r["path"] or "", r["slug"]))


def durable_lag(conn: sqlite3.Connection, path: str, cursor: int) -> int:
    """How many durable events of ``path`` lie past ``cursor``: the lag, in events.

    Not ``head - cursor``: offsets taken by ephemerals (live-state deltas) and
    reserved blocks leave holes, which are no work for anybody.
    """
    row = conn.execute(
        'SELECT count(*) FROM streamkit_events WHERE path = ? AND "offset" > ?', (path, cursor)
    ).fetchone()
    return int(row[0])


async def durable_status(log: Log, now: float | None = None) -> list[dict[str, Any]]:
    """One row per known (path, slug): version, cursor, head, lag, lease and claim."""
    at = time.time() if now is None else now
    return await log.query(lambda conn: _read(conn, at))


async def checkpoint_snapshot(log: Log, slug: str) -> dict[str, Any]:
    """``{offset, state, version, source: "checkpoint"}`` of ``slug`` from its stored checkpoint."""

    def read(conn: sqlite3.Connection) -> Any:
        if DEFAULT_CHECKPOINT_TABLE not in _tables(conn):
            return None
        return ReduceCheckpointTable(conn, create_table=False).read(slug)

    checkpoint = await log.query(read)
    if checkpoint is None:
        raise InvalidRequest(
            f"processor {slug!r} has no checkpoint in this log (it never ran here, or the slug "
            "is misspelt); nothing was read",
            details={"slug": slug},
        )
    state = None if checkpoint.state_json is None else json.loads(checkpoint.state_json)
    return {
        "offset": checkpoint.reduced_through_offset,
        "state": state,
        "version": checkpoint.reducer_version,
        "source": "checkpoint",
    }

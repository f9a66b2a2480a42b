"""Retention's reads and verbs, whatever the backend: horizons, holds, forgetting a processor.

:func:`horizons` reads in one query every checkpoint row's needs, every hold
and every path's head, and applies the rule of :mod:`streamkit.horizon`.
:func:`place_hold`, :func:`release_hold` and :func:`forget_processor` check
what they are asked before anything is written, then append their control
event with the record sealed into the same transaction: a refusal found
inside it (a hold of that name placed meanwhile, say) rolls both back. A
backend supplies the table operations (:class:`RetentionRows`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from streamkit._requests import Connection
from streamkit.errors import InvalidRequest, NotFound
from streamkit.events import StreamEvent, validate_path
from streamkit.holds import HOLD_PLACED, HOLD_RELEASED, PROCESSOR_FORGOTTEN, check_reason
from streamkit.horizon import (
    CheckpointNeed,
    Hold,
    Horizon,
    abandoned_if_gone,
    horizon_of,
    needs_of,
)
from streamkit.log import Log

__all__ = [
    "HOLD_COLUMNS",
    "NEED_COLUMNS",
    "RetentionFacts",
    "RetentionRows",
    "forget_processor",
    "hold_of",
    "hold_values",
    "horizon_in",
    "horizons",
    "need_of",
    "place_hold",
    "release_hold",
]

NEED_COLUMNS = (
    "path, slug, reducer_version, reduced_through_offset, state_offset, retain_from, serving, "
    "retired_at"
)
"""The checkpoint columns the horizon reads, in the order :func:`need_of` takes them."""

HOLD_COLUMNS = "path, name, from_offset, until, placed_by, reason, placed_at"
"""The columns of a hold's row, in the order :func:`hold_of` takes them."""


def need_of(row: Any) -> CheckpointNeed:
    """A checkpoint row's needs, from its :data:`NEED_COLUMNS`."""
    path, slug, version, cursor, state_offset, retain_from, serving, retired_at = row
    return CheckpointNeed(
        None if path is None else str(path),
        str(slug),
        str(version),
        int(cursor),
        None if state_offset is None else int(state_offset),
        None if retain_from is None else int(retain_from),
        bool(serving),
        None if retired_at is None else int(retired_at),
    )


def hold_values(hold: Hold) -> tuple[str, str, int, float | None, str, str, float]:
    """A hold's row, in the order of :data:`HOLD_COLUMNS`."""
    return (
        hold.path,
        hold.name,
        hold.from_offset,
        hold.until,
        hold.placed_by,
        hold.reason,
        hold.placed_at,
    )


def hold_of(row: Any) -> Hold:
    """A hold, from its row's :data:`HOLD_COLUMNS`."""
    path, name, from_offset, until, by, reason, placed_at = row
    return Hold(
        str(path),
        str(name),
        int(from_offset),
        None if until is None else float(until),
        str(by),
        str(reason),
        float(placed_at),
    )


class RetentionFacts(NamedTuple):
    """What the horizon rule reads, as of one moment of the log."""

    heads: list[tuple[str, int]]
    rows: list[CheckpointNeed]
    holds: list[Hold]
    running: list[str]
    """``slug@path`` of every processor a registered host (alive or not) said it runs."""
    starts: dict[str, int]
    """Each path's first offset still held, where retention took some."""
    archived: dict[str, tuple[int, int]]
    """Each path's archive: its recorded segments and their bytes."""
    windows: dict[str, float]
    """Each path's key window in seconds, where one is set (elsewhere: forever)."""


class RetentionRows(Protocol):
    """Where a backend keeps checkpoints, holds and heads, on a connection."""

    def facts(self, conn: Connection) -> RetentionFacts:
        """Every path's head, every checkpoint row's needs, every hold, what hosts run."""
        ...

    def insert_hold(self, conn: Connection, hold: Hold) -> Hold | None:
        """Insert ``hold`` unless one of its name is on its path: then return that one."""
        ...

    def delete_hold(self, conn: Connection, path: str, name: str) -> Hold | None:
        """Delete the hold ``name`` of ``path``; the hold deleted, or None if there was none."""
        ...

    def delete_checkpoints(
        self, conn: Connection, slug: str, version: str | None
    ) -> list[CheckpointNeed]:
        """Delete ``slug``'s checkpoint rows (of ``version`` only, if given); the rows deleted."""
        ...


def horizon_in(facts: RetentionFacts, path: str, now: float) -> Horizon:
    """The horizon of ``path`` as ``facts`` (read in one transaction) say."""
    running = [key.rpartition("@")[0] for key in facts.running if key.rpartition("@")[2] == path]
    horizon = horizon_of(
        path, dict(facts.heads).get(path, 0), facts.rows, facts.holds, running, now
    )
    segments, size = facts.archived.get(path, (0, 0))
    start = facts.starts.get(path, 1)
    return replace(
        horizon,
        needs=tuple(abandoned_if_gone(need, start) for need in horizon.needs),
        # Nothing below the path's start is held by anyone: a row that needs more (a shadow
        # build abandoned over deleted history, say) is shown in the needs, but it never
        # pins the horizon below what the path still holds.
        offset=max(horizon.offset, start),
        start=start,
        archived_segments=segments,
        archived_bytes=size,
        keys_kept_for=facts.windows.get(path),
    )


async def horizons(
    log: Log, rows: RetentionRows, now: float, path: str | None = None
) -> list[Horizon]:
    """The horizon of every path with events or a checkpoint (or of ``path`` only)."""
    facts = await log.query(rows.facts)
    paths = {p for p, _ in facts.heads}
    paths.update(row.path for row in facts.rows if row.path is not None)
    paths.update(hold.path for hold in facts.holds)
    if path is not None:
        paths = {validate_path(path)}
    return [horizon_in(facts, p, now) for p in sorted(paths)]


async def place_hold(log: Log, hold: Hold, rows: RetentionRows) -> StreamEvent:
    """Place ``hold`` (checked already): its row and ``streamkit.hold-placed`` in one transaction.

    A hold of the same name on the path is refused (InvalidRequest, nothing
    written): release it first, so every change is its own record.
    """

    def seal(conn: Connection, events: list[StreamEvent]) -> None:
        existing = rows.insert_hold(conn, hold)
        if existing is not None:
            raise InvalidRequest(
                f"a hold named {hold.name!r} is already on {hold.path!r} (from offset "
                f"{existing.from_offset}, placed by {existing.placed_by!r}: "
                f"{existing.reason!r}); release it first; nothing was written",
                details={"path": hold.path, "name": hold.name, "from": existing.from_offset},
            )

    payload: dict[str, Any] = {
        "name": hold.name,
        "from": hold.from_offset,
        "until": hold.until,
        "by": hold.placed_by,
        "reason": hold.reason,
    }
    return await log.append_control(hold.path, {"type": HOLD_PLACED, "payload": payload}, seal)


async def release_hold(
    log: Log, path: str, name: str, by: str, reason: str, rows: RetentionRows
) -> StreamEvent:
    """Release the hold ``name`` of ``path``: its row goes with ``streamkit.hold-released``.

    NotFound (nothing written) when the path has no hold of that name.
    """
    path = validate_path(path)
    by, reason = check_reason(by, reason, f"release of the hold {name!r} on {path!r}")
    facts = await log.query(rows.facts)
    found = [hold for hold in facts.holds if hold.path == path and hold.name == name]
    if not found:
        raise NotFound(
            f"there is no hold named {name!r} on {path!r} to release (`streamkit retention "
            "horizon` lists the holds); nothing was written",
            details={"path": path, "name": name},
        )
    (hold,) = found

    def seal(conn: Connection, events: list[StreamEvent]) -> None:
        if rows.delete_hold(conn, path, name) != hold:
            raise InvalidRequest(
                f"the hold named {name!r} on {path!r} changed while it was being released "
                "(another operator released or replaced it); nothing was written; look again",
                details={"path": path, "name": name},
            )

    payload: dict[str, Any] = {"name": name, "from": hold.from_offset, "by": by, "reason": reason}
    return await log.append_control(path, {"type": HOLD_RELEASED, "payload": payload}, seal)


async def forget_processor(
    log: Log,
    slug: str,
    version: str | None,
    *,
    by: str,
    reason: str,
    running: Mapping[str, Sequence[str]],
    rows: RetentionRows,
) -> StreamEvent:
    """Delete ``slug``'s checkpoint rows (one ``version``, or all) with their record.

    Refused (InvalidRequest, nothing written) while a live host runs the
    processor (``running``: owner -> ``slug@path`` list): stop it there
    first, or its next checkpoint writes the row again. NotFound when there is
    no such row. The event goes on the rows' path (``/`` for a row whose path
    is unknown) and lists each version with what it needed.
    """
    by, reason = check_reason(by, reason, f"forgetting processor {slug!r}")
    hosts = sorted(
        owner for owner, keys in running.items() if any(k.rpartition("@")[0] == slug for k in keys)
    )
    if hosts:
        raise InvalidRequest(
            f"processor {slug!r} runs on host(s) {', '.join(hosts)}: forgetting its checkpoint "
            "there would only have it written again; remove it from their configuration and "
            "restart them first; nothing was written",
            details={"slug": slug, "hosts": hosts},
        )
    facts = await log.query(rows.facts)
    mine = [
        row
        for row in facts.rows
        if row.slug == slug and (version is None or row.version == version)
    ]
    if not mine:
        which = f"version {version!r} of " if version is not None else ""
        raise NotFound(
            f"there is no checkpoint of {which}processor {slug!r} in this log to forget "
            "(`streamkit retention horizon` lists what holds each path); nothing was written",
            details={"slug": slug, "version": version},
        )
    paths = {row.path for row in mine}
    path = next(iter(paths)) if len(paths) == 1 else None
    on = "/" if path is None else path

    def seal(conn: Connection, events: list[StreamEvent]) -> None:
        deleted = rows.delete_checkpoints(conn, slug, version)
        if {(r.version, r.cursor) for r in deleted} != {(r.version, r.cursor) for r in mine}:
            raise InvalidRequest(
                f"processor {slug!r} moved while it was being forgotten (a host wrote its "
                "checkpoint); nothing was written; stop the host that runs it and try again",
                details={"slug": slug},
            )

    versions = [
        {
            "version": row.version,
            "path": row.path,
            "cursor": row.cursor,
            "needed_from": needs_of(row).from_offset,
            "serving": row.serving,
        }
        for row in sorted(mine, key=lambda r: r.version)
    ]
    payload: dict[str, Any] = {"slug": slug, "versions": versions, "by": by, "reason": reason}
    return await log.append_control(on, {"type": PROCESSOR_FORGOTTEN, "payload": payload}, seal)

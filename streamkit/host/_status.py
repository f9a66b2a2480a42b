"""What ``status`` shows of one processor this host runs: the durable row merged with the runtime.

The durable row (what the database alone says: version, cursor, head, lease,
claim) is overlaid with what only the running host knows: its state,
stalled and why, failures, skips, the queue, the fold's incidents and the
runner's rates. The cursor shown never passes the durable head. While this
host builds a new version in the shadow, the row's cursor and lag are the
serving version's (what clients are served), and the build's own position
is its ``progress``.

When the database does not answer (a server down, say), the host's own view
stands: :func:`processor_rows` says the database is unreachable, and the
head and lag are unknown.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from streamkit.checkpoint import shown_cursor
from streamkit.engine import EngineStatistics
from streamkit.errors import StorageError
from streamkit.host._runner import ProcessorRunner
from streamkit.log import Log
from streamkit.protocols import HostStore

__all__ = ["processor_rows", "retention_rows", "runner_status"]


async def processor_rows(
    log: Log, store: HostStore, runners: Sequence[ProcessorRunner]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(database, rows)``: whether the database answered, and one row per runner."""
    database: dict[str, Any] = {"reachable": True, "error": None}
    try:
        durable = {(row["path"], row["slug"]): row for row in await store.durable_status()}
    except StorageError as exc:
        durable = {}
        database = {"reachable": False, "error": exc.message, "code": exc.code}
    now_mono = time.monotonic()
    rows = []
    for runner in runners:
        row = dict(durable.get((runner.path, runner.slug)) or {})
        building = runner.engine is not None and runner.role.shadow
        # The serving version's cursor while a version builds here: what clients get.
        ours = None if building else runner.cursor
        cursor = ours if ours is not None else row.get("cursor")
        head = row.get("head")
        lag = None
        if database["reachable"]:
            try:
                if head is None:
                    head = await log.stream(runner.path).head()
                if cursor is not None:
                    lag = await store.durable_lag(runner.path, cursor)
            except StorageError as exc:
                database = {"reachable": False, "error": exc.message, "code": exc.code}
        rows.append(runner_status(runner, row, cursor, head, lag, now_mono))
    return database, rows


async def retention_rows(store: HostStore, now: float) -> list[dict[str, Any]] | None:
    """Each path's retention horizon and what holds it (None: the database did not answer)."""
    try:
        return [horizon.to_dict() for horizon in await store.retention.horizons(now)]
    except StorageError:
        return None


def runner_status(
    runner: ProcessorRunner,
    row: dict[str, Any],
    cursor: int | None,
    head: int | None,
    lag: int | None,
    now_mono: float,
) -> dict[str, Any]:
    """One processor's status entry (``streamkit status --json`` shows a list of them).

    ``head`` and ``lag`` are None when the database could not be read.
    """
    engine = runner.engine
    # A processor this host does not run shows every incident field, empty.
    statistics = engine.statistics() if engine is not None else EngineStatistics.nothing_yet()
    rates = runner.metrics.to_dict(now_mono)
    failures = runner.failures
    phase, progress = _phase(runner, statistics, cursor, head, rates.get("events_per_second"))
    return {
        "slug": runner.slug,
        "version": runner.version,
        "serving_version": row.get("version"),
        "path": runner.path,
        "label": runner.label,
        "state": "stalled" if failures.stalled else runner.state,
        "cursor": cursor if head is None else shown_cursor(cursor, head),
        "head": head,
        "lag": lag,
        "lease": row.get("lease"),
        "shadow_lease": row.get("shadow_lease"),
        "retired": runner.role.retired,
        "lease_held_here": runner.lease is not None,
        # Whether it runs here as a version building in the shadow of the serving one.
        "shadow": engine is not None and runner.role.shadow,
        "summary": None if engine is None else _jsonable_summary(engine.status_summary()),
        "claim_due": runner.claim_due if runner.engine else row.get("claim_due"),
        # Its first checkpoint past offset 1, as declared (when this host wrote it).
        "began": runner.first_start.began,
        "phase": phase,
        "progress": progress,
        "stalled": failures.stalled,
        "stalled_at": failures.stalled_at,
        "ahead_of_code": failures.ahead_of_code,
        "cannot_build": failures.cannot_build,
        "failures": failures.count,
        "last_error": failures.last_error,
        "skipped": sorted(runner.skipped),
        "queued": runner.queued,
        **statistics.incidents,
        **rates,
    }


def _phase(
    runner: ProcessorRunner,
    statistics: EngineStatistics,
    cursor: int | None,
    head: int | None,
    rate: float | None,
) -> tuple[str | None, dict[str, Any] | None]:
    """``(phase, progress)``: where a processor running here is on its way to serving.

    ``rebuilding``: a new contract version builds in the shadow up to the
    serving version's cursor (reduce only) before it cuts over;
    ``awaiting-cutover``: built, it follows the serving version until an
    operator cuts over (a manual cutover); ``catching-up``: reading the
    backlog since its checkpoint after it took the lease; ``serving``: caught
    up, following the log. None while this host does not run it.
    """
    if runner.engine is None:
        return None, None
    if statistics.rebuild is not None:
        if statistics.rebuild.get("awaiting_cutover"):
            return "awaiting-cutover", statistics.rebuild
        return "rebuilding", statistics.rebuild
    if runner.caught_up:
        return "serving", None
    through = cursor or 0
    target = max(head or 0, through)
    eta = round((target - through) / rate, 1) if rate else None
    return "catching-up", {
        "through": through,
        "target": target,
        "events_per_second": rate,
        "eta_seconds": eta,
    }


def _jsonable_summary(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A processor's summary as JSON values (one that is not is shown by its repr)."""
    if summary is None:
        return None
    shown: dict[str, Any] = {}
    for key, value in summary.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = repr(value)
        shown[str(key)] = value
    return shown

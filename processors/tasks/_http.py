"""``/v1/tasks``: the tasks processor's operator verbs over HTTP, a plugin of ``streamkit.http``.

- ``GET /v1/tasks?path=/``: the live tasks (waiting, scheduled, running,
  cancelling) and the counts, from the running host's state;
- ``GET /v1/tasks/{task_id}?path=/``: one task: its live state (if live), its
  status, and its events (requested, each attempt started and failed or
  succeeded, cancelled, ...), from its request on (a task no longer live is
  looked for in the newest 100,000 events); 404 when none is found;
- ``GET /v1/finished-tasks?path=/&status=succeeded,dead-lettered,cancelled&name=N&limit=50``:
  the tasks that finished among the newest 20,000 events, newest first, each
  with its name, how it ended, its attempts, when it was requested and
  finished, how long it took in all (``seconds``, request to end) and its
  last attempt (``ran_seconds``), and its error; filtered by status and
  name;
- ``POST /v1/tasks/{task_id}/cancel?path=/`` with ``{"reason", "by"}``
  (both optional): appends ``task.cancel-requested``; 202 with the event.
  The processor then records ``task.cancelled`` (or ``task.rejected`` for a
  task that is not live);
- ``/metrics`` gains ``streamkit_tasks{path,status}`` and
  ``streamkit_tasks_events{path,outcome}`` (the ``streamkit.metrics`` group).

The core HTTP surface never imports this module; the web layer loads it by
its entry point.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from streamkit.processors.tasks._events import cancel_requested_event

from streamkit import InvalidRequest, NotFound
from streamkit.log import read_matching, type_matcher
from streamkit.web import Gauge, HttpAnswer, HttpCall, HttpRoute

__all__ = ["gauges", "routes"]

_SLUG = "tasks"
_STATUSES = ("waiting", "scheduled", "retrying", "running", "cancelling")


def routes() -> list[HttpRoute]:
    """The routes this package adds."""
    return [
        HttpRoute("GET", "/v1/tasks", _list),
        HttpRoute("GET", "/v1/finished-tasks", _finished),
        HttpRoute("GET", "/v1/tasks/{task_id}", _show),
        HttpRoute("POST", "/v1/tasks/{task_id}/cancel", _cancel),
    ]


async def _list(call: HttpCall) -> Any:
    path = call.query.get("path", "/")
    snapshot = await call.host.snapshot(_SLUG, path)
    state = snapshot.get("state") or {}
    tasks = sorted((state.get("tasks") or {}).values(), key=lambda t: t.get("request_offset", 0))
    return {
        "offset": snapshot.get("offset"),
        "tasks": [{**task, "status": _status(task)} for task in tasks],
        "counts": state.get("counts") or {},
    }


_SEARCH = 100_000
"""How far back from the head a task that is no longer live is looked for."""


async def _show(call: HttpCall) -> Any:
    task_id = call.path_params["task_id"]
    path = call.query.get("path", "/")
    log = call.host.log
    if log is None:
        raise InvalidRequest("the host has not started; nothing was read", details={})
    snapshot = await call.host.snapshot(_SLUG, path)
    live = ((snapshot.get("state") or {}).get("tasks") or {}).get(task_id)
    stream = log.stream(path)
    head = await stream.head()
    start = max(0, head - _SEARCH)
    if live is not None and isinstance(live.get("request_offset"), int):
        start = max(0, live["request_offset"] - 1)
    wanted = type_matcher(["task.*"])
    events: list[Any] = []
    after = start
    while True:
        page = await read_matching(stream.read, after, 1000, wanted)
        events += [
            e.to_dict()
            for e in page.events
            if isinstance(e.payload, dict) and e.payload.get("task_id") == task_id
        ]
        after = page.scanned_through_offset
        if page.at_head:
            break
    if live is None and not events:
        raise NotFound(
            f"no task {task_id!r} on {path!r} (live, or in the newest {_SEARCH} events); "
            "nothing was read",
            details={"task_id": task_id[:200], "path": path},
        )
    return {
        "task_id": task_id,
        "status": _status(live) if live is not None else _settled(events),
        "live": live,
        "events": events,
        "searched_from": start,
    }


_FINISHED_WINDOW = 20_000
"""How many of the newest events the list of finished tasks reads."""

_ENDINGS = {
    "task.succeeded": "succeeded",
    "task.dead-lettered": "dead-lettered",
    "task.cancelled": "cancelled",
}


async def _finished(call: HttpCall) -> Any:
    path = call.query.get("path", "/")
    statuses = _listed(call.query.get("status"), set(_ENDINGS.values()), "status")
    name = call.query.get("name") or None
    limit = _limit(call.query.get("limit"))
    log = call.host.log
    if log is None:
        raise InvalidRequest("the host has not started; nothing was read", details={})
    stream = log.stream(path)
    head = await stream.head()
    start = max(0, head - _FINISHED_WINDOW)
    wanted = type_matcher(["task.requested", "task.attempt-started", *_ENDINGS])
    requested: dict[str, tuple[str, str]] = {}
    started: dict[str, float] = {}
    finished: list[dict[str, Any]] = []
    after = start
    while True:
        page = await read_matching(stream.read, after, 1000, wanted)
        for event in page.events:
            payload = event.payload if isinstance(event.payload, dict) else {}
            task_id = str(payload.get("task_id", ""))
            if event.type == "task.requested":
                requested[task_id] = (str(payload.get("name", "")), event.created_at)
            elif event.type == "task.attempt-started":
                started[task_id] = float(payload.get("started_at") or 0) or _epoch(event.created_at)
            else:
                finished.append(
                    _ending(
                        event.type,
                        event.offset,
                        event.created_at,
                        payload,
                        requested.pop(task_id, None),
                        started.pop(task_id, None),
                    )
                )
        after = page.scanned_through_offset
        if page.at_head:
            break
    shown = [
        task
        for task in reversed(finished)
        if task["status"] in statuses and (name is None or task["name"] == name)
    ]
    return {"searched_from": start, "tasks": shown[:limit]}


def _ending(
    etype: str,
    offset: int,
    at: str,
    payload: dict[str, Any],
    request: tuple[str, str] | None,
    started: float | None,
) -> dict[str, Any]:
    """One finished task as the list shows it (its name is None if requested before the window)."""
    name, requested_at = request if request is not None else (None, None)
    finished = _epoch(at)
    return {
        "task_id": payload.get("task_id"),
        "name": name,
        "status": _ENDINGS[etype],
        "offset": offset,
        "attempts": payload.get("attempt", payload.get("attempts")),
        "requested_at": requested_at,
        "finished_at": at,
        "seconds": _between(None if requested_at is None else _epoch(requested_at), finished),
        "ran_seconds": _between(started, finished),
        "error": payload.get("error") or payload.get("reason"),
    }


def _between(first: float | None, last: float | None) -> float | None:
    if first is None or last is None:
        return None
    return round(max(0.0, last - first), 3)


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _listed(given: str | None, known: set[str], what: str) -> set[str]:
    if not given:
        return known
    chosen = {part.strip() for part in given.split(",") if part.strip()}
    unknown = chosen - known
    if unknown:
        raise InvalidRequest(
            f"{what} {sorted(unknown)!r} is not one of {sorted(known)!r}; nothing was read",
            details={what: sorted(unknown), "known": sorted(known)},
        )
    return chosen


def _limit(given: str | None) -> int:
    try:
        limit = 50 if given is None else int(given)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 1000:
        raise InvalidRequest(
            f"limit {given!r} is not a whole number from 1 to 1000; nothing was read",
            details={"limit": str(given)[:40]},
        )
    return limit


def _settled(events: list[dict[str, Any]]) -> str:
    """How a task that is no longer live ended, from its last event."""
    last = events[-1]["type"] if events else ""
    return {
        "task.succeeded": "succeeded",
        "task.dead-lettered": "dead-lettered",
        "task.cancelled": "cancelled",
        "task.rejected": "rejected",
    }.get(last, "settled")


def _status(task: dict[str, Any]) -> str:
    if task.get("cancel_requested"):
        return "cancelling"
    if task.get("running"):
        return "running"
    if task.get("attempt"):
        return "retrying"
    if task.get("due"):
        return "scheduled"
    return "waiting"


async def _cancel(call: HttpCall) -> HttpAnswer:
    body = call.body if call.body is not None else {}
    if not isinstance(body, dict):
        raise InvalidRequest(
            'the body must be an object ({"reason": "...", "by": "..."}, both optional); '
            "nothing was written",
            details={"got": type(body).__name__},
        )
    event = cancel_requested_event(
        call.path_params["task_id"], reason=body.get("reason"), requested_by=body.get("by", "http")
    )
    (committed,) = await call.host.append(call.query.get("path", "/"), [event])
    return HttpAnswer(202, {"event": committed.to_dict()})


async def gauges(host: Any) -> list[Gauge]:
    """``streamkit_tasks`` (live tasks by status) and ``streamkit_tasks_events`` (the counts)."""
    live = Gauge("streamkit_tasks", "Live tasks, by status.", ("path", "status"))
    counted = Gauge(
        "streamkit_tasks_events",
        "Task outcomes since the log began (requested, succeeded, dead_lettered, ...).",
        ("path", "outcome"),
    )
    for runner in host.runners:
        if runner.slug != _SLUG or runner.engine is None:
            continue
        snapshot = await host.snapshot(_SLUG, runner.path)
        state = snapshot.get("state") or {}
        by_status = dict.fromkeys(_STATUSES, 0)
        for task in (state.get("tasks") or {}).values():
            by_status[_status(task)] += 1
        live.samples.extend(((runner.path, s), float(n)) for s, n in by_status.items())
        counts = state.get("counts") or {}
        counted.samples.extend(((runner.path, k), float(v)) for k, v in counts.items())
    return [live, counted]

"""``/v1/schedules``: the schedules processor over HTTP and in ``/metrics`` (plugins).

- ``GET /v1/schedules?path=/``: every schedule with its definition, next
  slot, last slot fired, fired and missed counts (by reason), lateness
  percentiles, running tasks and waiting slots, from the running host;
- ``POST /v1/schedules?path=/`` with a schedule request (``name``, ``cron``
  or ``every``, ``task``, ... as ``streamkit schedules add``): appends
  ``schedule.defined``; 202 with the event;
- ``POST /v1/schedules/{name}/pause``, ``.../resume`` and ``.../delete``
  (``{"by"}`` optional): append the change; 202; 404 for a name that is not
  defined;
- ``POST /v1/schedules/{name}/backfill`` with ``{"from", "to", "by"}``:
  appends ``schedule.backfill-requested``; 202;
- ``/metrics`` gains the ``streamkit_schedule_*`` gauges (docs/metrics.md).

The core HTTP surface never imports this module; the web layer loads it by
its entry point.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from streamkit.processors.schedules._requests import (
    backfill_event,
    defined_event,
    deleted_event,
    instant_of,
    paused_event,
    resumed_event,
    schedule_from_request,
)
from streamkit.processors.schedules._rows import schedule_rows
from streamkit.processors.schedules._schedule import schedule_of

from streamkit import InvalidRequest, NotFound
from streamkit.web import Gauge, HttpAnswer, HttpCall, HttpRoute

__all__ = ["gauges", "routes"]

_SLUG = "schedules"


def routes() -> list[HttpRoute]:
    """The routes this package adds."""
    return [
        HttpRoute("GET", "/v1/schedules", _list),
        HttpRoute("POST", "/v1/schedules", _add),
        HttpRoute("POST", "/v1/schedules/{name}/pause", _pause),
        HttpRoute("POST", "/v1/schedules/{name}/resume", _resume),
        HttpRoute("POST", "/v1/schedules/{name}/delete", _delete),
        HttpRoute("POST", "/v1/schedules/{name}/backfill", _backfill),
    ]


async def _state(call: HttpCall, path: str) -> tuple[Any, dict[str, Any]]:
    snapshot = await call.host.snapshot(_SLUG, path)
    return snapshot.get("offset"), snapshot.get("state") or {}


async def _list(call: HttpCall) -> Any:
    offset, state = await _state(call, call.query.get("path", "/"))
    return {"offset": offset, "schedules": schedule_rows(state)}


def _body(call: HttpCall) -> dict[str, Any]:
    body = call.body if call.body is not None else {}
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"the body must be a JSON object, got {type(body).__name__}; nothing was written",
            details={"got": type(body).__name__},
        )
    return body


async def _add(call: HttpCall) -> HttpAnswer:
    body = _body(call)
    schedule = schedule_from_request({k: v for k, v in body.items() if k != "by"})
    event = defined_event(schedule, by=body.get("by", "http"))
    (committed,) = await call.host.append(call.query.get("path", "/"), [event])
    return HttpAnswer(202, {"event": committed.to_dict()})


async def _change(call: HttpCall, make: Callable[..., dict[str, Any]]) -> HttpAnswer:
    path = call.query.get("path", "/")
    name = call.path_params["name"]
    _, state = await _state(call, path)
    if name not in (state.get("schedules") or {}):
        raise NotFound(
            f"no schedule {name!r} is defined on {path!r}; nothing was written",
            details={"name": name[:200], "path": path},
        )
    event = make(name, by=_body(call).get("by", "http"))
    (committed,) = await call.host.append(path, [event])
    return HttpAnswer(202, {"event": committed.to_dict()})


async def _pause(call: HttpCall) -> HttpAnswer:
    return await _change(call, paused_event)


async def _resume(call: HttpCall) -> HttpAnswer:
    return await _change(call, resumed_event)


async def _delete(call: HttpCall) -> HttpAnswer:
    return await _change(call, deleted_event)


async def _backfill(call: HttpCall) -> HttpAnswer:
    path = call.query.get("path", "/")
    name = call.path_params["name"]
    _, state = await _state(call, path)
    entry = (state.get("schedules") or {}).get(name)
    if entry is None:
        raise NotFound(
            f"no schedule {name!r} is defined on {path!r}; nothing was written",
            details={"name": name[:200], "path": path},
        )
    body = _body(call)
    event = backfill_event(
        schedule_of(entry["definition"]),
        instant_of(str(body.get("from", "")), "from"),
        instant_of(str(body.get("to", "")), "to"),
        by=body.get("by", "http"),
    )
    (committed,) = await call.host.append(path, [event])
    return HttpAnswer(202, {"event": committed.to_dict()})


async def gauges(host: Any) -> list[Gauge]:
    """The ``streamkit_schedule_*`` gauges of each path this host runs the processor on."""
    slots = Gauge(
        "streamkit_schedule_slots",
        "Slots of a schedule since it was defined, by outcome (fired, missed).",
        ("path", "schedule", "outcome"),
    )
    missed = Gauge(
        "streamkit_schedule_missed",
        "Slots of a schedule not fired, by reason.",
        ("path", "schedule", "reason"),
    )
    lateness = Gauge(
        "streamkit_schedule_lateness_seconds",
        "Seconds from a slot's firing instant to its commit, over the latest 100 firings.",
        ("path", "schedule", "quantile"),
    )
    next_slot = Gauge(
        "streamkit_schedule_next_slot_timestamp_seconds",
        "When the schedule's next slot is (Unix time; absent while paused).",
        ("path", "schedule"),
    )
    behind = Gauge(
        "streamkit_schedule_overdue_seconds",
        "How far the next slot is in the past (0 when it is ahead): a slot nobody fires.",
        ("path", "schedule"),
    )
    last = Gauge(
        "streamkit_schedule_last_fired_timestamp_seconds",
        "When the schedule last fired a slot (Unix time).",
        ("path", "schedule"),
    )
    paused = Gauge(
        "streamkit_schedule_paused", "1 while the schedule is paused.", ("path", "schedule")
    )
    tasks = Gauge(
        "streamkit_schedule_tasks",
        "The schedule's tasks running and slots waiting for them (overlap).",
        ("path", "schedule", "state"),
    )
    now = time.time()
    for runner in host.runners:
        if runner.slug != _SLUG or runner.engine is None:
            continue
        path = runner.path
        snapshot = await host.snapshot(_SLUG, path)
        for row in schedule_rows(snapshot.get("state")):
            name = row["name"]
            slots.samples.extend(
                [
                    ((path, name, "fired"), float(row.get("fired", 0))),
                    ((path, name, "missed"), float(row.get("missed", 0))),
                ]
            )
            missed.samples.extend(
                ((path, name, reason), float(count))
                for reason, count in (row.get("missed_by") or {}).items()
            )
            for quantile, key in (("0.5", "lateness_p50"), ("0.99", "lateness_p99")):
                if row[key] is not None:
                    lateness.samples.append(((path, name, quantile), float(row[key])))
            if row["next_slot"] is not None:
                next_slot.samples.append(((path, name), float(row["next_slot"])))
                behind.samples.append(((path, name), max(0.0, now - row["next_slot"])))
            if row.get("last_fired_at") is not None:
                last.samples.append(((path, name), float(row["last_fired_at"])))
            paused.samples.append(((path, name), 1.0 if row.get("paused") else 0.0))
            tasks.samples.extend(
                [
                    ((path, name, "running"), float(len(row.get("running") or []))),
                    ((path, name, "waiting"), float(len(row.get("buffered") or []))),
                ]
            )
    return [slots, missed, lateness, next_slot, behind, last, paused, tasks]

"""``/v1/dlq``: the dead-letter queue over HTTP, a plugin of ``streamkit.http``.

- ``GET /v1/dlq?path=/&status=pending&limit=100``: the records, newest
  first, with their status (``status`` repeatable or comma-separated);
- ``POST /v1/dlq/replay?path=/`` with ``{"ids": [...], "origin": ...,
  "operation": ...}`` (all optional: no selector replays every pending
  record): appends ``dlq.replay-requested``; 202 with the event. The DLQ
  processor then appends ``dlq.replay-completed`` with the report;
- ``GET /v1/dlq/replays?path=/&limit=5``: the newest reports first (the
  ``dlq.replay-completed`` payloads, each naming its ``request_offset``);
- ``GET /v1/dlq/record?id=ID&path=/``: one record with its status, payload
  and replay count, and the events from its latest dead-lettering on
  (replaying, succeeded, abandoned); 404 for an unknown id;
- ``/metrics`` gains ``streamkit_dlq_records{path,status}``: ``pending`` is
  the queue's depth (the ``streamkit.metrics`` group).

The core HTTP surface never imports this module; the web layer loads it by
its entry point.
"""

from __future__ import annotations

from typing import Any, cast

from streamkit.processors.dlq import (
    REPLAY_COMPLETED,
    ReplayFilter,
    find_head,
    iter_records,
    replay_requested_event,
)
from streamkit.processors.dlq._scan import RecordStatus, pages_backwards

from streamkit import InvalidRequest, Log, NotFound
from streamkit.log import read_matching, type_matcher
from streamkit.web import Gauge, HttpAnswer, HttpCall, HttpRoute

__all__ = ["gauges", "routes"]

_STATUSES = ("pending", "replaying", "succeeded", "abandoned")


def routes() -> list[HttpRoute]:
    """The routes this package adds."""
    return [
        HttpRoute("GET", "/v1/dlq", _list),
        HttpRoute("POST", "/v1/dlq/replay", _replay),
        HttpRoute("GET", "/v1/dlq/replays", _replays),
        HttpRoute("GET", "/v1/dlq/record", _record),
    ]


def _limit(call: HttpCall, default: str) -> int:
    text = call.query.get("limit", default)
    if not text.isdigit() or not 1 <= int(text) <= 10_000:
        raise InvalidRequest(
            f"limit must be a whole number from 1 to 10000, got {text!r}; nothing was read",
            details={"limit": text[:50]},
        )
    return int(text)


def _log_of(call: HttpCall) -> Log:
    log = call.host.log
    if log is None:
        raise InvalidRequest("the host has not started; nothing was read", details={})
    return log


async def _replays(call: HttpCall) -> Any:
    stream = _log_of(call).stream(call.query.get("path", "/"))
    limit = _limit(call, "5")
    reports: list[Any] = []
    async for _, events in pages_backwards(stream, await find_head(stream)):
        for event in events:
            if event.type == REPLAY_COMPLETED:
                reports.append({"offset": event.offset, **dict(event.payload)})
                if len(reports) >= limit:
                    return {"replays": reports}
    return {"replays": reports}


async def _list(call: HttpCall) -> Any:
    log = _log_of(call)
    path = call.query.get("path", "/")
    wanted = [s for s in call.query.get("status", "").split(",") if s]
    unknown = [s for s in wanted if s not in _STATUSES]
    if unknown:
        raise InvalidRequest(
            f"status must be among {', '.join(_STATUSES)}, got {', '.join(unknown)}; nothing "
            "was read",
            details={"status": unknown},
        )
    limit = _limit(call, "100")
    records = []
    statuses = cast(list[RecordStatus], wanted) if wanted else None
    async for record in iter_records(log.stream(path), status=statuses, selection=ReplayFilter()):
        records.append(record.model_dump(mode="json"))
        if len(records) >= limit:
            break
    return {"records": records}


_HISTORY_SCAN = 100_000
"""The most events looked at for a record's history after its latest dead-lettering."""


async def _record(call: HttpCall) -> Any:
    record_id = call.query.get("id", "")
    if not record_id:
        raise InvalidRequest("id names the record to show; nothing was read", details={})
    stream = _log_of(call).stream(call.query.get("path", "/"))
    found = None
    async for record in iter_records(stream, selection=ReplayFilter(record_ids=[record_id])):
        found = record
        break
    if found is None:
        raise NotFound(
            f"no dead-letter record {record_id!r} on this path; nothing was read",
            details={"id": record_id[:200]},
        )
    wanted = type_matcher(["dlq.*"])
    history: list[Any] = []
    after, looked = found.offset - 1, 0
    while looked < _HISTORY_SCAN:
        page = await read_matching(stream.read, after, 1000, wanted)
        history += [
            e.to_dict()
            for e in page.events
            if isinstance(e.payload, dict) and e.payload.get("record_id") == record_id
        ]
        looked += page.scanned_through_offset - after
        after = page.scanned_through_offset
        if page.at_head:
            break
    return {"record": found.model_dump(mode="json"), "history": history}


async def _replay(call: HttpCall) -> HttpAnswer:
    body = call.body if call.body is not None else {}
    if not isinstance(body, dict) or not set(body) <= {"ids", "origin", "operation", "by"}:
        raise InvalidRequest(
            'the body must be an object with any of "ids", "origin", "operation" and "by"; '
            "nothing was written",
            details={"got": sorted(body) if isinstance(body, dict) else type(body).__name__},
        )
    event = replay_requested_event(
        record_ids=body.get("ids"),
        origin=body.get("origin"),
        operation=body.get("operation"),
        requested_by=body.get("by", "http"),
    )
    (committed,) = await call.host.append(call.query.get("path", "/"), [event])
    return HttpAnswer(202, {"event": committed.to_dict()})


async def gauges(host: Any) -> list[Gauge]:
    """``streamkit_dlq_records{path,status}``: the queue's depth (pending) and the rest."""
    records = Gauge("streamkit_dlq_records", "Dead-letter records, by status.", ("path", "status"))
    for runner in host.runners:
        if runner.slug != "dlq" or runner.engine is None:
            continue
        snapshot = await host.snapshot("dlq", runner.path)
        counts = (snapshot.get("state") or {}).get("counts") or {}
        records.samples.extend(
            ((runner.path, status), float(counts.get(status, 0))) for status in _STATUSES
        )
    return [records]

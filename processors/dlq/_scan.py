"""Reading dead-letter records out of the log, page by page (internal to the DLQ).

The DLQ keeps no records in its reduced state: a record is its events in the
log. Its status is its latest event (``dlq.dead-lettered`` -> pending,
``dlq.record-replaying`` -> replaying, ``dlq.record-succeeded`` ->
succeeded, ``dlq.record-abandoned`` -> abandoned); its body (origin, operation,
payload) is its latest ``dlq.dead-lettered`` event.

Reading newest first makes "latest" the first one met. The scans here walk
the log backwards one page at a time and keep only what a later (lower) page
still needs: the body offsets already superseded by a transition, and, for a
listing, the ids already yielded. Never the records' payloads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from streamkit import ReadPage, StreamEvent

__all__ = [
    "DlqRecord",
    "LogReader",
    "RecordStatus",
    "ReplayFilter",
    "find_head",
    "iter_records",
    "pages_backwards",
    "record_from_event",
]

RecordStatus = Literal["pending", "replaying", "succeeded", "abandoned"]

_BODY = "dlq.dead-lettered"
_STATUS_OF: dict[str, RecordStatus] = {
    "dlq.dead-lettered": "pending",
    "dlq.record-replaying": "replaying",
    "dlq.record-succeeded": "succeeded",
    "dlq.record-abandoned": "abandoned",
}

PAGE = 500


class LogReader(Protocol):
    """What the scans need of a stream: a forward page read (any ``ProcessorStream`` has it)."""

    async def read(self, after_offset: int = 0, limit: int = 500) -> ReadPage: ...


class DlqRecord(BaseModel):
    """One dead-letter record as the log shows it now."""

    model_config = ConfigDict(frozen=True)

    record_id: str
    status: RecordStatus
    origin: str
    operation: str
    payload: dict[str, Any] = Field(default_factory=dict)
    error: str
    """The latest error: the origin's, or the latest failed replay's."""
    attempts: int
    """How many times the origin tried before dead-lettering it."""
    replays: int
    """How many replays the record has had."""
    resource_id: str | None = None
    actor: str | None = None
    request_type: str | None = None
    request_version: int = 1
    """The payload version of ``payload`` as a ``request_type`` event."""
    offset: int
    """The offset of the record's latest ``dlq.dead-lettered`` event (its body)."""
    dead_lettered_at: str
    """When that body was written (UTC ISO-8601)."""
    traceback: str | None = None
    """A bounded excerpt of the latest failure's traceback, when its origin kept one."""


class ReplayFilter(BaseModel):
    """Which records a replay (or a listing) selects: ids, or origin/operation, or all."""

    record_ids: list[str] | None = None
    origin: str | None = None
    operation: str | None = None

    def matches(self, record_id: str, origin: str, operation: str) -> bool:
        """Whether a record with these fields is selected."""
        if self.record_ids is not None and record_id not in self.record_ids:
            return False
        if self.origin is not None and origin != self.origin:
            return False
        return self.operation is None or operation == self.operation


def _field(payload: object, name: str) -> Any:
    if isinstance(payload, BaseModel):
        return getattr(payload, name, None)
    if isinstance(payload, Mapping):
        return payload.get(name)
    return None


def record_from_event(event: StreamEvent, status: RecordStatus = "pending") -> DlqRecord | None:
    """The record a ``dlq.dead-lettered`` event describes, or None for a malformed body."""
    payload = event.payload
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="json")
    if not isinstance(payload, Mapping):
        return None
    try:
        return DlqRecord(
            record_id=payload["record_id"],
            status=status,
            origin=payload["origin"],
            operation=payload["operation"],
            payload=payload.get("payload") or {},
            error=payload.get("error", ""),
            attempts=payload.get("attempts", 0),
            replays=payload.get("replay", 0),
            resource_id=payload.get("resource_id"),
            actor=payload.get("actor"),
            request_type=payload.get("request_type"),
            request_version=payload.get("request_version", 1),
            offset=event.offset,
            dead_lettered_at=event.created_at,
            traceback=payload.get("traceback"),
        )
    except (KeyError, ValueError, TypeError):
        return None


async def pages_backwards(
    reader: LogReader, high: int, low: int = 0, page: int = PAGE
) -> AsyncIterator[tuple[int, list[StreamEvent]]]:
    """Yield ``(lowest offset covered, events newest first)`` for ``(low, high]``, one page at a time.

    A page reads the offsets ``(after, upper]`` with ``after = upper - page``:
    at most ``page`` events can lie there, so one read of ``page`` events
    covers it (events past ``upper`` are dropped).
    """
    upper = high
    while upper > low:
        after = max(low, upper - page)
        read = await reader.read(after, page)
        events = [e for e in read.events if e.offset <= upper]
        events.reverse()
        yield after, events
        upper = after


async def find_head(reader: LogReader) -> int:
    """The durable head of ``reader``'s stream, in O(log head) one-event reads.

    A one-event read answers "is there an event after offset a?" and, when
    there is, whether it is the head (``at_head``); galloping then bisecting
    finds the head without reading the log through.
    """
    low = 0  # an offset at or below the head (0: nothing known yet)
    probe = 1
    high: int | None = None  # an offset with no event after it
    while high is None:
        page = await reader.read(probe - 1, 1)
        if not page.events:
            high = probe - 1
            break
        event = page.events[0]
        if page.at_head:
            return event.offset
        low = event.offset
        probe = max(probe, low) * 2
    while high - low > 1:
        mid = (low + high) // 2
        page = await reader.read(mid, 1)
        if not page.events:
            high = mid
            continue
        if page.at_head:
            return page.events[0].offset
        low = page.events[0].offset
    # An event lies after `low` (it was not the head) and none after `high`.
    return high


def supersedes(event: StreamEvent) -> int | None:
    """The body offset a transition event settles (replaying, abandoned), if any."""
    if event.type in ("dlq.record-replaying", "dlq.record-abandoned"):
        offset = _field(event.payload, "record_offset")
        if isinstance(offset, int):
            return offset
    return None


async def iter_records(
    reader: LogReader,
    *,
    high: int | None = None,
    status: Iterable[RecordStatus] | None = None,
    selection: ReplayFilter | None = None,
) -> AsyncIterator[DlqRecord]:
    """Every record in the log, newest body first, with its current status.

    Reads the log backwards from ``high`` (default: the head) page by page.
    ``status`` keeps only records in those statuses; ``selection`` filters by
    id, origin and operation. Memory: the ids met so far, one page of events,
    and the statuses of records whose body is still below the page.
    """
    if high is None:
        high = await find_head(reader)
    wanted = None if status is None else set(status)
    seen: set[str] = set()
    latest: dict[str, RecordStatus] = {}
    async for _, events in pages_backwards(reader, high):
        for event in events:
            kind = _STATUS_OF.get(event.type)
            if kind is None:
                continue
            rid = _field(event.payload, "record_id")
            if not isinstance(rid, str) or rid in seen:
                continue
            if event.type != _BODY:
                latest.setdefault(rid, kind)
                continue
            seen.add(rid)
            record = record_from_event(event, latest.pop(rid, "pending"))
            if record is None:
                continue
            if wanted is not None and record.status not in wanted:
                continue
            if selection is not None and not selection.matches(
                record.record_id, record.origin, record.operation
            ):
                continue
            yield record

"""The DLQ's events, state and helpers (internal; the public names are re-exported by ``dlq``).

Kept apart from the processor so that producers (tasks, notifications, your
processors) and the replay pass share one definition of every ``dlq.*``
payload without importing the processor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from streamkit.processors._definitions import definition, named_input
from streamkit.processors.dlq._scan import DlqRecord

from streamkit import (
    InvalidEvent,
    StreamEvent,
    define_processor_contract,
)
from streamkit.tracebacks import MAX_EXCERPT_BYTES

DEAD_LETTERED = "dlq.dead-lettered"
REPLAY_REQUESTED = "dlq.replay-requested"
RECORD_REPLAYING = "dlq.record-replaying"
RECORD_SUCCEEDED = "dlq.record-succeeded"
RECORD_ABANDONED = "dlq.record-abandoned"
REPLAY_PROGRESS = "dlq.replay-progress"
REPLAY_COMPLETED = "dlq.replay-completed"

SLUG = "dlq"

# Record ids kept per report list, in state and in the completed event: a
# report over 100k records would not fit one event (1 MiB), so the lists are
# capped and the counts stay exact (``truncated`` says when ids were dropped).
REPORT_ID_CAP = 1000
# Replay requests queued behind the running one; more are refused with a report.
MAX_QUEUED_REPLAYS = 100


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeadLettered(_Payload):
    """A record entering (or re-entering) the queue as pending."""

    record_id: str = Field(min_length=1, max_length=256)
    origin: str = Field(min_length=1)
    """The processor (or system) that gave up, e.g. ``"tasks"``."""
    operation: str = Field(min_length=1)
    """What it was doing, e.g. the task name; replay handlers are chosen by it."""
    payload: dict[str, Any] = Field(default_factory=dict)
    """The original request, replayed as is by the default handler."""
    error: str
    attempts: int = Field(ge=0)
    """How many times the origin tried before giving up."""
    resource_id: str | None = None
    actor: str | None = None
    request_type: str | None = None
    """The event type the default replay re-appends ``payload`` as; None: no default replay."""
    request_version: int = Field(default=1, ge=1)
    """The payload version ``payload`` is of, as a ``request_type`` event: the replay re-appends
    it at that version, so a later release lifts it as any stored event of that version."""
    replay: int = Field(default=0, ge=0)
    """How many replays this record has had (0 when first dead-lettered)."""
    traceback: str | None = Field(default=None, max_length=MAX_EXCERPT_BYTES)
    """A bounded excerpt of the failure's traceback (:mod:`streamkit.tracebacks`), if any."""


class ReplayRequested(_Payload):
    """Replay pending records: the listed ids, or those matching origin/operation (all if none)."""

    record_ids: list[str] | None = Field(default=None, max_length=10_000)
    origin: str | None = None
    operation: str | None = None
    requested_by: str | None = None


class RecordReplaying(_Payload):
    """A replay of the record (body at ``record_offset``) was handed to its handler."""

    record_id: str
    replay: int = Field(ge=1)
    record_offset: int = Field(ge=1)
    request_offset: int = Field(ge=1)


class RecordSucceeded(_Payload):
    """A replay of the record succeeded: the record is settled for good."""

    record_id: str
    replay: int = Field(ge=1)


class RecordAbandoned(_Payload):
    """The record's replays reached ``max_attempts``: no more replays."""

    record_id: str
    replay: int = Field(ge=0)
    record_offset: int = Field(ge=1)
    reason: str


class ReplayReport(_Payload):
    """What one replay request did, by record id (lists capped, counts exact)."""

    replayed: list[str] = Field(default_factory=list)
    retried: list[str] = Field(default_factory=list)
    abandoned: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    counts: dict[str, int] = Field(
        default_factory=lambda: {"replayed": 0, "retried": 0, "abandoned": 0, "skipped": 0}
    )
    truncated: bool = False

    def add(self, kind: Literal["replayed", "retried", "abandoned", "skipped"], rid: str) -> None:
        """Count ``rid`` under ``kind`` (keeping its id while under the cap). Mutates."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        ids: list[str] = getattr(self, kind)
        if len(ids) < REPORT_ID_CAP:
            ids.append(rid)
        else:
            self.truncated = True


class ReplayProgress(_Payload):
    """A checkpoint of a running replay: everything above ``scanned_down_to`` is done."""

    request_offset: int = Field(ge=1)
    start_offset: int = Field(ge=0)
    scanned_down_to: int = Field(ge=0)
    report: ReplayReport


class ReplayCompleted(_Payload):
    """The end of one replay request, with its report."""

    request_offset: int = Field(ge=1)
    requested_by: str | None = None
    report: ReplayReport
    error: str | None = None
    """Set when the request was refused as a whole (the report is then empty)."""
    new_floor: int | None = None
    """(DLQ use.) The scan floor a full replay proved: no pending body at or below it."""


class ReplayRef(_Payload):
    """Which record, and which replay of it, a replayed request is (``metadata["dlq"]``)."""

    record_id: str
    replay: int = Field(ge=1)


class DlqCounts(BaseModel):
    """Records by status; ``total`` counts records ever dead-lettered."""

    pending: int = 0
    replaying: int = 0
    succeeded: int = 0
    abandoned: int = 0
    total: int = 0


class ActiveReplay(BaseModel):
    """A replay request in the queue; the first one runs, with its progress."""

    request_offset: int
    record_ids: list[str] | None = None
    origin: str | None = None
    operation: str | None = None
    requested_by: str | None = None
    start_offset: int | None = None
    """The head the pass scans down from (None until the pass started)."""
    scanned_down_to: int | None = None
    report: ReplayReport = Field(default_factory=ReplayReport)


class DlqState(BaseModel):
    """Counters, the scan floor and the replay queue: never the records themselves."""

    counts: DlqCounts = Field(default_factory=DlqCounts)
    floor: int = 0
    """No pending record's body lies at or below this offset (raised by full replays)."""
    replays: list[ActiveReplay] = Field(default_factory=list)
    refused_replays: int = 0


DLQ_CONTRACT = define_processor_contract(
    slug=SLUG,
    version="1",
    description="dead-lettered records from any processor, with replay",
    state_schema=DlqState,
    events={
        DEAD_LETTERED: definition("a record was dead-lettered (or failed a replay)", DeadLettered),
        REPLAY_REQUESTED: definition("replay pending records", ReplayRequested),
        RECORD_REPLAYING: definition("a record was handed to its replay handler", RecordReplaying),
        RECORD_SUCCEEDED: definition("a replay of a record succeeded", RecordSucceeded),
        RECORD_ABANDONED: definition("a record reached its max replays", RecordAbandoned),
        REPLAY_PROGRESS: definition("a running replay's progress", ReplayProgress),
        REPLAY_COMPLETED: definition("a replay request ended, with its report", ReplayCompleted),
    },
    consumes=[
        DEAD_LETTERED,
        REPLAY_REQUESTED,
        RECORD_REPLAYING,
        RECORD_SUCCEEDED,
        RECORD_ABANDONED,
        REPLAY_PROGRESS,
        REPLAY_COMPLETED,
    ],
    emits=[
        DEAD_LETTERED,
        RECORD_REPLAYING,
        RECORD_SUCCEEDED,
        RECORD_ABANDONED,
        REPLAY_PROGRESS,
        REPLAY_COMPLETED,
    ],
)

DLQ_EVENTS = DLQ_CONTRACT
"""The contract to list in ``processor_deps`` to emit or consume ``dlq.*`` events."""


# -- helpers for producers and clients --------------------------------------------------


def _invalid(what: str, exc: Exception) -> InvalidEvent:
    return InvalidEvent(
        f"{what} is not valid: {exc}; nothing was built or appended",
        details={"error": str(exc)[:1000]},
    )


def dead_lettered_event(
    *,
    record_id: str,
    origin: str,
    operation: str,
    payload: Mapping[str, Any],
    error: str,
    attempts: int,
    resource_id: str | None = None,
    actor: str | None = None,
    idempotency_key: str | None = None,
    request_type: str | None = None,
    replay_of: ReplayRef | None = None,
    request_version: int = 1,
    traceback: str | None = None,
) -> dict[str, Any]:
    """The ``dlq.dead-lettered`` event input for a record (append it, e.g. with ``args.append``).

    ``request_type`` is the event type the DLQ's default replay re-appends
    ``payload`` as (None: only a registered replay handler can replay it), at
    payload version ``request_version`` (the version of that shape).
    ``replay_of`` is the :class:`ReplayRef` of the request that failed when
    the failed work was itself a DLQ replay (:func:`replay_ref`): the event then
    re-dead-letters that record, taking its id and replay number from the ref.
    ``traceback`` is an excerpt of the failure's traceback
    (:func:`streamkit.tracebacks.traceback_excerpt`), shown by ``dlq show``.
    Raises :class:`~streamkit.InvalidEvent` on a bad field.
    """
    rid = record_id if replay_of is None else replay_of.record_id
    try:
        body = DeadLettered(
            record_id=rid,
            origin=origin,
            operation=operation,
            payload=dict(payload),
            error=error,
            attempts=attempts,
            resource_id=resource_id,
            actor=actor,
            request_type=request_type,
            request_version=request_version,
            replay=0 if replay_of is None else replay_of.replay,
            traceback=traceback,
        )
    except ValidationError as exc:
        raise _invalid("the dead-lettered record", exc) from exc
    event = named_input(DLQ_CONTRACT, DEAD_LETTERED, body)
    if idempotency_key is not None:
        event["idempotency_key"] = idempotency_key
    return event


def replay_ref(source: StreamEvent | Mapping[str, Any] | None) -> ReplayRef | None:
    """The :class:`ReplayRef` a replayed request carries (from an event or its metadata), or None."""
    metadata = source.metadata if isinstance(source, StreamEvent) else source
    if not isinstance(metadata, Mapping):
        return None
    raw = metadata.get("dlq")
    if not isinstance(raw, Mapping):
        return None
    try:
        return ReplayRef.model_validate(raw)
    except ValidationError:
        return None


def record_succeeded_event(ref: ReplayRef) -> dict[str, Any]:
    """The ``dlq.record-succeeded`` event an origin appends when a replayed request succeeded.

    Its idempotency key is the one the DLQ itself uses for that record and
    replay, so reporting twice appends once.
    """
    return {
        **named_input(
            DLQ_CONTRACT,
            RECORD_SUCCEEDED,
            RecordSucceeded(record_id=ref.record_id, replay=ref.replay),
        ),
        "idempotency_key": f"{SLUG}/succeeded/{ref.record_id}/{ref.replay}",
    }


def replay_requested_event(
    *,
    record_ids: list[str] | None = None,
    origin: str | None = None,
    operation: str | None = None,
    requested_by: str | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """The ``dlq.replay-requested`` event input; with no selector every pending record replays."""
    try:
        body = ReplayRequested(
            record_ids=record_ids, origin=origin, operation=operation, requested_by=requested_by
        )
    except ValidationError as exc:
        raise _invalid("the replay request", exc) from exc
    event = named_input(DLQ_CONTRACT, REPLAY_REQUESTED, body)
    if idempotency_key is not None:
        event["idempotency_key"] = idempotency_key
    return event


# -- replay handlers --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayContext:
    """What a replay handler gets besides the record."""

    replay: int
    """This replay's number for the record (1 for its first replay)."""
    idempotency_key: str
    """Stable per record and replay: use it so a handler run twice acts once."""
    request_offset: int
    requested_by: str | None


ReplayHandler = Callable[[DlqRecord, ReplayContext], Awaitable[object]]
"""``async def handler(record, ctx)``: return to succeed, raise to fail the replay."""

Kind = Literal["replayed", "retried", "abandoned", "skipped"]

"""The tasks processor's events, state and request helpers (internal; re-exported by ``tasks``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from streamkit.processors._definitions import definition, named_input
from streamkit.processors.dlq import (
    DEAD_LETTERED,
    DLQ_EVENTS,
    RECORD_SUCCEEDED,
    ReplayRef,
)

from streamkit import (
    InvalidEvent,
    SharedMap,
    define_processor_contract,
)
from streamkit.tracebacks import MAX_EXCERPT_BYTES

TASK_REQUESTED = "task.requested"
TASK_ATTEMPT_STARTED = "task.attempt-started"
TASK_SUCCEEDED = "task.succeeded"
TASK_ATTEMPT_FAILED = "task.attempt-failed"
TASK_DEAD_LETTERED = "task.dead-lettered"
TASK_CANCEL_REQUESTED = "task.cancel-requested"
TASK_CANCELLED = "task.cancelled"
TASK_REJECTED = "task.rejected"

SLUG = "tasks"
ORIGIN = "tasks"

_ERROR_CHARS = 4000


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskRequested(_Payload):
    """Run handler ``name`` with ``args``, at most ``max_attempts`` times, each under ``timeout_s``."""

    task_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    args: dict[str, Any] = Field(default_factory=dict)
    max_attempts: int = Field(default=5, ge=1, le=1000)
    timeout_s: float = Field(default=60.0, gt=0, le=7 * 24 * 3600)
    not_before: float | None = None
    """Epoch seconds before which the first attempt does not start."""


class _RunEvent(_Payload):
    task_id: str
    request_offset: int = Field(ge=1)
    """The offset of the ``task.requested`` that started this run."""


class TaskAttemptStarted(_RunEvent):
    """Attempt ``attempt`` of the run started (its handler is running)."""

    attempt: int = Field(ge=1)
    started_at: float


class TaskSucceeded(_RunEvent):
    """Attempt ``attempt`` succeeded with ``result``: the task is done."""

    attempt: int = Field(ge=1)
    result: Any = None


class TaskAttemptFailed(_RunEvent):
    """Attempt ``attempt`` failed; the next one is due at ``retry_at``."""

    attempt: int = Field(ge=1)
    error: str
    retry_at: float
    traceback: str | None = Field(default=None, max_length=MAX_EXCERPT_BYTES)
    """A bounded excerpt of the handler's traceback (no locals), when it raised."""


class TaskDeadLettered(_RunEvent):
    """The task gave up after ``attempts`` attempts (or could not run at all)."""

    attempts: int = Field(ge=0)
    error: str
    traceback: str | None = Field(default=None, max_length=MAX_EXCERPT_BYTES)
    """A bounded excerpt of the last attempt's traceback (no locals), when it raised."""


class TaskCancelRequested(_Payload):
    """Stop the live task ``task_id`` (an attempt in flight is cancelled)."""

    task_id: str = Field(min_length=1, max_length=256)
    reason: str | None = None
    requested_by: str | None = None


class TaskCancelled(_RunEvent):
    """The task was cancelled after ``attempts`` attempts: it is done."""

    attempts: int = Field(ge=0)
    reason: str | None = None


class TaskRejected(_Payload):
    """A request or cancel at ``offset`` could not be honoured; nothing was run or changed."""

    task_id: str
    offset: int = Field(ge=1)
    reason: str


class LiveTask(BaseModel):
    """A task run that has not settled yet."""

    task_id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    # The request's own defaults, so a checkpoint (compact_state) leaves them out too.
    max_attempts: int = 5
    timeout_s: float = 60.0
    request_offset: int
    due: float = 0.0
    """Epoch seconds when the next attempt may start."""
    attempt: int = 0
    """Attempts started so far."""
    running: bool = False
    started_at: float | None = None
    last_error: str | None = None
    cancel_requested: bool = False
    cancel_reason: str | None = None
    dlq: ReplayRef | None = None
    """Set when this run is a DLQ replay: its outcome is reported to the DLQ."""


class TaskCounts(BaseModel):
    """Counters since the beginning of the log."""

    requested: int = 0
    attempts: int = 0
    succeeded: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    rejected: int = 0


class TasksState(BaseModel):
    """Live tasks by id, and counters.

    ``tasks`` is a :class:`~streamkit.SharedMap`: a reduce that changes one
    task copies a sliver of it, not every live task (its JSON is an object,
    as a dict's; its order is not request order).
    """

    tasks: SharedMap[str, LiveTask] = Field(default_factory=SharedMap)
    counts: TaskCounts = Field(default_factory=TaskCounts)


TASKS_CONTRACT = define_processor_contract(
    slug=SLUG,
    version="1",
    description="durable background tasks with retries, timeouts and dead-lettering",
    state_schema=TasksState,
    # A backlog is many near-default entries: written compact, 10,000 live
    # tasks of a no-argument request take about 0.6 MB of the 2 MiB ceiling.
    compact_state=True,
    # One malformed request is skipped, counted per type and version in `status`,
    # /metrics and the admin page, rather than stall every task behind it: a task
    # queue that stops for one bad producer fails everyone else's work. A reduce
    # that raises is this package's own bug and stalls (the default).
    on_malformed="skip",
    events={
        TASK_REQUESTED: definition("run a named task", TaskRequested),
        TASK_ATTEMPT_STARTED: definition("an attempt started", TaskAttemptStarted),
        TASK_SUCCEEDED: definition("the task succeeded", TaskSucceeded),
        TASK_ATTEMPT_FAILED: definition("an attempt failed; retry due", TaskAttemptFailed),
        TASK_DEAD_LETTERED: definition("the task gave up", TaskDeadLettered),
        TASK_CANCEL_REQUESTED: definition("cancel a live task", TaskCancelRequested),
        TASK_CANCELLED: definition("the task was cancelled", TaskCancelled),
        TASK_REJECTED: definition("a request or cancel was refused", TaskRejected),
    },
    processor_deps=[DLQ_EVENTS],
    consumes=[
        TASK_REQUESTED,
        TASK_ATTEMPT_STARTED,
        TASK_SUCCEEDED,
        TASK_ATTEMPT_FAILED,
        TASK_DEAD_LETTERED,
        TASK_CANCEL_REQUESTED,
        TASK_CANCELLED,
        TASK_REJECTED,
    ],
    emits=[
        TASK_ATTEMPT_STARTED,
        TASK_SUCCEEDED,
        TASK_ATTEMPT_FAILED,
        TASK_DEAD_LETTERED,
        TASK_CANCELLED,
        TASK_REJECTED,
        DEAD_LETTERED,
        RECORD_SUCCEEDED,
    ],
)
TASK_EVENT_TYPES: tuple[str, ...] = tuple(TASKS_CONTRACT.events or ())
"""Every event type of the tasks contract (what ``streamkit tasks show`` looks for)."""


# -- helpers for requesters -----------------------------------------------------------


def _invalid(what: str, exc: ValidationError) -> InvalidEvent:
    return InvalidEvent(
        f"{what} is not valid: {exc}; nothing was built or appended",
        details={"error": str(exc)[:1000]},
    )


def task_requested_event(
    *,
    task_id: str,
    name: str,
    args: Mapping[str, Any] | None = None,
    max_attempts: int = 5,
    timeout_s: float = 60.0,
    not_before: float | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """A validated ``task.requested`` event input; raises :class:`~streamkit.InvalidEvent` if bad.

    The default idempotency key ``"tasks/request/<task_id>"`` makes a retried
    request append once; pass your own to request the same id again later.
    """
    try:
        body = TaskRequested(
            task_id=task_id,
            name=name,
            args=dict(args or {}),
            max_attempts=max_attempts,
            timeout_s=timeout_s,
            not_before=not_before,
        )
    except ValidationError as exc:
        raise _invalid("the task request", exc) from exc
    return {
        **named_input(TASKS_CONTRACT, TASK_REQUESTED, body),
        "idempotency_key": idempotency_key or f"{SLUG}/request/{task_id}",
    }


def cancel_requested_event(
    task_id: str, *, reason: str | None = None, requested_by: str | None = None
) -> dict[str, Any]:
    """A validated ``task.cancel-requested`` event input."""
    try:
        body = TaskCancelRequested(task_id=task_id, reason=reason, requested_by=requested_by)
    except ValidationError as exc:
        raise _invalid("the cancel request", exc) from exc
    return named_input(TASKS_CONTRACT, TASK_CANCEL_REQUESTED, body)


# -- handlers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a task handler gets besides its args."""

    task_id: str
    name: str
    attempt: int
    """This attempt's number (1 for the first)."""
    max_attempts: int
    idempotency_key: str
    """Stable for the task run across its attempts: key your side effects with it."""
    request_offset: int
    replay: int | None
    """The DLQ replay number when this run is a replay, else None."""


TaskHandler = Callable[[dict[str, Any], TaskContext], Awaitable[Any]]
"""``async def handler(args, ctx) -> result``: return a JSON value to succeed, raise to fail."""

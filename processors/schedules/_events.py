"""The schedules processor's events and state (internal; re-exported by ``schedules``).

Every change of a schedule and every slot's fate is an event on the log:
``schedule.defined`` / ``paused`` / ``resumed`` / ``deleted`` say what the
schedules are, ``schedule.fired`` that a slot fired (with the task it
requested), ``schedule.missed`` that a run of slots did not fire and why.
The state is folded from them alone: a schedule's ``through`` (every slot
at or before it fired or is on record as missed) moves only when such an
event is reduced, so a host that dies between deciding and appending
decides again, and the idempotency keys keep a slot single.

Instants are epoch seconds (UTC), as ``not_before`` and the engine's clock.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from streamkit.processors._definitions import definition
from streamkit.processors.schedules._schedule import Overlap
from streamkit.processors.schedules._timing import MissedReason
from streamkit.processors.tasks import (
    TASK_CANCEL_REQUESTED,
    TASK_CANCELLED,
    TASK_DEAD_LETTERED,
    TASK_REJECTED,
    TASK_REQUESTED,
    TASK_SUCCEEDED,
    TASKS_CONTRACT,
)

from streamkit import define_processor_contract

__all__ = [
    "LATENESS_KEPT",
    "MAX_BACKFILL",
    "SCHEDULES_CONTRACT",
    "SCHEDULE_BACKFILLED",
    "SCHEDULE_BACKFILL_REQUESTED",
    "SCHEDULE_BUFFERED",
    "SCHEDULE_DEFINED",
    "SCHEDULE_DELETED",
    "SCHEDULE_FIRED",
    "SCHEDULE_MISSED",
    "SCHEDULE_PAUSED",
    "SCHEDULE_RESUMED",
    "TASK_SETTLED",
    "ScheduleBackfillRequested",
    "ScheduleBackfilled",
    "ScheduleBuffered",
    "ScheduleDefined",
    "ScheduleDeleted",
    "ScheduleEntry",
    "ScheduleFired",
    "ScheduleMissed",
    "SchedulePaused",
    "ScheduleResumed",
    "SchedulesState",
]

SLUG = "schedules"

SCHEDULE_DEFINED = "schedule.defined"
SCHEDULE_PAUSED = "schedule.paused"
SCHEDULE_RESUMED = "schedule.resumed"
SCHEDULE_DELETED = "schedule.deleted"
SCHEDULE_FIRED = "schedule.fired"
SCHEDULE_MISSED = "schedule.missed"
SCHEDULE_BUFFERED = "schedule.buffered"
SCHEDULE_BACKFILL_REQUESTED = "schedule.backfill-requested"
SCHEDULE_BACKFILLED = "schedule.backfilled"

MAX_BACKFILL = 1000
"""The most slots one backfill fires (a larger range is refused, nothing fired)."""

LATENESS_KEPT = 100
"""How many of a schedule's latest firings its lateness percentiles are taken over."""

TASK_SETTLED = (TASK_SUCCEEDED, TASK_DEAD_LETTERED, TASK_CANCELLED, TASK_REJECTED)
"""The task outcomes after which a slot's task is no longer running (what overlap waits for)."""


_NAME = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScheduleDefined(_Payload):
    """A schedule as :meth:`~._schedule.Schedule.spec` writes it, and when it was defined."""

    name: str = _NAME
    timing: dict[str, Any]
    action: dict[str, Any]
    catchup: dict[str, Any]
    jitter_s: float = Field(default=0.0, ge=0)
    overlap: Overlap = "skip"
    max_buffered: int = Field(default=100, ge=1, le=10_000)
    defined_at: float
    """Epoch seconds: no slot before it fires (a new schedule does not catch up its past)."""
    by: str | None = None


class SchedulePaused(_Payload):
    name: str = _NAME
    at: float
    by: str | None = None


class ScheduleResumed(_Payload):
    name: str = _NAME
    at: float
    by: str | None = None


class ScheduleDeleted(_Payload):
    name: str = _NAME
    by: str | None = None


class ScheduleFired(_Payload):
    """Slot ``slot`` of ``name`` fired (due at ``fire_at``, its jitter added).

    The body is a function of the definition and the slot only, so a
    decision made again after a crash appends the very same event (its key
    returns it). When it fired is the event's commit time.
    """

    name: str = _NAME
    slot: float
    fire_at: float
    task_id: str | None = None


class ScheduleBackfillRequested(_Payload):
    """Fire the slots of ``name`` from ``first`` to ``last`` (epoch seconds) that did not fire.

    Only slots already decided (at or before the schedule's ``through``) are
    fired: later ones are the schedule's own. A slot that fired before is
    not fired again (its keys return the first firing).
    """

    name: str = _NAME
    first: float
    last: float
    by: str | None = None


class ScheduleBackfilled(_Payload):
    """The backfill requested at ``request_offset`` is done: ``slots`` slots were fired (or kept).

    ``kept``: of those, how many had fired already (under an earlier definition, say) and
    keep their first firing. ``refused`` says why the backfill did not fire its range.
    """

    name: str = _NAME
    request_offset: int = Field(ge=1)
    slots: int = Field(ge=0)
    kept: int = Field(default=0, ge=0)
    refused: str | None = None


class ScheduleBuffered(_Payload):
    """Slot ``slot`` of ``name`` waits for the schedule's running task (overlap ``buffer_*``).

    It fires (``schedule.fired``, same key as ever) once no task of the
    schedule runs.
    """

    name: str = _NAME
    slot: float


class ScheduleMissed(_Payload):
    """``count`` slots of ``name`` from ``first`` to ``last`` did not fire, for ``reason``.

    ``exact`` is False when there were more than could be counted (``count``
    is then a lower bound).
    """

    name: str = _NAME
    reason: MissedReason
    first: float
    last: float
    count: int = Field(ge=1)
    exact: bool = True


class ScheduleEntry(BaseModel):
    """One schedule as the state holds it."""

    definition: ScheduleDefined
    paused: bool = False
    paused_at: float | None = None
    resumed_at: float | None = None
    """When the last pause ended: its slots are recorded as missed for ``paused``."""
    through: float
    """Every slot at or before this instant fired or is on record as missed."""
    fired: int = 0
    missed: int = 0
    last_slot: float | None = None
    """The newest slot that fired."""
    last_fired_at: float | None = None
    """When it fired (its event's commit time, epoch seconds)."""
    missed_by: dict[str, int] = Field(default_factory=dict)
    """Missed slots by reason."""
    lateness: list[float] = Field(default_factory=list)
    """Seconds from each of the last :data:`LATENESS_KEPT` slots' firing instant to its commit."""
    backfill: list[float] | None = None
    """A backfill requested and not done: ``[first, last, request_offset]``."""
    running: list[str] = Field(default_factory=list)
    """The task ids its slots requested that have not settled (what overlap looks at)."""
    buffered: list[float] = Field(default_factory=list)
    """Slots waiting for the running task to settle, oldest first."""


class SchedulesState(BaseModel):
    schedules: dict[str, ScheduleEntry] = Field(default_factory=dict)


SCHEDULES_CONTRACT = define_processor_contract(
    slug=SLUG,
    version="1",
    description="recurring schedules: each slot fired once, or on record as missed",
    state_schema=SchedulesState,
    events={
        SCHEDULE_DEFINED: definition("a schedule is defined or changed", ScheduleDefined),
        SCHEDULE_PAUSED: definition("a schedule is paused", SchedulePaused),
        SCHEDULE_RESUMED: definition("a paused schedule runs again", ScheduleResumed),
        SCHEDULE_DELETED: definition("a schedule is removed", ScheduleDeleted),
        SCHEDULE_FIRED: definition("a slot fired", ScheduleFired),
        SCHEDULE_MISSED: definition("slots did not fire, and why", ScheduleMissed),
        SCHEDULE_BUFFERED: definition("a slot waits for the running task", ScheduleBuffered),
        SCHEDULE_BACKFILL_REQUESTED: definition(
            "fire the missed slots of a range", ScheduleBackfillRequested
        ),
        SCHEDULE_BACKFILLED: definition("a backfill is done", ScheduleBackfilled),
    },
    consumes=[
        SCHEDULE_DEFINED,
        SCHEDULE_PAUSED,
        SCHEDULE_RESUMED,
        SCHEDULE_DELETED,
        SCHEDULE_FIRED,
        SCHEDULE_MISSED,
        SCHEDULE_BUFFERED,
        SCHEDULE_BACKFILL_REQUESTED,
        SCHEDULE_BACKFILLED,
        *TASK_SETTLED,
    ],
    processor_deps=[TASKS_CONTRACT],
    emits=[
        SCHEDULE_FIRED,
        SCHEDULE_MISSED,
        SCHEDULE_BUFFERED,
        SCHEDULE_BACKFILLED,
        TASK_REQUESTED,
        TASK_CANCEL_REQUESTED,
    ],
)

"""What a slot's decision appends: each event keyed by its schedule and slot.

Every event here has an idempotency key built from the schedule's name and
the slot (or the run of slots), and a body that is a function of the
definition and the slot only: a decision made again, after a crash or on
another host, appends nothing new, and the task a slot requests has the id
``sched/NAME/SLOT``, so the tasks processor runs it once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from streamkit.processors.schedules._events import (
    SCHEDULE_BUFFERED,
    SCHEDULE_FIRED,
    SCHEDULE_MISSED,
    ScheduleBuffered,
    ScheduleFired,
    ScheduleMissed,
)
from streamkit.processors.schedules._schedule import RunTask, Schedule, slot_text
from streamkit.processors.schedules._timing import Missed, MissedReason, jitter
from streamkit.processors.tasks import cancel_requested_event, task_requested_event

__all__ = [
    "buffered_event",
    "cancel_event",
    "fired_events",
    "instant",
    "missed_event",
    "missed_runs",
    "seconds",
    "task_id_of",
]


def instant(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def seconds(instant: datetime) -> float:
    return instant.timestamp()


def task_id_of(name: str, slot: datetime) -> str:
    """The id of the task slot ``slot`` of schedule ``name`` requests."""
    return f"sched/{name}/{slot_text(slot)}"


def missed_runs(missed: list[tuple[MissedReason, datetime]]) -> list[Missed]:
    """Consecutive slots missed for the same reason, as one record each."""
    runs: list[Missed] = []
    for reason, slot in missed:
        last = runs[-1] if runs else None
        if last is not None and last.reason == reason:
            runs[-1] = Missed(reason, last.first, slot, last.count + 1)
        else:
            runs.append(Missed(reason, slot, slot, 1))
    return runs


def buffered_event(name: str, slot: datetime) -> dict[str, Any]:
    """``schedule.buffered``: the slot waits for the schedule's running task."""
    body = ScheduleBuffered(name=name, slot=seconds(slot))
    return {
        "type": SCHEDULE_BUFFERED,
        "payload": body.model_dump(mode="json"),
        "idempotency_key": f"schedules/buffered/{name}/{slot_text(slot)}",
    }


def cancel_event(task_id: str, name: str, slot: datetime) -> dict[str, Any]:
    """The cancel request of overlap ``cancel_other``, once per task."""
    event = cancel_requested_event(
        task_id,
        reason=f"schedule {name}: slot {slot_text(slot)} replaces it (overlap cancel_other)",
        requested_by="schedules",
    )
    return {**event, "idempotency_key": f"schedules/cancel/{task_id}"}


def fired_events(schedule: Schedule, slot: datetime) -> list[dict[str, Any]]:
    """What firing ``slot`` appends: ``schedule.fired`` and what it does, keyed by the slot.

    A :class:`RunTask` requests the task ``sched/NAME/SLOT``; an
    :class:`AppendEvent` appends its event with ``metadata.schedule`` and
    ``metadata.slot``.
    """
    at = slot_text(slot)
    action = schedule.action
    task_id = task_id_of(schedule.name, slot) if isinstance(action, RunTask) else None
    fire_at = slot + jitter(schedule.name, slot, schedule.jitter)
    fired = ScheduleFired(
        name=schedule.name, slot=seconds(slot), fire_at=seconds(fire_at), task_id=task_id
    )
    events: list[dict[str, Any]] = [
        {
            "type": SCHEDULE_FIRED,
            "payload": fired.model_dump(mode="json"),
            "idempotency_key": f"schedules/fired/{schedule.name}/{at}",
        }
    ]
    if isinstance(action, RunTask):
        assert task_id is not None
        events.append(
            task_requested_event(
                task_id=task_id,
                name=action.name,
                args=action.args,
                max_attempts=action.max_attempts,
                timeout_s=action.timeout_s,
            )
        )
    else:
        events.append(
            {
                "type": action.type,
                "payload": dict(action.payload),
                "metadata": {"schedule": schedule.name, "slot": at},
                "idempotency_key": f"schedules/event/{schedule.name}/{at}",
            }
        )
    return events


def missed_event(name: str, missed: Missed, reason: str | None = None) -> dict[str, Any]:
    """``schedule.missed`` for one run of slots, keyed by the run (a decision made again appends none)."""
    why = reason or missed.reason
    body = ScheduleMissed.model_validate(
        {
            "name": name,
            "reason": why,
            "first": seconds(missed.first),
            "last": seconds(missed.last),
            "count": missed.count,
            "exact": missed.exact,
        }
    )
    return {
        "type": SCHEDULE_MISSED,
        "payload": body.model_dump(mode="json"),
        "idempotency_key": (
            f"schedules/missed/{name}/{why}/{slot_text(missed.first)}/{slot_text(missed.last)}"
        ),
    }

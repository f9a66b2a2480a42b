"""Changing schedules: the events that define, pause, resume and delete one, and a sync from code.

Definitions are events, so every change is on the log with who made it.
:func:`sync` reconciles the schedules a deploy's code (or config) names with
those the log defines: it appends ``schedule.defined`` only for a schedule
that is new or differs, and deletes only when asked (``prune=True``), so an
old host of a rolling deploy, syncing its older list, can change what it
names but never delete what a newer host added.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from streamkit.processors._definitions import named_input
from streamkit.processors.schedules._events import (
    MAX_BACKFILL,
    SCHEDULE_BACKFILL_REQUESTED,
    SCHEDULE_DEFINED,
    SCHEDULE_DELETED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULES_CONTRACT,
    ScheduleBackfillRequested,
    ScheduleDefined,
    ScheduleDeleted,
    SchedulePaused,
    ScheduleResumed,
)
from streamkit.processors.schedules._schedule import AppendEvent, RunTask, Schedule
from streamkit.processors.schedules._timing import Catchup, Cron, Every

from streamkit import InvalidRequest
from streamkit.log import read_matching, type_matcher
from streamkit.protocols import StreamAccess

__all__ = [
    "Synced",
    "backfill_event",
    "defined_event",
    "definitions",
    "deleted_event",
    "instant_of",
    "paused_event",
    "resumed_event",
    "schedule_from_request",
    "sync",
]


def defined_event(
    schedule: Schedule, *, at: float | None = None, by: str | None = None
) -> dict[str, Any]:
    """``schedule.defined`` for ``schedule``; no slot before ``at`` (now) fires."""
    body = ScheduleDefined(
        **schedule.spec(), defined_at=time.time() if at is None else at, by=_who(by)
    )
    return named_input(SCHEDULES_CONTRACT, SCHEDULE_DEFINED, body)


def paused_event(name: str, *, at: float | None = None, by: str | None = None) -> dict[str, Any]:
    """``schedule.paused``: from ``at`` (now) its slots are recorded as missed, not fired."""
    body = SchedulePaused(name=name, at=time.time() if at is None else at, by=_who(by))
    return named_input(SCHEDULES_CONTRACT, SCHEDULE_PAUSED, body)


def resumed_event(name: str, *, at: float | None = None, by: str | None = None) -> dict[str, Any]:
    """``schedule.resumed``: slots after ``at`` (now) fire again."""
    body = ScheduleResumed(name=name, at=time.time() if at is None else at, by=_who(by))
    return named_input(SCHEDULES_CONTRACT, SCHEDULE_RESUMED, body)


def backfill_event(
    schedule: Schedule, first: datetime, last: datetime, *, by: str | None = None
) -> dict[str, Any]:
    """``schedule.backfill-requested``: fire the slots from ``first`` to ``last`` that did not.

    Refused (InvalidRequest, nothing appended) when ``first`` is after
    ``last``, an instant has no zone, or the range holds more than
    :data:`~._events.MAX_BACKFILL` slots.
    """
    for label, instant in (("from", first), ("to", last)):
        if instant.tzinfo is None:
            raise InvalidRequest(
                f"backfill {label} {instant.isoformat()} has no time zone (write it with Z or "
                "an offset); nothing was appended",
                details={"field": label},
            )
    if first > last:
        raise InvalidRequest(
            f"backfill from {first.isoformat()} is after to {last.isoformat()}; nothing was "
            "appended",
            details={"field": "from"},
        )
    try:
        before = first - timedelta(seconds=1)
    except OverflowError:
        before = first  # the calendar's first second: nothing lies before it
    try:
        slots = schedule.timing.count(before, last, MAX_BACKFILL + 1)
    except OverflowError:
        slots = MAX_BACKFILL + 1  # a walk off the calendar's end: a range far too long
    if slots > MAX_BACKFILL:
        raise InvalidRequest(
            f"the backfill range of schedule {schedule.name!r} holds more than {MAX_BACKFILL} "
            "slots; ask for a shorter one; nothing was appended",
            details={"name": schedule.name, "most": MAX_BACKFILL},
        )
    body = ScheduleBackfillRequested(
        name=schedule.name, first=first.timestamp(), last=last.timestamp(), by=_who(by)
    )
    return named_input(SCHEDULES_CONTRACT, SCHEDULE_BACKFILL_REQUESTED, body)


MAX_BY = 200
"""The longest ``by`` (who made a change) a schedule event takes."""


def _who(by: Any) -> str | None:
    """``by`` as recorded: None or a string of at most :data:`MAX_BY` characters."""
    if by is None or (isinstance(by, str) and len(by) <= MAX_BY):
        return by
    raise InvalidRequest(
        f'"by" (who made the change) must be a string of at most {MAX_BY} characters, got '
        f"{type(by).__name__}; nothing was appended",
        details={"field": "by"},
    )


def instant_of(text: str, what: str) -> datetime:
    """An ISO 8601 instant with its zone (``2026-05-01T00:00:00Z``); InvalidRequest else."""
    try:
        instant = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except (AttributeError, ValueError) as exc:
        raise InvalidRequest(
            f"{what} {text!r} is not an ISO 8601 instant (such as 2026-05-01T03:00:00Z); "
            "nothing was appended",
            details={"field": what},
        ) from exc
    if instant.tzinfo is None:
        raise InvalidRequest(
            f"{what} {text!r} has no time zone (write it with Z or an offset); nothing was "
            "appended",
            details={"field": what},
        )
    return instant


def deleted_event(name: str, *, by: str | None = None) -> dict[str, Any]:
    """``schedule.deleted``: the schedule fires no more (its history stays on the log)."""
    body = ScheduleDeleted(name=name, by=_who(by))
    return named_input(SCHEDULES_CONTRACT, SCHEDULE_DELETED, body)


_NOT_COMPARED = {"defined_at", "by"}
"""What a definition records that is not the schedule itself."""


_REQUEST_FIELDS = frozenset(
    {
        "name", "cron", "every", "tz", "gap", "fold", "task", "args", "max_attempts",
        "timeout_s", "event", "payload", "catchup", "window", "max_runs", "jitter", "overlap",
        "max_buffered", "by",
    }
)  # fmt: skip


def schedule_from_request(fields: Mapping[str, Any]) -> Schedule:
    """The schedule a request names (the CLI's ``add``, ``POST /v1/schedules``).

    ``name``, one of ``cron`` (with ``tz``, ``gap``, ``fold``) or ``every``,
    one of ``task`` (with ``args``, ``max_attempts``, ``timeout_s``) or
    ``event`` (with ``payload``), and
    optionally ``catchup``, ``window``, ``max_runs``, ``jitter``,
    ``overlap``, ``max_buffered``. InvalidRequest names what is wrong.
    """
    unknown = sorted(set(fields) - _REQUEST_FIELDS)
    if unknown:
        raise InvalidRequest(
            f"a schedule request does not take {', '.join(map(repr, unknown))}; no schedule was "
            "made",
            details={"unknown": unknown},
        )
    if ("cron" in fields) == ("every" in fields):
        raise InvalidRequest(
            'a schedule request names exactly one of "cron" and "every"; no schedule was made',
            details={"field": "timing"},
        )
    if ("task" in fields) == ("event" in fields) or not isinstance(
        fields.get("task", fields.get("event")), str
    ):
        raise InvalidRequest(
            'a schedule request names exactly one of "task" (the task each slot requests) and '
            '"event" (the type of the event each slot appends); no schedule was made',
            details={"field": "action"},
        )
    for field in ("args", "payload"):
        if not isinstance(fields.get(field, {}), Mapping):
            raise InvalidRequest(
                f'"{field}" must be an object; no schedule was made', details={"field": field}
            )
    action: RunTask | AppendEvent = (
        RunTask(
            fields["task"],
            dict(fields.get("args", {})),
            max_attempts=fields.get("max_attempts", 5),
            timeout_s=fields.get("timeout_s", 60.0),
        )
        if "task" in fields
        else AppendEvent(fields["event"], dict(fields.get("payload", {})))
    )
    timing: Every | Cron = (
        Every(fields["every"])
        if "every" in fields
        else Cron(
            fields["cron"],
            tz=fields.get("tz", "UTC"),
            gap=fields.get("gap", "shift"),
            fold=fields.get("fold", "first"),
        )
    )
    return Schedule(
        fields.get("name", ""),
        timing,
        action=action,
        catchup=Catchup(
            fields.get("catchup", "skip"),
            window=fields.get("window"),
            max_runs=fields.get("max_runs", 100),
        ),
        jitter=fields.get("jitter", "0s"),
        overlap=fields.get("overlap", "skip"),
        max_buffered=fields.get("max_buffered", 100),
    )


def _definition(payload: Any) -> ScheduleDefined:
    return payload if isinstance(payload, ScheduleDefined) else ScheduleDefined(**payload)


async def definitions(stream: StreamAccess) -> dict[str, ScheduleDefined]:
    """The schedules ``stream`` defines now (its defined and deleted events, in order).

    Reads the stream through (a filtered read: bounded work per page).
    """
    wanted = type_matcher([SCHEDULE_DEFINED, SCHEDULE_DELETED])
    found: dict[str, ScheduleDefined] = {}
    after = 0
    while True:
        page = await read_matching(stream.read, after, 1000, wanted)
        for event in page.events:
            if event.type == SCHEDULE_DEFINED:
                defined = _definition(event.payload)
                found[defined.name] = defined
            else:
                payload = event.payload
                name = payload.get("name") if isinstance(payload, Mapping) else payload.name
                found.pop(str(name), None)
        if page.at_head or page.scanned_through_offset <= after:
            return found
        after = page.scanned_through_offset


@dataclass(frozen=True)
class Synced:
    """What a :func:`sync` appended: names defined anew, changed, deleted, and left as they were."""

    added: tuple[str, ...]
    changed: tuple[str, ...]
    deleted: tuple[str, ...]
    unchanged: tuple[str, ...]


async def sync(
    stream: StreamAccess,
    schedules: Iterable[Schedule],
    *,
    prune: bool = False,
    clock: Callable[[], float] = time.time,
    dry_run: bool = False,
    by: str = "sync",
) -> Synced:
    """Make ``stream`` define ``schedules``: append only what differs (see the module).

    A name given twice is refused (InvalidRequest, nothing appended).
    ``prune=True`` deletes the schedules the log defines and the list does
    not name. All changes are one append; ``dry_run`` appends nothing and
    says what would change.
    """
    wanted: dict[str, Schedule] = {}
    for schedule in schedules:
        if schedule.name in wanted:
            raise InvalidRequest(
                f"schedule {schedule.name!r} is named twice in the list to sync; nothing was "
                "appended",
                details={"name": schedule.name},
            )
        wanted[schedule.name] = schedule
    current = await definitions(stream)
    now = clock()
    events: list[dict[str, Any]] = []
    added: list[str] = []
    changed: list[str] = []
    unchanged: list[str] = []
    for name, schedule in wanted.items():
        defined = current.get(name)
        if defined is None:
            added.append(name)
        elif defined.model_dump(exclude=_NOT_COMPARED) != ScheduleDefined(
            **schedule.spec(), defined_at=0.0
        ).model_dump(exclude=_NOT_COMPARED):
            changed.append(name)
        else:
            unchanged.append(name)
            continue
        events.append(defined_event(schedule, at=now, by=by))
    deleted = sorted(set(current) - set(wanted)) if prune else []
    events += [deleted_event(name, by=by) for name in deleted]
    if events and not dry_run:
        await stream.append(*events)
    return Synced(tuple(added), tuple(changed), tuple(deleted), tuple(unchanged))

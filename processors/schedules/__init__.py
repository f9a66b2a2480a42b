"""Recurring schedules: each slot fired once across hosts, or on record as missed, with DST rules.

A :class:`Schedule` names a timing (:class:`Every`, :class:`Cron`), what a
slot does (:class:`RunTask`: a run of the tasks processor whose task id is
made from the slot), its catch-up (:class:`Catchup`) and its jitter. Its
definition is a ``schedule.defined`` event (:func:`defined_event`), and the
:class:`SchedulesProcessor` fires each slot once (``schedule.fired`` plus
the task request, keyed by the slot) or records it as missed
(``schedule.missed``, with the reason). The time rules, daylight saving
time included, are in :mod:`._timing`; the once-per-slot argument in
:mod:`._processor`. ``Cron`` needs the ``schedules`` extra (``pip install
'streamkit-events[schedules]'``: cronsim, and tzdata where the system has
no zone database).
"""

from streamkit.processors.schedules._events import (
    SCHEDULE_DEFINED,
    SCHEDULE_DELETED,
    SCHEDULE_FIRED,
    SCHEDULE_MISSED,
    SCHEDULE_PAUSED,
    SCHEDULE_RESUMED,
    SCHEDULES_CONTRACT,
    ScheduleDefined,
    ScheduleDeleted,
    ScheduleEntry,
    ScheduleFired,
    ScheduleMissed,
    SchedulePaused,
    ScheduleResumed,
    SchedulesState,
)
from streamkit.processors.schedules._processor import SchedulesProcessor
from streamkit.processors.schedules._requests import (
    Synced,
    backfill_event,
    defined_event,
    definitions,
    deleted_event,
    paused_event,
    resumed_event,
    sync,
)
from streamkit.processors.schedules._schedule import AppendEvent, RunTask, Schedule, schedule_of
from streamkit.processors.schedules._timing import (
    Catchup,
    Cron,
    Due,
    Every,
    Missed,
    Timing,
    due,
    jitter,
    parse_duration,
)

__all__ = [
    "SCHEDULES_CONTRACT",
    "SCHEDULE_DEFINED",
    "SCHEDULE_DELETED",
    "SCHEDULE_FIRED",
    "SCHEDULE_MISSED",
    "SCHEDULE_PAUSED",
    "SCHEDULE_RESUMED",
    "AppendEvent",
    "Catchup",
    "Cron",
    "Due",
    "Every",
    "Missed",
    "RunTask",
    "Schedule",
    "ScheduleDefined",
    "ScheduleDeleted",
    "ScheduleEntry",
    "ScheduleFired",
    "ScheduleMissed",
    "SchedulePaused",
    "ScheduleResumed",
    "SchedulesProcessor",
    "SchedulesState",
    "Synced",
    "Timing",
    "backfill_event",
    "defined_event",
    "definitions",
    "deleted_event",
    "due",
    "jitter",
    "parse_duration",
    "paused_event",
    "resumed_event",
    "schedule_of",
    "sync",
]

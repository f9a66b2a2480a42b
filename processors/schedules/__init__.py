"""Recurring schedules: the time rules (slots, DST, catch-up, jitter) of ``streamkit.processors.schedules``.

``Every`` and ``Cron`` make a schedule's slots, ``Catchup`` says which of the
slots that came due fire, and :func:`due` decides one evaluation from now
(see :mod:`._timing` for the rules, daylight saving time included). ``Cron``
needs the ``schedules`` extra (``pip install 'streamkit-events[schedules]'``:
cronsim, and tzdata where the system has no zone database).
"""

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
    "Catchup",
    "Cron",
    "Due",
    "Every",
    "Missed",
    "Timing",
    "due",
    "jitter",
    "parse_duration",
]

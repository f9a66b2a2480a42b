"""The last hour of one processor, a minute at a time: what the admin page charts.

:class:`MinuteSeries` keeps, for each of the last :data:`MINUTES` minutes
(by this host's monotonic clock), how many events the processor reduced and
how many of its batches failed. It is fixed-size (a ring of counters), so a
host that runs for months keeps constant memory; a minute with no batch
reads 0, and minutes before this host ran it are not shown as 0 but left
out (``series()`` starts where the host began counting). Nothing here does
I/O or raises.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MINUTES", "MinuteSeries"]

MINUTES = 60
"""How many minutes the series keeps."""


class MinuteSeries:
    """Events and failed batches per minute over the last hour (see the module)."""

    __slots__ = ("_events", "_failures", "_first", "_minute")

    def __init__(self, now_monotonic: float) -> None:
        minute = int(now_monotonic // 60)
        self._first = minute
        self._minute = minute
        self._events = [0] * MINUTES
        self._failures = [0] * MINUTES

    def _roll(self, now_monotonic: float) -> int:
        """Clear the minutes passed since the last count; the slot of the minute now."""
        minute = int(now_monotonic // 60)
        if minute > self._minute:
            for passed in range(self._minute + 1, min(minute, self._minute + MINUTES) + 1):
                self._events[passed % MINUTES] = 0
                self._failures[passed % MINUTES] = 0
            self._minute = minute
        return minute % MINUTES

    def events(self, count: int, now_monotonic: float) -> None:
        """``count`` events were reduced now."""
        self._events[self._roll(now_monotonic)] += count

    def failure(self, now_monotonic: float) -> None:
        """A batch failed now."""
        self._failures[self._roll(now_monotonic)] += 1

    def series(self, now_monotonic: float) -> dict[str, Any]:
        """``{minutes, events, failures}``: oldest first, the minute now last."""
        self._roll(now_monotonic)
        minute = self._minute
        shown = min(MINUTES, minute - self._first + 1)
        slots = [(minute - back) % MINUTES for back in range(shown - 1, -1, -1)]
        return {
            "minutes": shown,
            "events": [self._events[slot] for slot in slots],
            "failures": [self._failures[slot] for slot in slots],
        }

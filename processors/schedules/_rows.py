"""Each schedule of a schedules state as operators read it: the one view of the CLI, HTTP and /metrics.

A row is the state's entry plus what is derived from it and not stored:
the next slot (None while paused, or for a definition that does not build)
and the lateness percentiles over the firings the state keeps.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from streamkit.processors.schedules._schedule import schedule_of

from streamkit import InvalidRequest

__all__ = ["next_slot", "percentile", "schedule_rows"]


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile ``q`` of ``values`` (None for none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def next_slot(entry: dict[str, Any]) -> float | None:
    """The first slot after the entry's ``through`` (epoch seconds); None while paused."""
    if entry.get("paused"):
        return None
    try:
        schedule = schedule_of(entry["definition"])
    except InvalidRequest:
        return None
    for slot in schedule.timing.forward(datetime.fromtimestamp(entry["through"], UTC)):
        return slot.timestamp()
    return None


def refusal(entry: dict[str, Any]) -> str | None:
    """Why the processor refuses the entry's definition (it fires nothing), or None."""
    try:
        schedule_of(entry["definition"])
    except InvalidRequest as exc:
        return exc.message
    return None


def schedule_rows(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each schedule of a schedules state (as JSON), by name, with ``next_slot`` and lateness."""
    entries = (state or {}).get("schedules") or {}
    rows = []
    for name in sorted(entries):
        entry = entries[name]
        lateness = list(entry.get("lateness") or [])
        rows.append(
            {
                **{k: v for k, v in entry.items() if k != "lateness"},
                "name": name,
                "next_slot": next_slot(entry),
                "refused": refusal(entry),
                "lateness_p50": percentile(lateness, 0.5),
                "lateness_p99": percentile(lateness, 0.99),
            }
        )
    return rows

"""A schedule's definition: its name, its timing, what a slot does, its catch-up and jitter.

:class:`Schedule` is what a user writes in code; :meth:`Schedule.spec` is
the JSON a ``schedule.defined`` event records, and :func:`schedule_of`
builds the same schedule back from it, so a definition read from the log
computes the very slots the code would. A name is a short word of letters,
digits and ``._:-``: it is part of every idempotency key and task id a slot
makes, so it must never need escaping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from streamkit.processors.schedules._timing import Catchup, Cron, Every, parse_duration

from streamkit.errors import InvalidRequest

__all__ = ["Action", "RunTask", "Schedule", "schedule_of", "slot_text"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def slot_text(slot: datetime) -> str:
    """A slot as it appears in keys and task ids: UTC, to the second, ``Z``-suffixed."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class RunTask:
    """A slot requests a run of task ``name`` (the tasks processor), its id made from the slot."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    max_attempts: int = 5
    timeout_s: float = 60.0

    def spec(self) -> dict[str, Any]:
        return {
            "kind": "run_task",
            "name": self.name,
            "args": dict(self.args),
            "max_attempts": self.max_attempts,
            "timeout_s": self.timeout_s,
        }


Action = RunTask
"""What a slot does (a task run; more kinds may come)."""


@dataclass(frozen=True, init=False)
class Schedule:
    """``name`` fires ``action`` at each slot of ``timing`` (see :mod:`._timing` for the rules).

    ``catchup`` decides the slots that came due while nothing evaluated
    them (default: skip those more than a minute old); ``jitter`` delays
    each slot by a fixed fraction of it, the same on every host.
    """

    name: str
    timing: Every | Cron
    action: Action
    catchup: Catchup
    jitter: timedelta

    def __init__(
        self,
        name: str,
        timing: Every | Cron,
        *,
        action: Action,
        catchup: Catchup | None = None,
        jitter: str | timedelta = timedelta(0),
    ) -> None:
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise InvalidRequest(
                f"schedule name {name!r} is refused: 1 to 128 letters, digits and ._:- "
                "(starting with a letter or digit); it is part of every key a slot makes; no schedule was made",
                details={"field": "name", "value": repr(name)},
            )
        if not isinstance(timing, Every | Cron):
            raise InvalidRequest(
                f"schedule {name!r}: its timing must be an Every or a Cron, got "
                f"{type(timing).__name__}; no schedule was made",
                details={"field": "timing", "name": name},
            )
        if not isinstance(action, RunTask):
            raise InvalidRequest(
                f"schedule {name!r}: its action must be a RunTask, got {type(action).__name__}; no schedule was made",
                details={"field": "action", "name": name},
            )
        catchup = catchup or Catchup()
        delay = parse_duration(jitter, "jitter")
        if delay and delay >= catchup.window:
            raise InvalidRequest(
                f"schedule {name!r}: its jitter ({delay}) is not shorter than its catch-up "
                f"window ({catchup.window}); a slot would miss its window waiting for its jitter; no schedule was made",
                details={"field": "jitter", "name": name},
            )
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "timing", timing)
        object.__setattr__(self, "action", action)
        object.__setattr__(self, "catchup", catchup)
        object.__setattr__(self, "jitter", delay)

    def spec(self) -> dict[str, Any]:
        """The definition as JSON (a ``schedule.defined`` payload without ``defined_at``)."""
        catchup = self.catchup
        return {
            "name": self.name,
            "timing": self.timing.spec(),
            "action": self.action.spec(),
            "catchup": {
                "policy": catchup.policy,
                "window_s": catchup.window.total_seconds(),
                "max_runs": catchup.max_runs,
            },
            "jitter_s": self.jitter.total_seconds(),
        }


def schedule_of(spec: Mapping[str, Any]) -> Schedule:
    """The :class:`Schedule` a ``schedule.defined`` payload records (InvalidRequest if malformed)."""
    try:
        timing_spec = spec["timing"]
        timing: Every | Cron
        if "cron" in timing_spec:
            timing = Cron(
                timing_spec["cron"],
                tz=timing_spec.get("tz", "UTC"),
                gap=timing_spec.get("gap", "shift"),
                fold=timing_spec.get("fold", "first"),
            )
        else:
            anchor = timing_spec.get("anchor")
            timing = Every(
                timedelta(seconds=float(timing_spec["every_seconds"])),
                anchor=None if anchor is None else datetime.fromisoformat(anchor),
            )
        action_spec = spec["action"]
        if action_spec["kind"] != "run_task":
            raise ValueError(f"unknown action kind {action_spec['kind']!r}")
        action = RunTask(
            action_spec["name"],
            action_spec.get("args", {}),
            int(action_spec.get("max_attempts", 5)),
            float(action_spec.get("timeout_s", 60.0)),
        )
        catchup_spec = spec["catchup"]
        return Schedule(
            spec["name"],
            timing,
            action=action,
            catchup=Catchup(
                catchup_spec["policy"],
                window=timedelta(seconds=float(catchup_spec["window_s"])),
                max_runs=int(catchup_spec["max_runs"]),
            ),
            jitter=timedelta(seconds=float(spec.get("jitter_s", 0.0))),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(
            f"a schedule definition is malformed ({type(exc).__name__}: {exc}); no schedule was made",
            details={"error": str(exc)[:500]},
        ) from exc

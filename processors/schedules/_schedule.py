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
from typing import Any, Literal, get_args

from pydantic import ValidationError
from streamkit.processors.schedules._timing import Catchup, Cron, Every, parse_duration
from streamkit.processors.tasks import TaskRequested

from streamkit.errors import InvalidRequest

__all__ = ["Action", "AppendEvent", "Overlap", "RunTask", "Schedule", "schedule_of", "slot_text"]

Overlap = Literal["skip", "buffer_one", "buffer_all", "allow_all", "cancel_other"]
"""What a slot does while the task of an earlier slot still runs (see :class:`Schedule`)."""

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

    def __post_init__(self) -> None:
        # The request each slot sends is checked here, by the tasks processor's own model:
        # one it would refuse would fail every pass of the schedules processor.
        try:
            checked = TaskRequested(
                task_id="sched/check",
                name=self.name,
                args=self.args,
                max_attempts=self.max_attempts,
                timeout_s=self.timeout_s,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = str(first["loc"][0]) if first["loc"] else "task"
            shown = "task" if where == "name" else where
            raise InvalidRequest(
                f"the task request each slot would send is refused by the tasks processor: "
                f"{shown} {str(first.get('input'))[:100]!r}: {first['msg']}; no schedule was made",
                details={"field": shown},
            ) from None
        object.__setattr__(self, "args", checked.args)
        object.__setattr__(self, "max_attempts", checked.max_attempts)
        object.__setattr__(self, "timeout_s", checked.timeout_s)

    def spec(self) -> dict[str, Any]:
        return {
            "kind": "run_task",
            "name": self.name,
            "args": dict(self.args),
            "max_attempts": self.max_attempts,
            "timeout_s": self.timeout_s,
        }


@dataclass(frozen=True)
class AppendEvent:
    """A slot appends one event of ``type`` with ``payload``, keyed by the slot.

    The event carries ``metadata.schedule`` and ``metadata.slot``. Its type
    must be one the processor may emit: defined by a contract given to
    :class:`~._processor.SchedulesProcessor` (``emits``); a slot of a type
    it may not emit is missed, reason ``undeclared``.
    """

    type: str
    payload: Mapping[str, Any] = field(default_factory=dict)

    def spec(self) -> dict[str, Any]:
        return {"kind": "append_event", "type": self.type, "payload": dict(self.payload)}


Action = RunTask | AppendEvent
"""What a slot does: request a task run, or append an event."""


@dataclass(frozen=True, init=False)
class Schedule:
    """``name`` fires ``action`` at each slot of ``timing`` (see :mod:`._timing` for the rules).

    ``catchup`` decides the slots that came due while nothing evaluated
    them (default: skip those more than a minute old); ``jitter`` delays
    each slot by a fixed fraction of it, the same on every host.

    ``overlap`` says what a slot does while the task an earlier slot
    requested has not settled: ``"skip"`` (the default: the slot is missed,
    reason ``overlap``), ``"buffer_one"`` (it waits for the task, one slot at
    most; more are missed, ``buffer_full``), ``"buffer_all"`` (they wait, up
    to ``max_buffered``), ``"allow_all"`` (it fires anyway) or
    ``"cancel_other"`` (the running task is cancelled and the slot fires).
    """

    name: str
    timing: Every | Cron
    action: Action
    catchup: Catchup
    jitter: timedelta
    overlap: Overlap
    max_buffered: int

    def __init__(
        self,
        name: str,
        timing: Every | Cron,
        *,
        action: Action,
        catchup: Catchup | None = None,
        jitter: str | timedelta = timedelta(0),
        overlap: Overlap = "skip",
        max_buffered: int = 100,
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
        if not isinstance(action, RunTask | AppendEvent):
            raise InvalidRequest(
                f"schedule {name!r}: its action must be a RunTask or an AppendEvent, got "
                f"{type(action).__name__}; no schedule was made",
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
        if overlap not in get_args(Overlap):
            raise InvalidRequest(
                f"schedule {name!r}: overlap {overlap!r} is none of "
                f"{', '.join(get_args(Overlap))}; no schedule was made",
                details={"field": "overlap", "name": name},
            )
        if (
            not isinstance(max_buffered, int)
            or isinstance(max_buffered, bool)
            or not 1 <= max_buffered <= 10_000
        ):
            raise InvalidRequest(
                f"schedule {name!r}: max_buffered {max_buffered!r} is not a whole number from 1 "
                "to 10,000; no schedule was made",
                details={"field": "max_buffered", "name": name},
            )
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "timing", timing)
        object.__setattr__(self, "action", action)
        object.__setattr__(self, "catchup", catchup)
        object.__setattr__(self, "jitter", delay)
        object.__setattr__(self, "overlap", overlap)
        object.__setattr__(self, "max_buffered", max_buffered)

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
            "overlap": self.overlap,
            "max_buffered": self.max_buffered,
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
        action: Action
        if action_spec["kind"] == "run_task":
            action = RunTask(
                action_spec["name"],
                action_spec.get("args", {}),
                int(action_spec.get("max_attempts", 5)),
                float(action_spec.get("timeout_s", 60.0)),
            )
        elif action_spec["kind"] == "append_event":
            action = AppendEvent(action_spec["type"], action_spec.get("payload", {}))
        else:
            raise ValueError(f"unknown action kind {action_spec['kind']!r}")
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
            overlap=spec.get("overlap", "skip"),
            max_buffered=int(spec.get("max_buffered", 100)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(
            f"a schedule definition is malformed ({type(exc).__name__}: {exc}); no schedule was made",
            details={"error": str(exc)[:500]},
        ) from exc

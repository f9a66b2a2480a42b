"""Holds and forgetting: the operator verbs on retention, and the control events that record them.

Each verb writes its record and a reserved control event on the path in ONE
transaction, so the log itself says who changed what retention may take,
when and why:

- ``streamkit.hold-placed`` ``{name, from, until, by, reason}``: an operator
  holds a path's history from an offset on (until a time, or until released);
- ``streamkit.hold-released`` ``{name, from, by, reason}``: that hold ends;
- ``streamkit.processor-forgotten`` ``{slug, versions, by, reason}``: the
  checkpoint rows of a processor removed for good are deleted, so they hold
  history back no longer (``versions`` lists each with the cursor it had and
  the offset it needed).

:func:`check_hold` refuses a malformed hold before anything is written.
"""

from __future__ import annotations

import math

from streamkit.errors import InvalidRequest
from streamkit.events import MAX_OFFSET, validate_path
from streamkit.horizon import Hold

__all__ = [
    "HOLD_PLACED",
    "HOLD_RELEASED",
    "MAX_HOLD_NAME",
    "PROCESSOR_FORGOTTEN",
    "check_hold",
    "check_reason",
]

HOLD_PLACED = "streamkit.hold-placed"
HOLD_RELEASED = "streamkit.hold-released"
PROCESSOR_FORGOTTEN = "streamkit.processor-forgotten"

MAX_HOLD_NAME = 100
"""The longest hold name (characters)."""

_MAX_TEXT = 1000


def check_reason(by: object, reason: object, action: str) -> tuple[str, str]:
    """``(by, reason)`` if both are non-empty text, else InvalidRequest naming ``action``."""
    for name, value in (("by", by), ("reason", reason)):
        if not isinstance(value, str) or not value.strip() or len(value) > _MAX_TEXT:
            raise InvalidRequest(
                f"{action} refused: {name} must be non-empty text of at most {_MAX_TEXT} "
                f"characters (it goes into the log as the record of who did it and why), got "
                f"{value!r:.80}; nothing was written",
                details={"field": name},
            )
    assert isinstance(by, str)
    assert isinstance(reason, str)
    return by, reason


def check_hold(
    path: object,
    name: object,
    from_offset: object,
    until: object,
    by: object,
    reason: object,
    now: float,
) -> Hold:
    """The hold an operator asked for, checked; InvalidRequest (nothing written) if malformed."""
    checked_path = validate_path(path)
    problem: str | None = None
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > MAX_HOLD_NAME
        or not name.isprintable()
    ):
        problem = (
            f"the hold's name must be printable text of 1 to {MAX_HOLD_NAME} characters, "
            f"got {name!r:.120}"
        )
    elif (
        isinstance(from_offset, bool)
        or not isinstance(from_offset, int)
        or not 1 <= from_offset <= MAX_OFFSET
    ):
        problem = f"the offset a hold keeps from must be an integer >= 1, got {from_offset!r:.80}"
    elif until is not None and (
        isinstance(until, bool)
        or not isinstance(until, int | float)
        or not math.isfinite(until)
        or until <= now
    ):
        problem = f"a hold's end must be a time in the future (epoch seconds), got {until!r:.80}"
    if problem is not None:
        raise InvalidRequest(
            f"hold on {checked_path!r} refused: {problem}; nothing was written",
            details={"path": checked_path},
        )
    checked_by, checked_reason = check_reason(by, reason, f"hold on {checked_path!r}")
    assert isinstance(name, str)
    assert isinstance(from_offset, int)
    return Hold(
        checked_path,
        name,
        from_offset,
        None if until is None else float(until),  # type: ignore[arg-type]
        checked_by,
        checked_reason,
        now,
    )

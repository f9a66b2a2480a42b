"""How long a path's idempotency keys answer once retention has taken their events.

While an event is in the log its key answers every retry, always. Once
retention takes the event (archived or deleted) the key's row stays and still
answers (:mod:`streamkit.backends._keys`): forever by default. An operator may
give a path a *key window* instead: a key whose event was taken and is older
than the window is forgotten by the next retention run of the path, and a
retry of it after that appends a new event. A key is therefore remembered for
at least the window and at least as long as its event is in the log.

Both changes are recorded in the log by reserved control events, written in
the transaction that makes them:

- ``streamkit.key-window-set`` ``{keep_for, previous, by, reason}``: the
  window set (seconds; null: forever, the default) and the one it replaced;
- ``streamkit.keys-forgotten`` ``{count, created_before, keep_for}``: a run
  forgot ``count`` keys of events created before that instant.

A window shorter than :data:`MIN_KEY_WINDOW` is refused: retries come within
seconds or hours, and a shorter window is far more likely a unit mistake
than a wish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamkit.errors import InvalidRequest

__all__ = [
    "KEYS_FORGOTTEN",
    "KEY_WINDOW_SET",
    "MIN_KEY_WINDOW",
    "KeyWindow",
    "check_key_window",
]

KEY_WINDOW_SET = "streamkit.key-window-set"
KEYS_FORGOTTEN = "streamkit.keys-forgotten"

MIN_KEY_WINDOW = 3600.0
"""The shortest key window accepted (seconds): one hour."""


@dataclass(frozen=True, slots=True)
class KeyWindow:
    """A path's key window, as its row records it."""

    path: str
    keep_for: float
    """Seconds a key of a taken event is remembered, counted from the event's ``created_at``."""
    set_by: str
    reason: str
    set_at: float

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "keep_for": self.keep_for,
            "set_by": self.set_by,
            "reason": self.reason,
            "set_at": self.set_at,
        }


def check_key_window(path: str, keep_for: object) -> float | None:
    """``keep_for`` as seconds (None: forever), or InvalidRequest saying why nothing was written."""
    if keep_for is None:
        return None
    if (
        isinstance(keep_for, bool)
        or not isinstance(keep_for, int | float)
        or not math.isfinite(keep_for)
        or keep_for < MIN_KEY_WINDOW
    ):
        raise InvalidRequest(
            f"the key window of {path!r} must be a number of seconds of at least "
            f"{MIN_KEY_WINDOW:g} (one hour), or forever; got {keep_for!r}; nothing was written",
            details={"path": path, "keep_for": repr(keep_for), "least": MIN_KEY_WINDOW},
        )
    return float(keep_for)

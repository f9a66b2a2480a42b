"""The ``created_at`` stamps a writer gives its commits: never earlier than one it used or saw.

Fixed-width ISO stamps compare in time order as strings, so a writer keeps
the latest stamp it used or saw committed (by itself or another writer) and
stamps each commit with the clock or that, whichever is later: a clock that
steps back, here or in another process, never makes a later commit look
older.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from streamkit._timestamps import format_timestamp, now_timestamp
from streamkit.protocols import Clock

__all__ = ["Stamps"]


class Stamps:
    """The stamps of one writer (see the module docstring)."""

    __slots__ = ("_clock", "latest")

    def __init__(self, clock: Clock) -> None:
        # The default clock is read as integer nanoseconds (cheaper to format);
        # any other clock through format_timestamp.
        self._clock: Callable[[], str] = (
            now_timestamp if clock is time.time else lambda: format_timestamp(clock())
        )
        self.latest = ""
        """The latest stamp used or seen committed."""

    def stamp(self) -> str:
        """The stamp for a commit made now: the clock, or the latest stamp if that is later."""
        self.latest = max(self._clock(), self.latest)
        return self.latest

    def saw(self, stamp: str) -> None:
        """A commit stamped ``stamp`` is in the log: no later commit is stamped earlier."""
        if stamp > self.latest:
            self.latest = stamp

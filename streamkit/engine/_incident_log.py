"""One log line per kind of skipped event per interval, not one per event.

A processor that chose ``"skip"`` may meet thousands of events it cannot
fold in one catch-up (every ``order.placed`` of a release its model no
longer reads): a line per event would bury the log, and the host with it.
:class:`IncidentLog` logs the first event of each kind (a stored type and
payload version, or a type whose reduce raised) at once, with its
traceback, then at most one line per kind every :data:`EVERY` seconds,
saying how many were skipped since the last line and their first offsets.
Nothing is lost by it: the exact counts and first offsets are in
``status`` and ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, Final

__all__ = ["EVERY", "IncidentLog"]

EVERY: Final = 60.0
"""The most often one kind of skipped event is logged again, in seconds."""

_FIRST_OFFSETS: Final = 5


class IncidentLog:
    """Aggregated lines for one fold's skipped events (see the module)."""

    def __init__(self, write: Callable[..., None], clock: Callable[[], float] = time.monotonic):
        self._write = write
        self._clock = clock
        # Per kind: when its last line was written, and what was skipped since.
        self._last: dict[Hashable, float] = {}
        self._since: dict[Hashable, list[int]] = {}

    def skipped(self, kind: Hashable, offset: int, exc: BaseException, **fields: Any) -> None:
        """One more event of ``kind`` skipped at ``offset``; log it if its line is due."""
        pending = self._since.setdefault(kind, [0])
        pending[0] += 1
        if len(pending) <= _FIRST_OFFSETS:
            pending.append(offset)
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < EVERY:
            return
        self._last[kind] = now
        del self._since[kind]
        self._write(
            exc,
            offset=offset,
            skipped=pending[0],
            first_offsets=pending[1:],
            detail=f"{pending[0]} skipped since this kind's last line (one line per kind "
            f"every {EVERY:g} s at most; status has every count)",
            **fields,
        )

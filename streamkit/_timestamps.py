"""The log's timestamps: UTC ISO-8601 text with microseconds, formatted once per second.

Every commit is stamped with :func:`now_timestamp` (or :func:`format_timestamp`
of a caller's clock). The date and time of day change once a second, so the
last second's text is kept (one entry: commits stamp a clock that moves
forward) and only the microseconds are formatted per commit. The text is
exactly ``datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds")``
with a ``Z``, for every instant from 1970 to 9999; outside, that slow path itself.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

__all__ = ["format_timestamp", "now_timestamp"]

_second_prefix: tuple[int, str] = (-1, "")
"""The last whole second formatted, with its ``YYYY-MM-DDTHH:MM:SS.`` text (one entry suffices:
commits stamp a clock that moves forward)."""


def _stamp(second: int, micros: int) -> str:
    """``second`` (since the epoch, UTC) and ``micros`` as the log writes a timestamp.

    The date and time of day are formatted once per second; 1,000,000 + micros has
    seven digits, of which the last six are the microseconds, zero-padded.
    """
    global _second_prefix
    cached_second, prefix = _second_prefix
    if cached_second != second:
        prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _second_prefix = (second, prefix)
    return prefix + str(1_000_000 + micros)[1:] + "Z"


def format_timestamp(epoch_seconds: float) -> str:
    """UTC ISO-8601 with microseconds and a ``Z``: ``2026-11-29T17:00:00.000000Z``.

    The same text as ``datetime.fromtimestamp(t, UTC).isoformat(...)``, microseconds
    rounded half to even, but the date and time of day are formatted once per second.
    """
    if not 0 <= epoch_seconds < 253402300799:  # before 1970 or past year 9999: the slow path
        return (
            datetime.fromtimestamp(epoch_seconds, UTC)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z")
        )
    second = int(epoch_seconds)
    micros = round((epoch_seconds - second) * 1e6)
    if micros >= 1_000_000:
        second += 1
        micros -= 1_000_000
    return _stamp(second, micros)


_LAST_SECOND_NS = 253402300799 * 1_000_000_000
"""The last second of year 9999, in nanoseconds since the epoch."""


def now_timestamp() -> str:
    """The current UTC time as :func:`format_timestamp` writes it, read as integer nanoseconds.

    The log stamps every commit with it when its clock is :func:`time.time` (the
    default): integer arithmetic on ``time.time_ns()``, rounded half up to the
    microsecond, costs measurably less than a float formatted after each fsync,
    and is as exact as the clock. A clock outside years 1970 to 9999 takes
    :func:`format_timestamp`.
    """
    ns = time.time_ns()
    if not 0 <= ns < _LAST_SECOND_NS:
        return format_timestamp(ns / 1e9)
    second, micros = divmod((ns + 500) // 1000, 1_000_000)
    cached_second, prefix = _second_prefix
    if cached_second == second:  # _stamp's cache hit, without the call: once per commit
        return prefix + str(1_000_000 + micros)[1:] + "Z"
    return _stamp(second, micros)

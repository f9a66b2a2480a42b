"""Finding where a time falls in a stream: the offset to read after, for "events since T".

``created_at`` follows commit order within a path (each commit is stamped
under the write lock, after the look at other processes' commits, and never
before the path's latest stamp), so the durable events of a path are sorted
by it and a binary search over one-event reads finds the first event at or
after a time in about log2(head) reads, whatever the stream's length.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from streamkit.errors import InvalidRequest
from streamkit.events import ReadPage, format_timestamp

__all__ = ["after_offset_for", "timestamp_param"]


def timestamp_param(value: str, name: str) -> str:
    """An ISO-8601 time with a zone as the log stamps it (UTC, microseconds, ``Z``); or refused."""
    try:
        parsed = datetime.fromisoformat(value) if len(value) <= 64 else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise InvalidRequest(
            f"{name} must be an ISO-8601 time with a zone (e.g. 2026-12-02T21:00:00Z), got "
            f"{value[:64]!r}; nothing was read",
            details={name: value[:100]},
        )
    return format_timestamp(parsed.astimezone(UTC).timestamp())


async def after_offset_for(
    read: Callable[[int, int], Awaitable[ReadPage]], head: int, stamp: str
) -> int:
    """The offset to read after for the first durable event stamped at or after ``stamp``."""
    low, high = 0, head  # the answer is in [low, high]: every event after it is >= stamp
    while low < high:
        mid = (low + high) // 2
        page = await read(mid, 1)
        if not page.events:
            high = mid
        elif page.events[0].created_at < stamp:
            low = page.events[0].offset
        else:
            high = mid
    return low

"""Reading a stream for some event types only: the matcher, and a read whose proof still holds.

A type pattern is an exact type (``order.placed``) or a prefix ending in ``*``
(``order.*``, and ``*`` alone for every type). :func:`read_matching` pages
through a stream and keeps the events whose type matches, and the page it
returns proves what a plain read proves, for the matching events:
``scanned_through_offset`` is the offset every event up to which was looked
at, so the stream holds no other matching durable event in
``(after, scanned_through_offset]`` and a reader continues after it. A read
stops at ``limit`` matches, at the head, or after :data:`MAX_SCANNED` events
looked at, whichever comes first: a rare type in a long stream costs a bounded
amount per call, and the caller pages on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from streamkit.errors import InvalidRequest
from streamkit.events import MAX_TYPE_LENGTH, ReadPage, StreamEvent

__all__ = ["MAX_SCANNED", "MAX_TYPE_PATTERNS", "read_matching", "type_matcher"]

MAX_SCANNED = 10_000
"""The most events one filtered read looks at before it returns what it found."""

MAX_TYPE_PATTERNS = 50
"""The most type patterns one read may name."""

_PAGE = 500


def type_matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """A test of an event type against ``patterns``; :class:`InvalidRequest` for a bad pattern."""
    if not patterns or len(patterns) > MAX_TYPE_PATTERNS:
        raise InvalidRequest(
            f"a type filter names from 1 to {MAX_TYPE_PATTERNS} types, got {len(patterns)}; "
            "nothing was read",
            details={"types": len(patterns)},
        )
    exact: set[str] = set()
    prefixes: list[str] = []
    for pattern in patterns:
        if (
            not isinstance(pattern, str)
            or not pattern.strip()
            or len(pattern) > MAX_TYPE_LENGTH
            or "*" in pattern[:-1]
        ):
            raise InvalidRequest(
                f"type filter {str(pattern)[:100]!r} is not an event type or a prefix ending in "
                "'*' (e.g. order.placed, order.*); nothing was read",
                details={"type": str(pattern)[:200]},
            )
        if pattern.endswith("*"):
            prefixes.append(pattern[:-1])
        else:
            exact.add(pattern)
    if "" in prefixes:
        return lambda _: True
    starts = tuple(prefixes)
    return lambda etype: etype in exact or etype.startswith(starts)


async def read_matching(
    read: Callable[[int, int], Awaitable[ReadPage]],
    after_offset: int,
    limit: int,
    matches: Callable[[str], bool],
) -> ReadPage:
    """Up to ``limit`` durable events after ``after_offset`` whose type ``matches``, with proof."""
    found: list[StreamEvent] = []
    scanned = after_offset
    looked = 0
    while looked < MAX_SCANNED:
        page = await read(scanned, min(_PAGE, MAX_SCANNED - looked))
        for index, event in enumerate(page.events):
            if matches(event.type):
                found.append(event)
                if len(found) == limit:
                    last = index == len(page.events) - 1
                    through = page.scanned_through_offset if last else event.offset
                    return ReadPage(found, through, last and page.at_head)
        looked += len(page.events)
        scanned = page.scanned_through_offset
        if page.at_head:
            return ReadPage(found, scanned, True)
    return ReadPage(found, scanned, False)

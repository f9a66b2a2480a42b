"""Small helpers of the log tests: events to append, the offsets a stream holds, follow checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from streamkit import ScannedRange, StreamEvent
from streamkit.log import Log

Push = tuple[list[StreamEvent], ScannedRange]
"""What a follower yields: events and the range they prove."""


def order(n: int, **extra: Any) -> dict[str, Any]:
    """An ``order.placed`` event with payload ``{"n": n}`` (and any other fields given)."""
    return {"type": "order.placed", "payload": {"n": n}, **extra}


async def offsets(log: Log, path: str = "/") -> list[int]:
    """Every durable offset of ``path``, in order."""
    return [e.offset for e in (await log.stream(path).read(0, 10_000)).events]


def durable(n: int, **extra: Any) -> dict[str, Any]:
    """A durable ``order.placed`` event."""
    return {"type": "order.placed", "payload": {"n": n}, **extra}


def tick(n: int = 0, **extra: Any) -> dict[str, Any]:
    """An ephemeral ``tick`` event."""
    return {"type": "tick", "payload": {"n": n}, "ephemeral": True, **extra}


async def next_push(it: AsyncIterator[Push]) -> Push:
    """The follower's next yield, within 10 s."""
    return await asyncio.wait_for(anext(it), 10)


async def collect_until(it: AsyncIterator[Push], through: int) -> list[Push]:
    """Pushes until one reaches ``through``."""
    pushes: list[Push] = []
    while not pushes or pushes[-1][1].through < through:
        pushes.append(await next_push(it))
    return pushes


def check_contiguous(pushes: list[Push], start: int) -> None:
    """The ranges follow on from ``start`` with no gap, each holding only its own events."""
    after = start
    for events, scanned in pushes:
        assert scanned.after == after
        assert scanned.through > scanned.after
        assert events, "a push always carries events"
        assert all(scanned.after < e.offset <= scanned.through for e in events)
        assert [e.offset for e in events] == sorted({e.offset for e in events})
        after = scanned.through


def durables(pushes: list[Push]) -> list[int]:
    """The durable offsets the pushes carried, in order."""
    return [e.offset for events, _ in pushes for e in events if not e.ephemeral]

"""Small helpers of the log tests: an order event, the offsets a stream holds."""

from __future__ import annotations

from typing import Any

from streamkit.log import Log


def order(n: int, **extra: Any) -> dict[str, Any]:
    """An ``order.placed`` event with payload ``{"n": n}`` (and any other fields given)."""
    return {"type": "order.placed", "payload": {"n": n}, **extra}


async def offsets(log: Log, path: str = "/") -> list[int]:
    """Every durable offset of ``path``, in order."""
    return [e.offset for e in (await log.stream(path).read(0, 10_000)).events]

"""Server-Sent Events: the framing, and a stream that keeps quiet connections alive.

:func:`frame` writes one event (``event:``, ``id:``, ``data:`` lines; a
newline inside the data becomes another ``data:`` line, as the format asks).
:func:`with_heartbeat` relays a source of frames and sends a comment line
after every :data:`HEARTBEAT_SECONDS` of silence, so proxies keep the
connection and a client notices a dead one. The source is pulled only as
fast as the client reads (one frame is held at a time), so a slow client's
backlog stays where the source keeps it, under the source's own byte budget.
When the client goes, the source is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog

__all__ = ["HEARTBEAT_SECONDS", "SSE_TYPE", "comment", "frame", "with_heartbeat"]

SSE_TYPE = "text/event-stream"

HEARTBEAT_SECONDS = 15.0
"""The longest a live stream stays silent: a comment line is sent after this much quiet."""

_END = object()

_log = structlog.get_logger("streamkit.web")


def frame(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
    """One SSE event."""
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if id is not None:
        lines.append(f"id: {id}")
    lines.extend(f"data: {line}" for line in data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def comment(text: str) -> bytes:
    """An SSE comment line (ignored by clients; keeps the connection busy)."""
    return f": {text}\n\n".encode()


async def with_heartbeat(
    source: AsyncIterator[bytes], heartbeat: float = HEARTBEAT_SECONDS
) -> AsyncIterator[bytes]:
    """Relay ``source``'s frames, a heartbeat comment after each ``heartbeat`` s of silence."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)

    async def pull() -> None:
        try:
            async for item in source:
                await queue.put(item)
        finally:
            await queue.put(_END)

    puller = asyncio.get_running_loop().create_task(pull())
    try:
        yield comment("connected")
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), heartbeat)
            except TimeoutError:
                yield comment("heartbeat")
                continue
            if item is _END:
                break
            assert isinstance(item, bytes)
            yield item
        try:
            await puller
        except Exception as exc:  # headers are sent: the stream can only end, and say why here
            _log.warning("http.stream_failed", error=repr(exc))
    finally:
        if not puller.done():
            puller.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await puller
        closer = getattr(source, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()

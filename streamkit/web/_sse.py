"""Server-Sent Events: the framing, and a stream that keeps quiet connections alive.

:func:`frame` writes one event (``event:``, ``id:``, ``data:`` lines; a
newline inside the data becomes another ``data:`` line, as the format asks).
:func:`with_heartbeat` relays a source of frames and sends a comment line
after every :data:`HEARTBEAT_SECONDS` of silence, so proxies keep the
connection and a client notices a dead one. A refusal the source meets after
the headers went (a coded :class:`~streamkit.errors.StreamkitError`) is sent
as the stream's last frame, ``event: error`` with the problem's JSON. The source is pulled only as
fast as the client reads (one frame is held at a time), so a slow client's
backlog stays where the source keeps it, under the source's own byte budget.
When the client goes, the source is closed.

:class:`LiveStreams` is the set of one server's open streams, so that a stop
ends them as part of a clean shutdown: each says ``: stopping`` and ends, and
its response completes, before the server closes its connections (a stream
left open would be cancelled mid-response when the server's grace ran out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import structlog

from streamkit.errors import StreamkitError
from streamkit.web._problems import problem_body

__all__ = ["HEARTBEAT_SECONDS", "SSE_TYPE", "LiveStreams", "comment", "frame", "with_heartbeat"]

SSE_TYPE = "text/event-stream"

HEARTBEAT_SECONDS = 15.0
"""The longest a live stream stays silent: a comment line is sent after this much quiet."""

_END = object()

_log = structlog.get_logger("streamkit.web")


WRITE_CHUNK = 64 * 1024
"""The most bytes of one frame handed to a connection at a time (see :func:`with_heartbeat`)."""


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
    source: AsyncIterator[bytes],
    heartbeat: float = HEARTBEAT_SECONDS,
    *,
    streams: LiveStreams | None = None,
) -> AsyncIterator[bytes | memoryview]:
    """Relay ``source``'s frames, a heartbeat comment after each ``heartbeat`` s of silence.

    Registered in ``streams``, the relay ends (after a ``: stopping`` comment)
    when :meth:`LiveStreams.close_all` is called.
    """
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    started = False

    async def pull() -> None:
        nonlocal started
        started = True
        try:
            async for item in source:
                await queue.put(item)
        finally:
            await queue.put(_END)

    def cancelled_before_it_ran(task: asyncio.Task[None]) -> None:
        if not started:  # so its finally never ran, and nothing is queued
            queue.put_nowait(_END)

    puller = asyncio.get_running_loop().create_task(pull())
    puller.add_done_callback(cancelled_before_it_ran)
    if streams is not None:
        streams.opened(puller)
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
            if len(item) <= WRITE_CHUNK:
                yield item
                continue
            # A large frame (a seed of a big state) goes out in slices of the same
            # bytes: each waits for the client to take the one before, so a stalled
            # client holds one slice in its connection's buffer, not a copy of the frame.
            whole = memoryview(item)
            for start in range(0, len(whole), WRITE_CHUNK):
                yield whole[start : start + WRITE_CHUNK]
        if puller.cancelled():  # the server is stopping: end the response cleanly
            yield comment("stopping")
            return
        try:
            await puller
        except StreamkitError as exc:
            # Headers are sent: the refusal goes as the stream's last frame, a problem
            # (RFC 9457) in an ``error`` event, so a client learns why rather than reconnect.
            _log.warning("http.stream_refused", code=exc.code, error=exc.message)
            yield frame(json.dumps(problem_body(exc)), event="error")
        except Exception as exc:  # headers are sent: the stream can only end, and say why here
            _log.warning("http.stream_failed", error=repr(exc), exc_info=exc)
    finally:
        if streams is not None:
            streams.ended(puller)
        if not puller.done():
            puller.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await puller
        closer = getattr(source, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()


class LiveStreams:
    """The open live streams of one server; :meth:`close_all` ends each cleanly."""

    def __init__(self) -> None:
        self._pullers: set[asyncio.Task[None]] = set()
        self._closing = False
        self._ended = asyncio.Event()
        self._ended.set()

    def __len__(self) -> int:
        return len(self._pullers)

    def opened(self, puller: asyncio.Task[None]) -> None:
        """Track a stream's source task (a stream opened while closing ends at once)."""
        self._pullers.add(puller)
        self._ended.clear()
        if self._closing:
            puller.cancel()

    def ended(self, puller: asyncio.Task[None]) -> None:
        """Forget a stream that has ended."""
        self._pullers.discard(puller)
        if not self._pullers:
            self._ended.set()

    async def close_all(self, grace: float) -> int:
        """End every open stream; wait up to ``grace`` s for them to finish; return how many."""
        self._closing = True
        count = len(self._pullers)
        for puller in list(self._pullers):
            puller.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ended.wait(), grace)
        return count

"""Server-Sent Events framing and the heartbeat of a quiet stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from streamkit.web._sse import comment, frame, with_heartbeat


def test_a_frame_splits_data_lines_and_names_its_event_and_id() -> None:
    """Each line of data is its own data: line; event and id come first."""
    assert frame("a\nb", event="delta", id="7") == b"event: delta\nid: 7\ndata: a\ndata: b\n\n"
    assert comment("x") == b": x\n\n"


async def test_a_quiet_stream_sends_heartbeats_and_closes_its_source() -> None:
    """After each quiet period a comment goes out; closing the stream closes the source."""
    release = asyncio.Event()
    closed = asyncio.Event()

    async def source() -> AsyncIterator[bytes]:
        try:
            await release.wait()
            yield frame("{}", event="seed")
            await asyncio.Event().wait()  # then silence for ever
        finally:
            closed.set()

    stream = with_heartbeat(source(), heartbeat=0.05)
    assert await anext(stream) == comment("connected")
    assert await anext(stream) == comment("heartbeat")
    release.set()
    got = await anext(stream)
    while got == comment("heartbeat"):
        got = await anext(stream)
    assert got == frame("{}", event="seed")
    assert await anext(stream) == comment("heartbeat")
    await stream.aclose()
    await asyncio.wait_for(closed.wait(), 2)

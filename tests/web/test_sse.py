"""Server-Sent Events framing and the heartbeat of a quiet stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from streamkit.web._sse import LiveStreams, comment, frame, with_heartbeat


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


async def test_closing_the_live_streams_ends_each_with_a_stopping_comment() -> None:
    """close_all ends every open stream cleanly (no exception to its reader) and closes sources."""
    streams = LiveStreams()
    closed: list[int] = []

    async def source(n: int) -> AsyncIterator[bytes]:
        try:
            yield frame(str(n))
            await asyncio.Event().wait()
        finally:
            closed.append(n)

    relays = [with_heartbeat(source(n), heartbeat=60, streams=streams) for n in (1, 2)]
    for n, relay in enumerate(relays, 1):
        assert await anext(relay) == comment("connected")
        assert await anext(relay) == frame(str(n))

    async def rest(relay: AsyncIterator[bytes]) -> list[bytes]:
        return [item async for item in relay]

    readers = [asyncio.ensure_future(rest(relay)) for relay in relays]
    await asyncio.sleep(0.01)
    assert len(streams) == 2
    assert await streams.close_all(grace=2) == 2
    assert [await reader for reader in readers] == [[comment("stopping")]] * 2
    assert sorted(closed) == [1, 2]
    assert len(streams) == 0

    late = with_heartbeat(source(3), heartbeat=60, streams=streams)
    assert [item async for item in late] == [comment("connected"), comment("stopping")]

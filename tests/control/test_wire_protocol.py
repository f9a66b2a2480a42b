"""A client written only from docs/host.md's wire protocol talks to a real host.

Nothing of streamkit's own client code is used here: raw sockets, JSON lines,
and what the page says about framing, replies, streams and errors.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.host import Tally

from streamkit.config import HostConfig
from streamkit.host import ProcessorHost


class LineClient:
    """One connection: send a JSON object per line, read one JSON object per line."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, path: str) -> LineClient:
        reader, writer = await asyncio.open_unix_connection(path, limit=2**24)
        return cls(reader, writer)

    async def send(self, message: dict[str, Any]) -> None:
        self.writer.write(json.dumps(message).encode("utf-8") + b"\n")
        await self.writer.drain()

    async def receive(self) -> dict[str, Any]:
        line = await asyncio.wait_for(self.reader.readline(), 10)
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.send(message)
        return await self.receive()

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def socket_path(tmp_path: Path, short_dir: Path) -> AsyncIterator[str]:
    config = HostConfig.model_validate(
        {"db": str(tmp_path / "w.db"), "socket": str(short_dir / "w.sock")}
    )
    async with ProcessorHost(config, processors=[Tally()]):
        yield str(config.socket_path)


async def test_one_shot_requests_replies_and_errors(socket_path: str) -> None:
    """Arguments at the top level, {id, ok, result} replies, {id, ok: false, error} refusals."""
    client = await LineClient.connect(socket_path)
    try:
        appended = await client.call(
            {"id": "a1", "op": "append", "path": "/", "events": [{"type": "item"}]}
        )
        assert appended["id"] == "a1"
        assert appended["ok"] is True
        (event,) = appended["result"]
        # The documented fields; source, idempotency_key and ephemeral only when set.
        assert set(event) == {"path", "offset", "type", "payload", "metadata", "created_at"}
        head = event["offset"]
        stale = await client.call(
            {"id": 2, "op": "append", "events": [{"type": "item"}], "expect_head": head - 1}
        )
        assert stale["ok"] is False
        assert set(stale["error"]) == {"code", "message", "retryable", "details"}
        assert stale["error"]["code"] == "OFFSET_CONFLICT"
        page = await client.call({"id": 3, "op": "read", "path": "/", "after": 0, "limit": 10})
        assert [e["offset"] for e in page["result"]["events"]] == [head]
        assert page["result"]["at_head"] is True
        unknown = await client.call({"id": 4, "op": "read", "colour": "blue"})
        assert unknown["error"]["code"] == "INVALID_REQUEST"
        await client.send({"id": 5, "op": "status"})
        status = await client.receive()
        assert status["id"] == 5
        assert status["result"]["processors"][0]["slug"] == "tally"
        hello = await client.call({"id": 6, "op": "hello"})
        assert set(hello["result"]) == {"db", "owner", "pid"}
        other = await client.call({"id": 7, "op": "status", "db": "/no/such/other.db"})
        assert other["error"]["code"] == "INVALID_REQUEST"
        assert hello["result"]["db"] in other["error"]["message"]
        client.writer.write(b"this is not json\n")
        garbled = await client.receive()
        assert (garbled["id"], garbled["error"]["code"]) == (None, "MALFORMED_REQUEST")
    finally:
        client.close()


async def test_a_watch_streams_items_and_its_connection_takes_no_other_request(
    socket_path: str,
) -> None:
    """watch: a seed then deltas as {id, ok, event}; another request on it is refused."""
    watcher = await LineClient.connect(socket_path)
    producer = await LineClient.connect(socket_path)
    try:
        await watcher.send({"id": 9, "op": "watch", "slug": "tally"})
        seed = await watcher.receive()
        assert (seed["id"], seed["ok"]) == (9, True)
        assert seed["event"]["kind"] == "seed"
        rev = seed["event"]["rev"]
        assert isinstance(rev, int)
        snapshot = await producer.call({"id": 1, "op": "snapshot", "slug": "tally"})
        assert snapshot["result"]["rev"] == rev
        await producer.call({"id": 2, "op": "append", "events": [{"type": "item"}]})
        delta = (await watcher.receive())["event"]
        assert (delta["kind"], delta["from"], delta["to"]) == ("delta", rev, rev + 1)
        assert isinstance(delta["patch"], list)
        await watcher.send({"id": 10, "op": "status"})
        refused = await watcher.receive()
        assert refused["id"] == 10
        assert refused["error"]["code"] == "INVALID_REQUEST"
        assert refused["error"]["details"]["reason"] == "connection_streaming"
    finally:
        watcher.close()
        producer.close()


async def test_a_follow_streams_history_then_new_events(socket_path: str) -> None:
    """follow: one {id, ok, event} line per event, durable history first, then new commits."""
    writer = await LineClient.connect(socket_path)
    follower = await LineClient.connect(socket_path)
    try:
        first = await writer.call({"id": 1, "op": "append", "events": [{"type": "item"}]})
        await follower.send({"id": "f", "op": "follow", "path": "/", "after": 0})
        seen = []
        while len(seen) < 1:
            line = await follower.receive()
            assert line["id"] == "f"
            if line["event"]["type"] == "item":
                seen.append(line["event"]["offset"])
        assert seen == [first["result"][0]["offset"]]
        later = await writer.call({"id": 2, "op": "append", "events": [{"type": "item"}]})
        while True:
            line = await follower.receive()
            if line["event"]["type"] == "item":
                assert line["event"]["offset"] == later["result"][0]["offset"]
                break
    finally:
        writer.close()
        follower.close()

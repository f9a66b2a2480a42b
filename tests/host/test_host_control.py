"""The host's control socket: append (durable and ephemeral), read, status, snapshot, watch, refusals."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.host import Pinged, Tally

from streamkit import StreamEvent, apply_delta
from streamkit.config import HostConfig
from streamkit.control import ControlClient
from streamkit.errors import (
    ControlSocketInUse,
    InvalidEvent,
    InvalidRequest,
    StorageError,
    StreamkitError,
    UnknownOperation,
)
from streamkit.host import ProcessorHost


@pytest.fixture
async def host(tmp_path: Path, short_dir: Path) -> AsyncIterator[ProcessorHost]:
    config = HostConfig.model_validate(
        {
            "db": str(tmp_path / "c.db"),
            "socket": str(short_dir / "c.sock"),
            "lease": {"ttl": 5.0, "heartbeat": 0.1},
        }
    )
    running = ProcessorHost(config, processors=[Tally(), Pinged()])
    await running.start()
    try:
        yield running
    finally:
        await running.stop(grace=0.0)


@pytest.fixture
async def client(host: ProcessorHost) -> AsyncIterator[ControlClient]:
    async with ControlClient(host.config.socket_path, timeout=10) as connected:
        yield connected


async def test_socket_is_private(host: ProcessorHost) -> None:
    """The control socket is created with mode 0600."""
    mode = os.stat(host.config.socket_path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


async def test_a_keyed_append_says_how_long_its_key_answers(
    host: ProcessorHost, client: ControlClient
) -> None:
    """Each keyed event of the answer carries the path's key window (null: forever)."""
    keyed = {"type": "item", "idempotency_key": "a"}
    (first,) = await client.request("append", path="/", events=[keyed])
    assert first["keys_kept_for"] is None
    assert host.store is not None
    await host.store.retention.set_key_window("/", 7200.0, by="ops", reason="r", now=time.time())
    (again, unkeyed) = await client.request("append", path="/", events=[keyed, {"type": "item"}])
    assert (again["replayed"], again["keys_kept_for"]) == (True, 7200.0)
    assert "keys_kept_for" not in unkeyed


async def test_a_keyed_append_whose_key_window_cannot_be_read_writes_nothing(
    host: ProcessorHost, client: ControlClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket reads the window before the append: unreadable, nothing is written."""
    assert host.store is not None

    async def unreadable(path: str) -> None:
        raise StorageError(f"the key window of {path!r} could not be read (planted)")

    monkeypatch.setattr(host.store.retention, "key_window", unreadable)
    with pytest.raises(StorageError, match="planted"):
        await client.request("append", path="/", events=[{"type": "item", "idempotency_key": "a"}])
    assert (await host.read("/", 0, 10)).events == []


async def test_append_read_status_snapshot(host: ProcessorHost, client: ControlClient) -> None:
    """Durable appends through the socket are reduced; read, status and snapshot answer."""
    committed = await client.request(
        "append", path="/", events=[{"type": "item", "payload": {"n": 1}}, {"type": "item"}]
    )
    assert [e["offset"] for e in committed] == [1, 2]
    await host.wait_until_processed("tally", 2)
    page = await client.request("read", path="/", after=1)
    assert [e["offset"] for e in page["events"]] == [2]
    assert page["at_head"] is True
    assert (await client.request("read", path="/", types=["other.*"]))["events"] == []
    assert len((await client.request("read", path="/", types=["item"]))["events"]) == 2
    snapshot = await client.request("snapshot", slug="tally")
    # Never past the durable head, though live-state deltas take offsets too.
    assert snapshot["offset"] == 2
    assert (snapshot["state"], snapshot["source"]) == ({"offsets": [1, 2], "pings": 0}, "engine")
    status = await client.request("status")
    assert {row["slug"] for row in status["processors"]} == {"tally", "pinged"}


async def test_ephemeral_append_reaches_the_processor(
    host: ProcessorHost, client: ControlClient
) -> None:
    """An ephemeral appended through the socket is pushed to the host's processors, never written."""
    (ping,) = await client.request("append", events=[{"type": "ping", "ephemeral": True}])
    assert ping["ephemeral"] is True
    await host.wait_until_processed("pinged", ping["offset"])
    assert (await client.request("snapshot", slug="pinged"))["state"]["pings"] == 1
    page = await client.request("read")
    assert page["events"] == []


async def test_watch_seeds_then_streams_patches(host: ProcessorHost, client: ControlClient) -> None:
    """watch sends the seed {rev, state}, then deltas whose patches rebuild the state."""
    watch = client.watch("watch", slug="tally")
    try:
        seed = await anext(watch)
        assert seed["kind"] == "seed"
        assert seed["state"] == {"offsets": [], "pings": 0}
        await client.request("append", events=[{"type": "item"}])
        delta = await asyncio.wait_for(anext(watch), 5)
        assert (delta["kind"], delta["from"]) == ("delta", seed["rev"])
        assert apply_delta(seed["state"], delta["patch"]) == {"offsets": [1], "pings": 0}
    finally:
        await watch.aclose()  # type: ignore[attr-defined]


async def test_follow_streams_ephemerals_too(host: ProcessorHost, client: ControlClient) -> None:
    """follow yields durable history, then new commits including this host's ephemerals."""
    await client.request("append", events=[{"type": "item"}])
    follow = client.watch("follow", path="/", after=0)
    try:
        first = await asyncio.wait_for(anext(follow), 5)
        assert (first["offset"], first["type"]) == (1, "item")
        await client.request("append", events=[{"type": "ping", "ephemeral": True}])
        seen: list[dict[str, Any]] = []
        while not any(e["type"] == "ping" for e in seen):
            seen.append(await asyncio.wait_for(anext(follow), 5))
        assert next(e for e in seen if e["type"] == "ping")["ephemeral"] is True
    finally:
        await follow.aclose()  # type: ignore[attr-defined]


async def test_bad_requests_get_coded_errors_and_host_keeps_serving(
    host: ProcessorHost, client: ControlClient
) -> None:
    """Unknown ops, bad arguments, bad events and unknown slugs are refused; the host serves on."""
    with pytest.raises(UnknownOperation):
        await client.request("explode")
    with pytest.raises(InvalidRequest):
        await client.request("append", events=[])
    with pytest.raises(InvalidEvent):
        await client.request("append", events=[{"type": ""}])
    with pytest.raises(InvalidRequest, match="not run by this host"):
        await client.request("snapshot", slug="missing")
    with pytest.raises(InvalidRequest, match="not run by this host"):
        await anext(client.watch("watch", slug="missing"))
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await asyncio.to_thread(raw.connect, str(host.config.socket_path))
        await asyncio.to_thread(raw.sendall, b"{not json\n")
        reply = json.loads(await asyncio.to_thread(raw.recv, 65536))
    finally:
        raw.close()
    assert reply["error"]["code"] == "MALFORMED_REQUEST"
    assert (await client.request("read"))["events"] == []


async def test_second_host_on_a_taken_socket_refuses_to_start(
    host: ProcessorHost, tmp_path: Path
) -> None:
    """A host whose socket path a live host serves refuses to start and leaves the first serving."""
    second = ProcessorHost(host.config, processors=[Tally()], owner="second")
    with pytest.raises(ControlSocketInUse):
        await second.start()
    async with ControlClient(host.config.socket_path, timeout=5) as client:
        status = await client.request("status")
    assert status["host"]["owner"] == host.owner


async def test_socket_append_refuses_the_reserved_namespace(
    host: ProcessorHost, client: ControlClient
) -> None:
    """A forged skip sent through the socket is refused (INVALID_EVENT) and nothing is written."""
    forged = {"slug": "tally", "offset": 1, "by": "mallory", "reason": "forged"}
    with pytest.raises(StreamkitError) as caught:
        await client.request(
            "append", events=[{"type": "streamkit.event-skipped", "payload": forged}]
        )
    assert caught.value.code == "INVALID_EVENT"
    assert "reserved" in caught.value.message
    page = await client.request("read", path="/")
    assert page["events"] == []


async def test_a_follower_over_its_byte_budget_is_told_where_to_resume(
    tmp_path: Path, short_dir: Path
) -> None:
    """A follow client that stops reading gets SLOW_CONSUMER with resume_after; resuming loses nothing."""
    config = HostConfig.model_validate(
        {
            "db": str(tmp_path / "s.db"),
            "socket": str(short_dir / "s.sock"),
            "limits": {"subscriber_bytes": 64 * 1024},
        }
    )
    async with ProcessorHost(config, processors=[Tally()]) as running:
        # A plain socket the event loop does not read for us: it really stops reading.
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(str(config.socket_path))
        raw.sendall(b'{"id": 7, "op": "follow", "path": "/", "after": 0}\n')
        await asyncio.sleep(0.2)  # the follow is registered and waiting
        blob = "y" * 10_000
        for n in range(300):  # 3 MB the client does not read meanwhile
            await running.append("/", [{"type": "item", "payload": {"n": n, "blob": blob}}])
            await asyncio.sleep(0)  # the host's pump runs until the socket is full
        reader, writer = await asyncio.open_unix_connection(sock=raw, limit=2**24)
        received: list[int] = []
        error: dict[str, Any] | None = None
        while error is None:
            line = json.loads(await asyncio.wait_for(reader.readline(), 10))
            if "event" in line:
                if not line["event"].get("ephemeral"):
                    received.append(line["event"]["offset"])
            elif not line["ok"]:
                error = line["error"]
        writer.close()
        assert error["code"] == "SLOW_CONSUMER"
        assert error["retryable"] is True
        resume_after = error["details"]["resume_after"]
        assert resume_after == (received[-1] if received else 0)
        # Resuming from there yields every later durable event: nothing durable was lost.
        async with ControlClient(config.socket_path, timeout=10) as client:
            stream = client.watch("follow", path="/", after=resume_after)
            rest: list[int] = []
            async for item in stream:
                if not item.get("ephemeral") and item["type"] == "item":
                    rest.append(item["offset"])
                if len(received) + len(rest) >= 300:
                    break
            await stream.aclose()  # type: ignore[attr-defined]
        offsets = [o for o in received if o] + rest
        assert len(offsets) == 300
        assert offsets == sorted(set(offsets))


def test_a_watcher_over_its_byte_budget_is_re_seeded() -> None:
    """A watcher's mailbox keeps only its key's deltas, and past its budget it is told to re-seed."""
    from streamkit import LIVE_STATE_CHANGED
    from streamkit.events import ScannedRange
    from streamkit.host import Subscription

    def delta(key: str, rev: int, size: int) -> StreamEvent:
        patch = [{"op": "replace", "path": "/x", "value": "z" * size}]
        payload = {"key": key, "from": rev, "to": rev + 1, "patch": patch}
        return StreamEvent(
            path="/", offset=rev, type=LIVE_STATE_CHANGED, payload=payload, ephemeral=True
        )

    mailbox = Subscription("/", "tally", max_bytes=1000)
    other = StreamEvent(path="/", offset=1, type="item", payload={"blob": "q" * 10_000})
    mailbox.offer([other, delta("pinged", 1, 10_000)], ScannedRange(0, 1))
    assert mailbox.buffered_bytes == 0  # not this watcher's: never held
    mailbox.offer([delta("tally", 1, 400)], ScannedRange(1, 2))
    assert not mailbox.overflowed
    mailbox.offer([delta("tally", 2, 700)], ScannedRange(2, 3))
    assert mailbox.overflowed
    assert mailbox.buffered_bytes < 1000


async def test_a_lone_surrogate_through_the_socket_is_invalid_event_not_internal(
    host: ProcessorHost, client: ControlClient
) -> None:
    """A JSON escape that decodes to a lone surrogate gets INVALID_EVENT; the host reads on."""
    # As a JavaScript client sends it: plain ASCII JSON with the escape in it.
    reader, writer = await asyncio.open_unix_connection(str(host.config.socket_path))
    writer.write(
        b'{"id": 1, "op": "append", "events": [{"type": "item", "payload": {"v": "\\ud800"}}]}\n'
    )
    reply = json.loads(await asyncio.wait_for(reader.readline(), 10))
    writer.close()
    assert reply["ok"] is False
    assert reply["error"]["code"] == "INVALID_EVENT"
    assert "cannot be encoded as UTF-8" in reply["error"]["message"]
    page = await client.request("read", path="/")
    assert page["events"] == []


async def test_socket_offsets_past_2_63_are_coded_refusals(
    host: ProcessorHost, client: ControlClient
) -> None:
    """read, follow and skip with an offset of 2^63 get INVALID_REQUEST, not INTERNAL."""
    with pytest.raises(StreamkitError) as read:
        await client.request("read", path="/", after=2**63)
    assert read.value.code == "INVALID_REQUEST"
    with pytest.raises(StreamkitError) as skip:
        await client.request("skip", slug="tally", offset=2**63, by="me")
    assert skip.value.code == "INVALID_REQUEST"
    with pytest.raises(InvalidRequest, match="from 1 to"):
        await host.skip("tally", 2**63, by="me", reason="")


async def test_socket_snapshot_carries_the_live_rev_to_re_seed_from(
    host: ProcessorHost, client: ControlClient
) -> None:
    """snapshot has rev and the live projection; the next delta's from is that rev."""
    await client.request("append", events=[{"type": "item"}])
    await asyncio.sleep(0.1)
    snapshot = await client.request("snapshot", slug="tally")
    assert isinstance(snapshot["rev"], int)
    assert snapshot["live"] == snapshot["state"]
    watch = client.watch("watch", slug="tally")
    try:
        seed = await anext(watch)
        assert seed["rev"] == snapshot["rev"]
    finally:
        await watch.aclose()  # type: ignore[attr-defined]


async def test_read_follow_resumes_by_itself_after_slow_consumer(
    tmp_path: Path, short_dir: Path
) -> None:
    """A `read --follow` whose stdout nobody drains falls behind, resumes, and prints each event once."""
    config = HostConfig.model_validate(
        {
            "db": str(tmp_path / "f.db"),
            "socket": str(short_dir / "f.sock"),
            "limits": {"subscriber_bytes": 64 * 1024},
        }
    )
    async with ProcessorHost(config, processors=[Tally()]) as running:
        count = 300
        # Told when the child's follow reaches the host (its start-up takes a while on a
        # busy machine, and appends made before it would be read, not pushed).
        started = asyncio.Event()
        follow = running.follow

        async def watched(path: str, after_offset: int = 0) -> AsyncIterator[StreamEvent]:
            inner = follow(path, after_offset)
            started.set()
            async for event in inner:
                yield event

        running.follow = watched  # type: ignore[method-assign]
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamkit", "read", "--db", str(config.db),
            "--socket", str(config.socket_path), "--follow", "--limit", str(count),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await asyncio.wait_for(started.wait(), 60)
        blob = "z" * 10_000
        appended = []
        for n in range(count):
            (event,) = await running.append("/", [{"type": "item", "payload": {"n": n, "b": blob}}])
            appended.append(event.offset)
            await asyncio.sleep(0)
        # Only now is its stdout read: meanwhile it blocked writing, and so stopped reading.
        out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err.decode()
    printed = [int(line.split()[0]) for line in out.decode().splitlines()]
    assert printed == appended
    assert "note: the follower of '/' fell more than its byte budget behind" in err.decode()

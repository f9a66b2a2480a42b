"""The control socket: framing, refusals, handler failures, watches, and the socket file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import BaseModel

from streamkit.control import (
    ControlClient,
    ControlServer,
    NoArgs,
    Operation,
    error_from_reply,
    live_server_at,
    request_sync,
)
from streamkit.errors import (
    ControlSocketInUse,
    ControlUnavailable,
    InternalError,
    InvalidRequest,
    MalformedRequest,
    OffsetConflict,
    RemoteError,
    RequestTooLarge,
    StreamkitError,
    UnknownOperation,
)

LIMIT = 4096


class EchoArgs(NoArgs):
    text: str
    times: int = 1


class CountArgs(NoArgs):
    n: int | None = None


class Handler:
    """A handler with one op per behaviour the server must cope with."""

    operations: Mapping[str, Operation] = {
        "echo": Operation(args=EchoArgs),
        "refuse": Operation(),
        "crash": Operation(),
        "unencodable": Operation(),
        "wait": Operation(),
        "count": Operation(args=CountArgs, streaming=True),
        "broken_watch": Operation(streaming=True),
        "firehose": Operation(streaming=True),
    }

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.watching = asyncio.Event()
        self.watch_closed = asyncio.Event()
        self.streams: list[AsyncIterator[Any]] = []

    async def handle(self, op: str, args: BaseModel) -> Any:
        if op == "echo":
            assert isinstance(args, EchoArgs)
            return {"text": args.text * args.times}
        if op == "refuse":
            raise OffsetConflict("offset 3 was expected; nothing was appended", details={"n": 3})
        if op == "crash":
            raise RuntimeError("the handler tripped")
        if op == "unencodable":
            return {"value": object()}
        if op == "wait":
            await self.release.wait()
            return "released"
        raise AssertionError(op)

    def watch(self, op: str, args: BaseModel) -> AsyncIterator[Any]:
        if op == "broken_watch":
            return self._broken()
        if op == "firehose":
            # Kept referenced, as a host tracking subscriptions would: only an
            # explicit aclose (not garbage collection) can run its cleanup.
            stream = self._firehose()
            self.streams.append(stream)
            return stream
        assert isinstance(args, CountArgs)
        return self._count(args.n)

    async def _count(self, n: int | None) -> AsyncIterator[Any]:
        try:
            index = 0
            while n is None or index < n:
                yield {"rev": index}
                index += 1
                if index == 2:
                    self.watching.set()
                if n is None and index >= 2:
                    await asyncio.Event().wait()  # a subscription with nothing new
            self.watching.set()
        finally:
            self.watch_closed.set()

    async def _firehose(self) -> AsyncIterator[Any]:
        # Always ready: it never awaits, so it is always suspended at a yield.
        try:
            index = 0
            while True:
                yield {"rev": index}
                index += 1
        finally:
            self.watch_closed.set()

    async def _broken(self) -> AsyncIterator[Any]:
        yield {"rev": 0}
        raise ValueError("the live state went away")


@pytest.fixture
def sock_path(short_dir: Path) -> Path:
    return short_dir / "host.sock"


@pytest.fixture
def handler() -> Handler:
    return Handler()


@pytest.fixture
async def server(sock_path: Path, handler: Handler) -> AsyncIterator[ControlServer]:
    control = ControlServer(sock_path, handler, max_request_bytes=LIMIT)
    await control.start()
    yield control
    await control.close()


class Raw:
    """A bare socket client, to send exactly the bytes a test needs."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, path: Path) -> Raw:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self) -> dict[str, Any]:
        line = await asyncio.wait_for(self.reader.readline(), 10)
        assert line.endswith(b"\n"), line
        reply = json.loads(line)
        assert isinstance(reply, dict)
        return reply

    async def ask(self, data: bytes) -> dict[str, Any]:
        await self.send(data)
        return await self.reply()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


@pytest.fixture
async def raw(server: ControlServer) -> AsyncIterator[Raw]:
    client = await Raw.open(server.path)
    yield client
    await client.close()


@pytest.fixture
async def client(server: ControlServer) -> AsyncIterator[ControlClient]:
    async with ControlClient(server.path, timeout=10) as control:
        yield control


async def wait_for(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), 10)


async def drain(events: AsyncGenerator[Any, None]) -> list[Any]:
    """Every event of a watch, closing it whatever happens."""
    async with contextlib.aclosing(events) as stream:
        return [event async for event in stream]


def exists(path: Path) -> bool:
    return path.exists()


# ---------------------------------------------------------------------------
# Round trips


async def test_request_round_trip(client: ControlClient) -> None:
    """A request's validated arguments reach the handler and its result comes back."""
    assert await client.request("echo", text="ab", times=3) == {"text": "ababab"}
    assert await client.request("echo", text="x") == {"text": "x"}


async def test_raw_wire_format(raw: Raw) -> None:
    """The reply echoes the request id and carries ok and result, one JSON object per line."""
    reply = await raw.ask(b'{"id": "a-1", "op": "echo", "text": "hi"}\n')
    assert reply == {"id": "a-1", "ok": True, "result": {"text": "hi"}}


async def test_socket_file_is_private(server: ControlServer) -> None:
    """The socket file is a socket with mode 0600."""
    info = os.stat(server.path)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600


async def test_socket_is_private_under_a_permissive_umask(sock_path: Path) -> None:
    """Even with umask 000 the socket is created 0600."""
    previous = os.umask(0)
    try:
        control = ControlServer(sock_path, Handler())
        await control.start()
    finally:
        os.umask(previous)
    try:
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
    finally:
        await control.close()


# ---------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize(
    ("line", "code", "reply_id", "says"),
    [
        (b"not json\n", "MALFORMED_REQUEST", None, "not valid JSON"),
        (b'{"id": 1, "op": "echo", \n', "MALFORMED_REQUEST", None, "not valid JSON"),
        (b"\xff\xfe\n", "MALFORMED_REQUEST", None, "not UTF-8"),
        (b"[1, 2]\n", "MALFORMED_REQUEST", None, "got list"),
        (b'{"id": 1, "op": "echo", "times": NaN}\n', "MALFORMED_REQUEST", None, "NaN"),
        (b"[" * 1500 + b"]" * 1500 + b"\n", "MALFORMED_REQUEST", None, "not valid JSON"),
        (b'{"id": 7}\n', "MALFORMED_REQUEST", 7, "has no 'op'"),
        (b'{"id": 7, "op": 5}\n', "MALFORMED_REQUEST", 7, "not a non-empty string"),
        (b'{"id": 8, "op": "launch"}\n', "UNKNOWN_OP", 8, "offers: broken_watch, count, crash"),
        (b'{"id": 9, "op": "echo"}\n', "INVALID_REQUEST", 9, "'text': required argument"),
        (b'{"id": 9, "op": "echo", "text": 5}\n', "INVALID_REQUEST", 9, "got 5"),
        (b'{"id": 9, "op": "echo", "text": "a", "times": "x"}\n', "INVALID_REQUEST", 9, "'times'"),
        (b'{"id": 9, "op": "echo", "text": "a", "tims": 2}\n', "INVALID_REQUEST", 9, "text, times"),
        (b'{"id": 9, "op": "refuse", "extra": 1}\n', "INVALID_REQUEST", 9, "accepted: none"),
        (b"x" * (LIMIT + 10) + b"\n", "REQUEST_TOO_LARGE", None, f"longer than {LIMIT}"),
    ],
)
async def test_bad_request_gets_coded_reply_and_connection_keeps_serving(
    raw: Raw, line: bytes, code: str, reply_id: object, says: str
) -> None:
    """Each kind of bad request is answered with its code, and the same connection still works."""
    reply = await raw.ask(line)
    assert reply["ok"] is False
    assert reply["id"] == reply_id
    error = reply["error"]
    assert error["code"] == code
    assert says in error["message"]
    assert "nothing was done" in error["message"]
    assert set(error) == {"code", "message", "retryable", "details"}
    assert await raw.ask(b'{"id": 2, "op": "echo", "text": "ok"}\n') == {
        "id": 2,
        "ok": True,
        "result": {"text": "ok"},
    }


async def test_overlong_line_arriving_in_pieces_is_discarded_whole(raw: Raw) -> None:
    """A line past the limit sent in chunks gets one refusal; the next line is read cleanly."""
    for _ in range(5):
        await raw.send(b'{"op": "echo", "text": "' + b"y" * LIMIT)
    await raw.send(b'"}\n{"id": 3, "op": "echo", "text": "after"}\n')
    first = await raw.reply()
    assert first["error"]["code"] == "REQUEST_TOO_LARGE"
    assert await raw.reply() == {"id": 3, "ok": True, "result": {"text": "after"}}


async def test_blank_lines_are_ignored(raw: Raw) -> None:
    """Empty lines between requests get no reply and do not disturb framing."""
    assert (await raw.ask(b'\n\n  \n{"id": 1, "op": "echo", "text": "a"}\n'))["id"] == 1


async def test_last_request_without_newline_is_answered(server: ControlServer) -> None:
    """A client that sends one request without a newline and half-closes still gets its reply."""
    raw = await Raw.open(server.path)
    await raw.send(b'{"id": 4, "op": "echo", "text": "eof"}')
    raw.writer.write_eof()
    assert await raw.reply() == {"id": 4, "ok": True, "result": {"text": "eof"}}
    await raw.close()


async def test_client_rebuilds_refusals_as_coded_errors(client: ControlClient) -> None:
    """Error replies raise StreamkitErrors whose code is the server's code."""
    with pytest.raises(UnknownOperation) as unknown:
        await client.request("launch")
    assert unknown.value.code == "UNKNOWN_OP"
    with pytest.raises(InvalidRequest) as invalid:
        await client.request("echo", text=["not", "a", "string"])
    assert invalid.value.details["op"] == "echo"
    assert await client.request("echo", text="still fine") == {"text": "still fine"}


async def test_handler_streamkit_error_reaches_client_as_is(client: ControlClient) -> None:
    """A StreamkitError the handler raises is sent as-is and rebuilt as its own class."""
    with pytest.raises(OffsetConflict) as caught:
        await client.request("refuse")
    assert caught.value.code == "OFFSET_CONFLICT"
    assert caught.value.details == {"n": 3}
    assert "nothing was appended" in str(caught.value)


async def test_handler_crash_is_internal_logged_and_survived(
    client: ControlClient, server: ControlServer
) -> None:
    """An unexpected handler exception becomes INTERNAL with its message, is logged, and the server keeps serving."""
    with structlog.testing.capture_logs() as logs, pytest.raises(InternalError) as caught:
        await client.request("crash")
    assert caught.value.code == "INTERNAL"
    assert "RuntimeError: the handler tripped" in str(caught.value)
    assert [entry["event"] for entry in logs] == ["control.handler_failed"]
    assert logs[0]["op"] == "crash"
    assert logs[0]["log_level"] == "error"
    assert await client.request("echo", text="alive") == {"text": "alive"}
    assert server.serving


async def test_unencodable_result_is_internal(client: ControlClient) -> None:
    """A result that is not JSON becomes an INTERNAL reply, not a dead connection."""
    with pytest.raises(InternalError, match="returned a result"):
        await client.request("unencodable")
    assert await client.request("echo", text="next") == {"text": "next"}


def test_unknown_remote_code_becomes_remote_error() -> None:
    """A code this process does not know comes back as RemoteError carrying that code."""
    error = error_from_reply(
        {"code": "SOMETHING_NEW", "message": "m", "retryable": True, "details": {"k": 1}}
    )
    assert isinstance(error, RemoteError)
    assert isinstance(error, StreamkitError)
    assert error.code == "SOMETHING_NEW"
    assert error.retryable is True
    assert error.details == {"k": 1}
    assert error.to_dict()["code"] == "SOMETHING_NEW"
    known = error_from_reply({"code": "REQUEST_TOO_LARGE", "message": "big"})
    assert type(known) is RequestTooLarge
    assert isinstance(error_from_reply({"code": "MALFORMED_REQUEST"}), MalformedRequest)


async def test_reserved_argument_names_are_refused_before_sending(client: ControlClient) -> None:
    """Arguments named id or op cannot be expressed on the wire and are refused locally."""
    with pytest.raises(InvalidRequest, match="reserved"):
        await client.request("echo", id=3)
    with pytest.raises(InvalidRequest, match="not JSON"):
        await client.request("echo", text=object())
    assert await client.request("echo", text="ok") == {"text": "ok"}


# ---------------------------------------------------------------------------
# Concurrency


async def test_many_concurrent_clients(server: ControlServer) -> None:
    """Many clients with interleaved requests each get their own answers."""

    async def session(index: int) -> list[Any]:
        async with ControlClient(server.path, timeout=10) as control:
            return [await control.request("echo", text=f"{index}-{i}") for i in range(10)]

    results = await asyncio.gather(*(session(index) for index in range(25)))
    for index, answers in enumerate(results):
        assert answers == [{"text": f"{index}-{i}"} for i in range(10)]


async def test_slow_handler_does_not_block_other_clients(
    server: ControlServer, handler: Handler
) -> None:
    """While one client's request waits in the handler, another client is answered."""
    async with (
        ControlClient(server.path, timeout=10) as slow,
        ControlClient(server.path, timeout=10) as quick,
    ):
        waiting = asyncio.create_task(slow.request("wait"))
        assert await quick.request("echo", text="first") == {"text": "first"}
        assert not waiting.done()
        handler.release.set()
        assert await waiting == "released"


async def test_client_timeout_closes_connection_and_recovers(
    server: ControlServer, handler: Handler
) -> None:
    """A request that times out raises ControlUnavailable; the next request reconnects."""
    async with ControlClient(server.path, timeout=0.05) as control:
        with pytest.raises(ControlUnavailable, match="may or may not have been applied"):
            await control.request("wait")
        control.timeout = 10
        assert await control.request("echo", text="again") == {"text": "again"}


# ---------------------------------------------------------------------------
# Watches


async def test_watch_streams_events_then_ends(client: ControlClient, handler: Handler) -> None:
    """A watch yields each event the handler streams and stops at the end marker."""
    events = [event async for event in client.watch("count", n=3)]
    assert events == [{"rev": 0}, {"rev": 1}, {"rev": 2}]
    await wait_for(handler.watch_closed)


async def test_watch_raw_lines_and_connection_reuse(raw: Raw) -> None:
    """On the wire a watch sends event lines, an end line, then the connection serves again."""
    await raw.send(b'{"id": "w", "op": "count", "n": 2}\n')
    assert await raw.reply() == {"id": "w", "ok": True, "event": {"rev": 0}}
    assert await raw.reply() == {"id": "w", "ok": True, "event": {"rev": 1}}
    assert await raw.reply() == {"id": "w", "ok": True, "end": True}
    assert (await raw.ask(b'{"id": 1, "op": "echo", "text": "z"}\n'))["ok"] is True


async def test_client_disconnect_mid_watch_closes_the_subscription(
    server: ControlServer, handler: Handler
) -> None:
    """Closing a watch early runs the handler's cleanup and frees the server connection."""
    async with ControlClient(server.path) as control:
        async with contextlib.aclosing(control.watch("count")) as events:
            assert await anext(events) == {"rev": 0}
            assert await anext(events) == {"rev": 1}
        await wait_for(handler.watch_closed)
        assert await control.request("echo", text="after") == {"text": "after"}
    for _ in range(200):
        if server.connections == 0:
            break
        await asyncio.sleep(0.01)
    assert server.connections == 0


async def test_raw_disconnect_mid_watch_closes_the_subscription(
    server: ControlServer, handler: Handler
) -> None:
    """A client that vanishes mid-watch (socket closed) is cleaned up by the server."""
    raw = await Raw.open(server.path)
    await raw.send(b'{"id": 1, "op": "count"}\n')
    await raw.reply()
    await wait_for(handler.watching)
    await raw.close()
    await wait_for(handler.watch_closed)
    assert server.serving


async def test_always_ready_watch_is_closed_on_disconnect_and_starves_nobody(
    server: ControlServer, handler: Handler
) -> None:
    """A stream that never waits still lets other clients in, and is closed when its client leaves."""
    async with ControlClient(server.path, timeout=10) as other:
        async with contextlib.aclosing(ControlClient(server.path).watch("firehose")) as events:
            assert await anext(events) == {"rev": 0}
            assert await other.request("echo", text="served") == {"text": "served"}
            assert await anext(events) == {"rev": 1}
        await wait_for(handler.watch_closed)


async def test_requests_during_a_watch_are_refused_on_that_connection(raw: Raw) -> None:
    """A line sent on a watching connection gets an INVALID_REQUEST naming its id; the watch goes on."""
    await raw.send(b'{"id": "w", "op": "count"}\n')
    assert (await raw.reply())["event"] == {"rev": 0}
    assert (await raw.reply())["event"] == {"rev": 1}
    reply = await raw.ask(b'{"id": 5, "op": "echo", "text": "a"}\n')
    assert reply["id"] == 5
    assert reply["error"]["code"] == "INVALID_REQUEST"
    assert "streaming a watch" in reply["error"]["message"]


async def test_watch_failure_is_an_error_line(client: ControlClient, raw: Raw) -> None:
    """A watch whose iterator raises ends with an INTERNAL error line; the connection lives on."""
    with pytest.raises(InternalError, match="the live state went away"):
        await drain(client.watch("broken_watch"))
    await raw.send(b'{"id": 1, "op": "broken_watch"}\n')
    assert (await raw.reply())["event"] == {"rev": 0}
    assert (await raw.reply())["error"]["code"] == "INTERNAL"
    assert (await raw.ask(b'{"id": 2, "op": "echo", "text": "b"}\n'))["ok"] is True


async def test_watch_and_request_misuse_are_refused(client: ControlClient) -> None:
    """watch() on a one-shot op and request() on a streaming op raise instead of hanging."""
    with pytest.raises(InvalidRequest, match="not a streaming op"):
        await drain(client.watch("echo", text="a"))
    with pytest.raises(UnknownOperation):
        await drain(client.watch("subscribe"))
    with pytest.raises(InvalidRequest, match="is a streaming op"):
        await client.request("count", n=1)
    assert await client.request("echo", text="fine") == {"text": "fine"}


async def test_server_close_ends_watches_and_runs_cleanup(
    sock_path: Path, handler: Handler
) -> None:
    """Closing the server cancels live watches (cleanup runs) and the client sees ControlUnavailable."""
    control = ControlServer(sock_path, handler)
    await control.start()
    client = ControlClient(sock_path)
    events = client.watch("count")
    assert await anext(events) == {"rev": 0}
    await control.close()
    await wait_for(handler.watch_closed)
    with pytest.raises(ControlUnavailable):
        await drain(events)
    assert not exists(sock_path)


# ---------------------------------------------------------------------------
# The socket file


async def test_close_removes_socket_and_liveness_follows(sock_path: Path) -> None:
    """live_server_at is true while serving and false after close, which removes the file."""
    assert not live_server_at(sock_path)
    async with ControlServer(sock_path, Handler()):
        assert live_server_at(sock_path)
        assert await asyncio.to_thread(live_server_at, sock_path)
    assert not exists(sock_path)
    assert not live_server_at(sock_path)


async def test_stale_socket_file_is_replaced(sock_path: Path) -> None:
    """A socket file left by a dead server is removed and the new server binds there."""
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock_path))
    dead.close()
    assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    assert not live_server_at(sock_path)
    async with (
        ControlServer(sock_path, Handler()),
        ControlClient(sock_path, timeout=10) as control,
    ):
        assert await control.request("echo", text="fresh") == {"text": "fresh"}


async def test_second_server_on_live_socket_is_refused(
    server: ControlServer, client: ControlClient
) -> None:
    """A second server on a path a live server answers is refused; the first keeps serving."""
    with pytest.raises(ControlSocketInUse, match="already answers") as caught:
        await ControlServer(server.path, Handler()).start()
    assert caught.value.code == "CONTROL_SOCKET_IN_USE"
    assert await client.request("echo", text="still mine") == {"text": "still mine"}
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600


async def test_non_socket_file_is_never_removed(sock_path: Path) -> None:
    """A regular file at the socket path is left untouched and the start is refused."""
    os.mkfifo(sock_path)
    with pytest.raises(ControlSocketInUse, match="not a socket"):
        await ControlServer(sock_path, Handler()).start()
    assert stat.S_ISFIFO(os.lstat(sock_path).st_mode)


async def test_close_leaves_a_successors_socket_alone(sock_path: Path) -> None:
    """A server closing after its file was replaced does not delete the new server's socket."""
    first = ControlServer(sock_path, Handler())
    await first.start()
    os.unlink(sock_path)
    second = ControlServer(sock_path, Handler())
    await second.start()
    await first.close()
    assert live_server_at(sock_path)
    await second.close()
    assert not exists(sock_path)


async def test_missing_directory_is_refused(short_dir: Path) -> None:
    """A socket in a directory that does not exist is refused with the reason."""
    with pytest.raises(InvalidRequest, match="No such file or directory"):
        await ControlServer(short_dir / "gone" / "h.sock", Handler()).start()


async def test_too_long_socket_path_is_refused(short_dir: Path) -> None:
    """A socket path past the AF_UNIX limit is refused with the way out, creating nothing."""
    path = short_dir / ("s" * 120)
    with pytest.raises(InvalidRequest, match="choose a shorter path"):
        await ControlServer(path, Handler()).start()
    assert not exists(path)


# ---------------------------------------------------------------------------
# Clients without a server, and the blocking helper


async def test_client_without_server_is_unavailable(sock_path: Path) -> None:
    """Requests and watches to a path nothing listens on raise the retryable ControlUnavailable."""
    with pytest.raises(ControlUnavailable) as caught:
        await ControlClient(sock_path).request("echo", text="a")
    assert caught.value.retryable
    assert "nothing was sent" in str(caught.value)
    with pytest.raises(ControlUnavailable):
        await anext(ControlClient(sock_path).watch("count"))


async def test_request_sync_round_trip_and_errors(server: ControlServer) -> None:
    """The blocking helper returns results and raises rebuilt errors, like the async client."""
    path = server.path
    assert await asyncio.to_thread(request_sync, path, "echo", text="s", times=2) == {"text": "ss"}
    with pytest.raises(OffsetConflict):
        await asyncio.to_thread(request_sync, path, "refuse")
    with pytest.raises(InvalidRequest, match="is a streaming op"):
        await asyncio.to_thread(request_sync, path, "count", n=1)


async def test_request_sync_timeout(server: ControlServer, handler: Handler) -> None:
    """request_sync gives up after its timeout with ControlUnavailable saying the outcome is unknown."""
    with pytest.raises(ControlUnavailable, match=r"within 0\.05 s"):
        await asyncio.to_thread(request_sync, server.path, "wait", timeout=0.05)
    handler.release.set()


def test_request_sync_without_server(short_dir: Path) -> None:
    """request_sync to a path with no server raises ControlUnavailable at once."""
    with pytest.raises(ControlUnavailable, match="nothing was sent"):
        request_sync(short_dir / "none.sock", "status")

"""The control socket: newline-delimited JSON requests to a running host, and its clients.

This module is the protocol only: a :class:`ControlServer` that frames,
validates and answers requests on a Unix domain socket, and the clients that
speak to it (:class:`ControlClient`, :func:`request_sync`). What the requests
*do* is up to a :class:`ControlHandler` the host supplies.

The wire, one JSON object per line (UTF-8, ``\\n``-terminated):

- request: ``{"id": <any JSON>, "op": "<name>", ...arguments}``;
- success: ``{"id": ..., "ok": true, "result": ...}``;
- failure: ``{"id": ..., "ok": false, "error": {"code", "message", "retryable", "details"}}``;
- a streaming op answers ``{"id": ..., "ok": true, "event": ...}`` per item, then
  ``{"id": ..., "ok": true, "end": true}`` if the handler's stream ends (or an
  error line if it fails). The connection is the subscription: the client stops
  a watch by closing it, and lines it sends meanwhile are answered with an
  ``INVALID_REQUEST`` error (use another connection).

Requests on one connection are answered in order; many connections are served
at once. Refusals, each a coded error reply that leaves the connection usable:
``MALFORMED_REQUEST`` (not UTF-8 JSON, not an object, no string ``op``),
``UNKNOWN_OP``, ``INVALID_REQUEST`` (arguments that do not fit the op's model),
``REQUEST_TOO_LARGE`` (a line over :data:`MAX_REQUEST_BYTES`; it is discarded
unread), and ``INTERNAL`` (the handler raised something other than a
:class:`~streamkit.errors.StreamkitError`; logged with its traceback). A
handler's own ``StreamkitError`` is sent as it is. Nothing a client sends can
stop the server.

The socket file is created with mode 0600 (it is chmod-ed before ``listen``, so
no other user can ever connect), is refused when a live server already answers
on the path, replaces a stale socket file a dead process left, and is removed
by :meth:`ControlServer.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from streamkit.control._socket import (
    MAX_SOCKET_PATH_BYTES,
    bind_private_socket,
    check_trusted_socket,
    live_server_at,
)
from streamkit.control._wire import (
    decode_reply,
    encode,
    encode_request,
    error_from_reply,
    error_line,
    invalid_args,
    malformed,
    reject_constant,
    result_of,
    unavailable,
)
from streamkit.errors import (
    ControlUnavailable,
    InternalError,
    InvalidRequest,
    RequestTooLarge,
    StreamkitError,
    UnknownOperation,
)

__all__ = [
    "MAX_REQUEST_BYTES",
    "MAX_SOCKET_PATH_BYTES",
    "ControlClient",
    "ControlHandler",
    "ControlServer",
    "NoArgs",
    "Operation",
    "error_from_reply",
    "host_socket",
    "live_server_at",
    "request_sync",
]

MAX_REQUEST_BYTES: Final = 2 * 1024 * 1024
"""The longest request line a server reads (without its newline)."""

MAX_REPLY_BYTES: Final = 1024 * 1024 * 1024
"""The longest reply line a client buffers: far above any real reply, so only a broken peer hits it."""

_READ_CHUNK = 64 * 1024
_SETTLE_TURNS = 3

_log = structlog.get_logger("streamkit.control")


class NoArgs(BaseModel):
    """The argument model of an op that takes none; also a base for argument models.

    Unknown arguments are refused (``extra="forbid"``), so a misspelt argument
    is an ``INVALID_REQUEST`` rather than silently ignored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class Operation:
    """One op a handler offers: its argument model and whether it streams."""

    args: type[BaseModel] = NoArgs
    """Validates the request's arguments (every key but ``id`` and ``op``)."""
    streaming: bool = False
    """True: answered by :meth:`ControlHandler.watch`; False: by :meth:`ControlHandler.handle`."""
    description: str = ""


class ControlHandler(Protocol):
    """What answers control requests (the host supplies one).

    The server validates every request against :attr:`operations` first, so a
    handler only ever sees an op it declared, with arguments already validated
    into that op's model.
    """

    @property
    def operations(self) -> Mapping[str, Operation]:
        """Every op offered, by name."""
        ...

    async def handle(self, op: str, args: BaseModel) -> Any:
        """Answer a one-shot op; the value is sent as ``result``.

        Return JSON data (pydantic models and objects with ``to_dict()`` are
        converted). Raise a :class:`~streamkit.errors.StreamkitError` to send
        that error; anything else is sent as ``INTERNAL`` and logged. Cancelled
        when the server closes.
        """
        ...

    def watch(self, op: str, args: BaseModel) -> AsyncIterator[Any]:
        """Start a streaming op: each item is sent as an ``event`` line.

        The iterator is closed (``aclose``) when the client disconnects or the
        server closes, so an async generator's ``finally`` is where a
        subscription is released.
        """
        ...


# ---------------------------------------------------------------------------
# Server


class _TooLong:
    """Marks a request line that exceeded the limit and was discarded."""


_TOO_LONG: Final = _TooLong()


class _ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


@dataclass(frozen=True, slots=True)
class _Request:
    id: Any
    op: str
    operation: Operation
    args: BaseModel


class _Connection:
    """One client connection: line framing with a length limit, and serialized writes."""

    __slots__ = ("_buffer", "_discarding", "_lock", "_max", "_reader", "_scanned", "_writer")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_bytes: int
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max = max_bytes
        self._buffer = bytearray()
        self._scanned = 0
        self._discarding = False
        self._lock = asyncio.Lock()

    async def next_line(self) -> bytes | _TooLong | None:
        """The next line, ``_TOO_LONG`` for one over the limit, or None at end of input."""
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                if self._discarding or len(line) > self._max:
                    self._discarding = False
                    return _TOO_LONG
                return line
            if self._discarding or len(self._buffer) > self._max:
                # Keep memory bounded: drop the overlong line as it streams in
                # and answer once its newline arrives.
                self._discarding = True
                self._buffer.clear()
            self._scanned = len(self._buffer)
            chunk = await self._reader.read(_READ_CHUNK)
            if not chunk:
                if self._buffer and not self._discarding:
                    # A last request without its newline is still a request.
                    line = bytes(self._buffer)
                    self._buffer.clear()
                    self._scanned = 0
                    return line
                return None
            self._buffer += chunk

    async def send(self, data: bytes) -> None:
        async with self._lock:
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, OSError) as exc:
                raise _ClientGone from exc


class ControlServer:
    """Serve a :class:`ControlHandler` on a Unix domain socket at ``path``.

    ``await start()`` creates the socket (mode 0600) and begins serving;
    ``await close()`` stops accepting, cancels every connection (closing
    their watch iterators) and removes the socket file if it is still ours.
    Also usable as ``async with ControlServer(path, handler): ...``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        handler: ControlHandler,
        *,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self.path = Path(path)
        self._handler = handler
        self._max = max_request_bytes
        self._server: asyncio.Server | None = None
        self._identity: tuple[int, int] | None = None
        self._socket: socket.socket | None = None
        # Every open connection: its task and its writer, registered the moment
        # the connection is accepted, so close() can reach even one whose task
        # has not run yet.
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @property
    def serving(self) -> bool:
        """Whether the server has started and not closed."""
        return self._server is not None

    @property
    def connections(self) -> int:
        """Client connections currently open."""
        return len(self._connections)

    async def start(self) -> None:
        """Create the socket and serve; raise :class:`ControlSocketInUse` if the path is taken.

        A socket file no server answers on (left by a dead process) is removed
        first. Anything else at the path, or a live server, is left alone.
        """
        if self._server is not None:
            raise InvalidRequest(
                f"control server at {str(self.path)!r} already started; nothing was changed",
                details={"path": str(self.path)},
            )
        sock = await asyncio.to_thread(bind_private_socket, self.path)
        try:
            info = os.stat(self.path)
            self._identity = (info.st_dev, info.st_ino)
            self._socket = sock
            self._server = await asyncio.start_unix_server(
                self._accept, sock=sock, limit=_READ_CHUNK
            )
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise
        _log.info("control.listening", path=str(self.path))

    async def close(self) -> None:
        """Stop serving: no new connections, open ones cancelled, the socket file removed."""
        server, self._server = self._server, None
        if server is None:
            return
        # Stop accepting first, then let connections accepted a moment ago finish
        # their setup (one task step each) before Server.close(): on Python 3.11
        # a connection whose setup runs after Server.close() fails to attach and
        # its socket leaks. Each one reaches _accept, which closes it.
        if self._socket is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._socket.fileno())
        for _ in range(_SETTLE_TURNS):
            await asyncio.sleep(0)
        server.close()
        connections = dict(self._connections)
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        # A task cancelled before its first step never ran its cleanup.
        for writer in connections.values():
            writer.close()
        await server.wait_closed()
        self._remove_socket_file()
        _log.info("control.closed", path=str(self.path))

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _remove_socket_file(self) -> None:
        # Only our own file: a successor may already have bound a new socket here.
        try:
            info = os.stat(self.path)
        except OSError:
            return
        if (info.st_dev, info.st_ino) == self._identity:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # accepted while closing
            writer.close()
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._connections[task] = writer
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._connections.pop(task, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(reader, writer, self._max)
        try:
            while True:
                line = await connection.next_line()
                if line is None:
                    return
                if isinstance(line, _TooLong):
                    await connection.send(error_line(None, self._too_long()))
                    continue
                if not line.strip():
                    continue
                request = self._parse(line)
                if not isinstance(request, _Request):
                    await connection.send(request)
                elif request.operation.streaming:
                    if not await self._stream(connection, request):
                        return
                else:
                    await connection.send(await self._call(request))
        except _ClientGone:
            return
        except Exception:
            # A bug in framing or dispatch costs this connection, never the server.
            _log.exception("control.connection_failed", path=str(self.path))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _too_long(self) -> RequestTooLarge:
        return RequestTooLarge(
            f"request line longer than {self._max} bytes; it was discarded unread and nothing "
            "was done; send a smaller request (split large appends)",
            details={"limit": self._max},
        )

    def _parse(self, line: bytes) -> _Request | bytes:
        """The validated request, or the encoded error reply refusing it."""
        try:
            data = json.loads(line.decode("utf-8"), parse_constant=reject_constant)
        except UnicodeDecodeError as exc:
            return error_line(None, malformed(f"the line is not UTF-8 (byte {exc.start})"))
        except (ValueError, RecursionError) as exc:
            return error_line(None, malformed(f"the line is not valid JSON ({exc})"))
        if not isinstance(data, dict):
            return error_line(
                None, malformed(f"a request must be a JSON object, got {type(data).__name__}")
            )
        request_id = data.pop("id", None)
        op = data.pop("op", None)
        if not isinstance(op, str) or not op:
            what = "has no 'op'" if op is None else f"has 'op' {op!r}, not a non-empty string"
            return error_line(request_id, malformed(f"the request {what}"))
        operations = self._handler.operations
        operation = operations.get(op)
        if operation is None:
            known = ", ".join(sorted(operations)) or "none"
            return error_line(
                request_id,
                UnknownOperation(
                    f"unknown op {op!r}; this server offers: {known}; nothing was done",
                    details={"op": op, "known": sorted(operations)},
                ),
            )
        try:
            args = operation.args.model_validate(data)
        except ValidationError as exc:
            return error_line(request_id, invalid_args(op, operation.args, exc))
        return _Request(request_id, op, operation, args)

    async def _call(self, request: _Request) -> bytes:
        try:
            result = await self._handler.handle(request.op, request.args)
        except StreamkitError as exc:
            return error_line(request.id, exc)
        except Exception as exc:
            return error_line(request.id, self._internal(request.op, exc, "failed"))
        try:
            return encode({"id": request.id, "ok": True, "result": result})
        except (TypeError, ValueError, RecursionError) as exc:
            return error_line(request.id, self._internal(request.op, exc, "returned a result"))

    async def _stream(self, connection: _Connection, request: _Request) -> bool:
        """Run one watch to its end; return False if the client went away."""
        try:
            items = self._handler.watch(request.op, request.args)
        except StreamkitError as exc:
            await connection.send(error_line(request.id, exc))
            return True
        except Exception as exc:
            error = self._internal(request.op, exc, "failed to start")
            await connection.send(error_line(request.id, error))
            return True
        pump = asyncio.create_task(self._pump(connection, request, items))
        listen = asyncio.create_task(self._listen_while_streaming(connection))
        try:
            await asyncio.wait({pump, listen}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            pump.cancel()
            listen.cancel()
            await asyncio.gather(pump, listen, return_exceptions=True)
        client_closed = listen.done() and not listen.cancelled() and listen.exception() is None
        pump_lost = not pump.cancelled() and isinstance(pump.exception(), _ClientGone)
        listen_lost = not listen.cancelled() and isinstance(listen.exception(), _ClientGone)
        return not (client_closed or pump_lost or listen_lost)

    async def _pump(
        self, connection: _Connection, request: _Request, items: AsyncIterator[Any]
    ) -> None:
        try:
            async for item in items:
                try:
                    line = encode({"id": request.id, "ok": True, "event": item})
                except (TypeError, ValueError, RecursionError) as exc:
                    error = self._internal(request.op, exc, "streamed an item")
                    await connection.send(error_line(request.id, error))
                    return
                await connection.send(line)
                # drain() does not suspend while the socket buffer has room, so
                # an always-ready stream would otherwise starve every other client.
                await asyncio.sleep(0)
            await connection.send(encode({"id": request.id, "ok": True, "end": True}))
        except _ClientGone:
            raise
        except StreamkitError as exc:
            await connection.send(error_line(request.id, exc))
        except Exception as exc:
            error = self._internal(request.op, exc, "failed while streaming")
            await connection.send(error_line(request.id, error))
        finally:
            # Runs on disconnect and on server close too (this task is then
            # cancelled): the handler's generator gets to release its subscription.
            closer = getattr(items, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()

    async def _listen_while_streaming(self, connection: _Connection) -> None:
        """Return when the client closes; answer anything it sends meanwhile with a refusal."""
        while True:
            line = await connection.next_line()
            if line is None:
                return
            if isinstance(line, _TooLong):
                await connection.send(error_line(None, self._too_long()))
                continue
            if not line.strip():
                continue
            request_id = None
            with contextlib.suppress(Exception):
                data = json.loads(line)
                if isinstance(data, dict):
                    request_id = data.get("id")
            await connection.send(
                error_line(
                    request_id,
                    InvalidRequest(
                        "this connection is streaming a watch; send other requests on another "
                        "connection (close this one to stop the watch); nothing was done",
                        details={"reason": "connection_streaming"},
                    ),
                )
            )

    def _internal(self, op: str, exc: BaseException, doing: str) -> InternalError:
        _log.error("control.handler_failed", op=op, doing=doing, path=str(self.path), exc_info=exc)
        return InternalError(
            f"op {op!r} {doing} unexpectedly: {type(exc).__name__}: {exc}; the server logged it "
            "and keeps serving; whether the op changed anything before failing depends on the op",
            details={"op": op, "exception": type(exc).__name__},
        )


# ---------------------------------------------------------------------------
# Clients


async def _open(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.open_unix_connection(os.fspath(path), limit=MAX_REPLY_BYTES)
    except OSError as exc:
        raise ControlUnavailable(
            f"no control server answers at {str(path)!r} ({exc.strerror or exc}); is the host "
            "running? nothing was sent",
            details={"path": str(path)},
        ) from exc


async def _read_reply(reader: asyncio.StreamReader, path: Path, op: str) -> dict[str, Any]:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        closed = ConnectionResetError(errno.ECONNRESET, "the server closed the connection")
        raise unavailable(path, closed, f"waiting for the reply to {op!r}") from exc
    except asyncio.LimitOverrunError as exc:
        raise ControlUnavailable(
            f"the reply to op {op!r} is longer than {MAX_REPLY_BYTES} bytes; it was not read",
            retryable=False,
        ) from exc
    except OSError as exc:
        raise unavailable(path, exc, f"waiting for the reply to {op!r}") from exc
    return decode_reply(raw, op)


class ControlClient:
    """An async client of a control socket.

    :meth:`request` sends one-shot ops over one connection, one at a time (it
    connects on first use and reconnects after a failure). :meth:`watch` opens
    its own connection per subscription, so requests and watches run side by
    side. An error reply raises the rebuilt error (see :func:`error_from_reply`);
    an unreachable server, a dropped connection or a timeout raises
    :class:`~streamkit.errors.ControlUnavailable`.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float | None = None) -> None:
        self.path = Path(path)
        self.timeout = timeout
        """Seconds to wait for each reply; None waits as long as the connection lives."""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0

    async def connect(self) -> None:
        """Open the request connection now (otherwise the first request does)."""
        if self._writer is None:
            self._reader, self._writer = await _open(self.path)

    async def close(self) -> None:
        """Close the request connection (watches close their own)."""
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def __aenter__(self) -> ControlClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def request(self, op: str, /, **args: Any) -> Any:
        """Send ``op`` with ``args`` and return the reply's ``result``.

        On cancellation or timeout the connection is closed (the reply may still
        be on its way), and the request may or may not have been applied.
        """
        self._next_id += 1
        request_id = self._next_id
        line = encode_request(request_id, op, args)
        async with self._lock:
            await self.connect()
            reader, writer = self._reader, self._writer
            assert reader is not None
            assert writer is not None
            try:
                async with asyncio.timeout(self.timeout):
                    try:
                        writer.write(line)
                        await writer.drain()
                    except OSError as exc:
                        raise unavailable(self.path, exc, f"sending {op!r}") from exc
                    reply = await _read_reply(reader, self.path, op)
            except TimeoutError as exc:
                await self.close()
                raise ControlUnavailable(
                    f"no reply to op {op!r} within {self.timeout} s; the connection was closed "
                    "and the request may or may not have been applied",
                    details={"path": str(self.path), "op": op},
                ) from exc
            except BaseException:
                # Dropped, cancelled or unreadable: the connection's state is
                # unknown, so the next request starts on a fresh one.
                await self.close()
                raise
            if reply.get("id") != request_id:
                await self.close()
                raise ControlUnavailable(
                    f"the reply to op {op!r} carries id {reply.get('id')!r}, not {request_id}; "
                    "the connection was out of step and was closed",
                    details={"path": str(self.path), "op": op},
                )
            if "event" in reply or "end" in reply:
                await self.close()  # the server keeps streaming on that connection
            return result_of(reply, op)

    async def watch(self, op: str, /, **args: Any) -> AsyncGenerator[Any, None]:
        """Yield the events of streaming ``op`` until the server ends it.

        Stop early by closing the iterator (``contextlib.aclosing``, or
        ``break`` then ``aclose()``): its connection closes and the server
        releases the subscription. A connection that drops raises
        :class:`~streamkit.errors.ControlUnavailable` (retryable): a live-state
        client then re-seeds with a fresh watch.
        """
        line = encode_request(1, op, args)
        reader, writer = await _open(self.path)
        try:
            try:
                writer.write(line)
                await writer.drain()
            except OSError as exc:
                raise unavailable(self.path, exc, f"sending {op!r}") from exc
            while True:
                reply = await _read_reply(reader, self.path, op)
                if reply.get("ok") is not True:
                    raise error_from_reply(reply.get("error"))
                if reply.get("end") is True:
                    return
                if "event" not in reply:
                    raise InvalidRequest(
                        f"op {op!r} is not a streaming op; use request() for it",
                        details={"op": op},
                    )
                yield reply["event"]
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def request_sync(
    path: str | os.PathLike[str], op: str, /, *, timeout: float = 10.0, **args: Any
) -> Any:
    """Blocking one-shot request (for the CLI): connect, send ``op``, return its result.

    Raises the rebuilt error of an error reply, or
    :class:`~streamkit.errors.ControlUnavailable` if nothing answers within
    ``timeout`` seconds (the request may then have been applied or not).
    """
    line = encode_request(1, op, args)
    name = os.fspath(path)
    deadline = time.monotonic() + timeout
    buffer = bytearray()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(timeout)
            sock.connect(name)
        except OSError as exc:
            raise ControlUnavailable(
                f"no control server answers at {name!r} ({exc.strerror or exc}); is the host "
                "running? nothing was sent",
                details={"path": name},
            ) from exc
        try:
            sock.sendall(line)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                chunk = sock.recv(_READ_CHUNK)
                if not chunk:
                    raise ConnectionResetError(errno.ECONNRESET, "closed before replying")
                buffer += chunk
                if len(buffer) > MAX_REPLY_BYTES:
                    raise ControlUnavailable(
                        f"the reply to op {op!r} is longer than {MAX_REPLY_BYTES} bytes",
                        retryable=False,
                    )
        except ControlUnavailable:
            raise
        except TimeoutError as exc:
            raise ControlUnavailable(
                f"no reply to op {op!r} from {name!r} within {timeout} s; the request may or "
                "may not have been applied",
                details={"path": name, "op": op},
            ) from exc
        except OSError as exc:
            raise unavailable(name, exc, f"waiting for the reply to {op!r}") from exc
    raw = bytes(buffer[: buffer.index(b"\n")])
    return result_of(decode_reply(raw, op), op)


def host_socket(db: str | os.PathLike[str], socket: str | os.PathLike[str] | None) -> str | None:
    """The control socket of a host on ``db``, checked; None if no server answers there.

    ``socket`` defaults to ``<db>.sock``. Before anything is sent the socket
    must be a mode-0600 socket owned by the owner of ``db`` (the current user
    while ``db`` does not exist), else :class:`~streamkit.errors.UntrustedSocket`.
    Send every request with ``db=os.path.realpath(db)``: a host refuses a
    request meant for another database (``INVALID_REQUEST``, nothing done), so
    a ``--socket`` pointing at another database's host is never written through.
    """
    name = os.fspath(socket) if socket is not None else os.fspath(db) + ".sock"
    if not os.path.lexists(name):
        return None
    try:
        owner = os.stat(db).st_uid
    except FileNotFoundError:
        owner = os.geteuid()
    check_trusted_socket(name, owner=owner)
    return name if live_server_at(name) else None

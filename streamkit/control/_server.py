"""The control socket's server: newline-delimited JSON requests answered by a handler.

:class:`ControlServer` frames, validates and answers requests on a Unix domain
socket; what the requests *do* is up to a :class:`ControlHandler` the host
supplies. The clients are in :mod:`._client`; the wire format is in
:mod:`._wire`.

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
``REQUEST_TOO_LARGE`` (a line over ``MAX_REQUEST_BYTES``; it is discarded
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
import json
import os
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from streamkit.control._socket import (
    bind_private_socket,
)
from streamkit.control._wire import (
    MAX_REQUEST_BYTES,
    READ_CHUNK,
    encode,
    error_line,
    invalid_args,
    malformed,
    reject_constant,
)
from streamkit.errors import (
    InternalError,
    InvalidRequest,
    RequestTooLarge,
    StreamkitError,
    UnknownOperation,
)

__all__ = ["ControlHandler", "ControlServer", "NoArgs", "Operation"]

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
            chunk = await self._reader.read(READ_CHUNK)
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
                self._accept, sock=sock, limit=READ_CHUNK
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
            async for line in self._lines(connection):
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

    async def _lines(self, connection: _Connection) -> AsyncIterator[bytes]:
        """The client's request lines until it closes: blank ones skipped, too long ones refused."""
        while True:
            line = await connection.next_line()
            if line is None:
                return
            if isinstance(line, _TooLong):
                await connection.send(error_line(None, self._too_long()))
            elif line.strip():
                yield line

    async def _listen_while_streaming(self, connection: _Connection) -> None:
        """Return when the client closes; answer anything it sends meanwhile with a refusal."""
        async for line in self._lines(connection):
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

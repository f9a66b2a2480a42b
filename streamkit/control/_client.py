"""The control socket's clients: :class:`ControlClient`, :func:`request_sync`, :func:`host_socket`.

A client checks a socket before it sends anything (it must be a socket of
mode 0600 owned by the database's owner), sends one request per line and
reads replies of at most ``MAX_REPLY_BYTES``; a coded error reply is raised
as the :class:`~streamkit.errors.StreamkitError` it names. A host that cannot
be reached is :class:`~streamkit.errors.ControlUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from streamkit._targets import default_socket
from streamkit.control._socket import (
    check_trusted_socket,
    live_server_at,
)
from streamkit.control._wire import (
    MAX_REPLY_BYTES,
    READ_CHUNK,
    decode_reply,
    encode_request,
    error_from_reply,
    result_of,
    unavailable,
)
from streamkit.errors import (
    ControlUnavailable,
    InvalidRequest,
)

__all__ = ["ControlClient", "host_socket", "request_sync"]


def _no_server(name: str, exc: OSError) -> ControlUnavailable:
    return ControlUnavailable(
        f"no control server answers at {name!r} ({exc.strerror or exc}); is the host "
        "running? nothing was sent",
        details={"path": name},
    )


async def _open(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.open_unix_connection(os.fspath(path), limit=MAX_REPLY_BYTES)
    except OSError as exc:
        raise _no_server(str(path), exc) from exc


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
            raise _no_server(name, exc) from exc
        try:
            sock.sendall(line)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                chunk = sock.recv(READ_CHUNK)
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

    ``socket`` defaults to the target's default socket (``<db>.sock`` for a
    file). Before anything is sent the socket
    must be a mode-0600 socket owned by the owner of ``db`` (the current user
    while ``db`` does not exist), else :class:`~streamkit.errors.UntrustedSocket`.
    Send every request with ``db=served_name(db)``: a host refuses a
    request meant for another database (``INVALID_REQUEST``, nothing done), so
    a ``--socket`` pointing at another database's host is never written through.
    """
    name = os.fspath(socket) if socket is not None else default_socket(db)
    if not os.path.lexists(name):
        return None
    try:
        owner = os.stat(db).st_uid
    except FileNotFoundError:
        owner = os.geteuid()
    check_trusted_socket(name, owner=owner)
    return name if live_server_at(name) else None

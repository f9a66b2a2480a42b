"""The HTTP connection layer: a deadline for every request head, and refusals that are problems.

uvicorn's HTTP protocol (httptools) with what a slow or hostile client must
not be able to do added, one connection at a time:

- a request's head (its request line and headers) must arrive within
  ``head_timeout`` (:data:`HEAD_SECONDS`) of the connection opening or of the
  request's first byte; a connection that trickles a head (slowloris) is answered
  ``408 REQUEST_TIMEOUT`` and closed;
- at most :data:`PENDING_HEADS_PER_CLIENT` connections of one client
  address may be waiting for their head at once; past that the client's
  oldest such connection is closed, so a flood of trickling connections
  evicts itself while a client whose head arrives at once (a health check
  from the same address) is served;
- a request the parser cannot read is answered ``400 MALFORMED_REQUEST`` as
  ``application/problem+json``, not uvicorn's plain text;
- a connection past the server's cap on open connections is answered
  ``503 HOST_BUSY`` (problem+json) and closed at once.

Bodies have their own deadline where they are read (:mod:`._body`), and the
number of requests served at once is the application's to bound
(:mod:`._guard`), so ``/healthz`` still answers while the rest are refused.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from streamkit.errors import HostBusy, MalformedRequest, RequestTimeout, StreamkitError
from streamkit.web._problems import PROBLEM_TYPE, problem_body

__all__ = ["HEAD_SECONDS", "PENDING_HEADS_PER_CLIENT", "guarded_protocol"]

HEAD_SECONDS = 10.0
"""The default of ``[http] head_timeout``: seconds a head may take, from the connection or
its first byte."""

PENDING_HEADS_PER_CLIENT = 64
"""Connections of one client address that may wait for their head at once."""

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}


class _PendingHeads:
    """The connections of each client address still waiting for a head, oldest first."""

    def __init__(self) -> None:
        self._by_client: dict[str, OrderedDict[GuardedProtocol, None]] = {}

    def add(self, client: str, connection: GuardedProtocol) -> GuardedProtocol | None:
        """Note ``connection`` waiting; the connection to evict if the client has too many."""
        waiting = self._by_client.setdefault(client, OrderedDict())
        waiting[connection] = None
        if len(waiting) > PENDING_HEADS_PER_CLIENT:
            oldest, _ = waiting.popitem(last=False)
            return oldest
        return None

    def discard(self, client: str, connection: GuardedProtocol) -> None:
        waiting = self._by_client.get(client)
        if waiting is None:
            return
        waiting.pop(connection, None)
        if not waiting:
            del self._by_client[client]


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the module's deadlines and problem answers."""

    pending: ClassVar[_PendingHeads]
    max_open: ClassVar[int]
    head_seconds: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._client_key = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._client_key = self.client[0] if self.client else ""
        if len(self.connections) > self.max_open:
            error = HostBusy(
                f"this host has {self.max_open} connections open, as many as it keeps; "
                "nothing was done; retry shortly",
                details={"limit": self.max_open},
            )
            self._answer_and_close(error, 503)
            return
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:
            self._await_head()  # the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._head_arrived()
        super().on_headers_complete()

    def timeout_keep_alive_handler(self) -> None:
        self._head_arrived()
        super().timeout_keep_alive_handler()

    def send_400_response(self, msg: str) -> None:
        self._head_arrived()
        error = MalformedRequest(
            f"the request could not be read as HTTP ({msg.rstrip('.')}); nothing was done",
            details={},
        )
        self._answer_and_close(error, 400)

    def _await_head(self) -> None:
        if self._head_timer is not None:
            return
        self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)
        evicted = self.pending.add(self._client_key, self)
        if evicted is not None:
            evicted._refuse_waiting(
                "this client has too many connections waiting to send a request; its oldest "
                "was closed"
            )

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.pending.discard(self._client_key, self)

    def _head_late(self) -> None:
        self._head_timer = None
        self._refuse_waiting(f"the request's head did not arrive within {self.head_seconds:g} s")

    def _refuse_waiting(self, why: str) -> None:
        self._head_arrived()
        error = RequestTimeout(f"{why}; nothing was done; send the request again", details={})
        self._answer_and_close(error, 408)

    def _answer_and_close(self, error: StreamkitError, status: int) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        body = json.dumps(problem_body(error, status=status), separators=(",", ":")).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(b"content-type: " + PROBLEM_TYPE.encode() + b"\r\n")
        head.append(b"content-length: %d\r\n" % len(body))
        head.append(b"connection: close\r\n\r\n")
        transport.write(b"".join(head) + body)
        transport.close()


def guarded_protocol(max_open: int, head_seconds: float = HEAD_SECONDS) -> type[GuardedProtocol]:
    """A protocol class of one server's own: its pending heads, its caps and deadline."""
    attributes = {"pending": _PendingHeads(), "max_open": max_open, "head_seconds": head_seconds}
    return type("ServerProtocol", (GuardedProtocol,), attributes)

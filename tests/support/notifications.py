"""Real local peers for the notification channel tests (not a test module).

:class:`WebhookPeer` is a stdlib HTTP server on 127.0.0.1 that records every
request (headers and JSON body) and answers from a script of status codes;
:class:`SmtpPeer` is a minimal SMTP server on 127.0.0.1 (socketserver, one
thread per connection) that records every message it accepts and refuses
recipients whose address starts with ``nobody``. Both run in a thread and are
context managers that shut down and close their sockets.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterable
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


class _ServedPeer:
    """Serves a local TCP server from a daemon thread while used as a context manager."""

    def __init__(self, server: socketserver.TCPServer) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class WebhookPeer(_ServedPeer):
    """An HTTP receiver: answers POSTs with ``statuses`` in order, then 200; records requests."""

    def __init__(
        self,
        statuses: Iterable[int] = (),
        *,
        location: str | None = None,
        drip_every: float | None = None,
        body_bytes: int = 2,
    ) -> None:
        """``location`` goes with every 3xx; ``drip_every`` sends the body one byte per that
        many seconds (a receiver that never finishes); ``body_bytes`` is the body's size."""
        self.statuses = list(statuses)
        self.requests: list[dict[str, Any]] = []
        self.gets = 0
        self.body_bytes_sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with peer._lock:
                    peer.gets += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with peer._lock:
                    peer.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "json": json.loads(body),
                        }
                    )
                    status = peer.statuses.pop(0) if peer.statuses else 200
                self.send_response(status)
                if location is not None and 300 <= status < 400:
                    self.send_header("Location", location)
                self.send_header("Content-Length", str(body_bytes))
                self.end_headers()
                try:
                    if drip_every is not None:
                        for _ in range(body_bytes):
                            if peer._stop.wait(drip_every):
                                return
                            self.wfile.write(b"x")
                            self.wfile.flush()
                    elif body_bytes == 2:
                        self.wfile.write(b"{}")
                    else:
                        chunk = b"x" * 65536
                        left = body_bytes
                        while left > 0 and not peer._stop.is_set():
                            piece = chunk[: min(left, len(chunk))]
                            self.wfile.write(piece)
                            left -= len(piece)
                            with peer._lock:
                                peer.body_bytes_sent += len(piece)
                except OSError:
                    return  # the client hung up, as it should on a capped or late answer

            def log_message(self, format: str, *args: Any) -> None:
                return None

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        super().__init__(server)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()  # a dripping or streaming handler ends at once
        super().__exit__(exc_type, exc, tb)

    def keys(self) -> list[str]:
        """The Idempotency-Key header of every request, in order."""
        return [r["headers"].get("idempotency-key", "") for r in self.requests]


class SmtpPeer(_ServedPeer):
    """A minimal SMTP server: records accepted messages; refuses ``nobody*`` recipients (550)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        peer = self

        class Handler(socketserver.StreamRequestHandler):
            def reply(self, line: str) -> None:
                self.wfile.write(line.encode() + b"\r\n")
                self.wfile.flush()

            def handle(self) -> None:
                self.reply("220 127.0.0.1 test SMTP ready")
                sender: str | None = None
                recipients: list[str] = []
                while True:
                    raw = self.rfile.readline()
                    if not raw:
                        return
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    verb = line[:4].upper()
                    if verb in ("HELO", "EHLO"):
                        self.reply("250 127.0.0.1")
                    elif verb == "MAIL":
                        sender, recipients = _address(line), []
                        self.reply("250 OK")
                    elif verb == "RCPT":
                        address = _address(line)
                        if address.startswith("nobody"):
                            self.reply("550 no such user here")
                        else:
                            recipients.append(address)
                            self.reply("250 OK")
                    elif verb == "DATA":
                        self.reply("354 end data with <CR><LF>.<CR><LF>")
                        data = bytearray()
                        while True:
                            chunk = self.rfile.readline()
                            if not chunk or chunk in (b".\r\n", b".\n"):
                                break
                            data += chunk[1:] if chunk.startswith(b"..") else chunk
                        message = message_from_bytes(bytes(data), policy=policy.default)
                        assert isinstance(message, EmailMessage)
                        peer.messages.append(
                            {"from": sender, "to": list(recipients), "message": message}
                        )
                        self.reply("250 OK queued")
                    elif verb == "QUIT":
                        self.reply("221 bye")
                        return
                    elif verb in ("RSET", "NOOP"):
                        self.reply("250 OK")
                    else:
                        self.reply("502 command not implemented")

        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        super().__init__(server)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port


def _address(line: str) -> str:
    start, end = line.find("<"), line.find(">")
    return line[start + 1 : end] if 0 <= start < end else line.split(":", 1)[-1].strip()

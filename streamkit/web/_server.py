"""Serving a host over HTTP: uvicorn on the host's own event loop, started and stopped with it.

:class:`HttpService` is a :class:`~streamkit.host.HostService`: the host
starts it after its own parts and closes it first when it stops. Guarantees:

- it binds only what the settings say, and a non-loopback address only with
  a token file (the settings refuse it otherwise); the token file must be
  readable by its owner alone, and not empty;
- it always serves with a token: without a token file it makes one at
  start (32 random bytes), kept in memory and handed out only over the
  control socket (``streamkit admin``), so the HTTP surface grants no more
  than the socket, which its owner alone can use;
- the socket is bound before the host reports started, so a port taken by
  something else fails the host's start (and nothing is left running);
- uvicorn installs no signal handlers: the host's own handle SIGTERM and
  SIGINT, and stop this server first;
- a stop ends every live stream (SSE) first, each with a ``: stopping``
  comment and a complete response, then lets the requests in flight finish
  within a grace; nothing is cut off mid-response while there is time;
- at most ``max_connections`` requests are served at once, ``/healthz``
  aside (:mod:`._limits`); a request head must arrive within a deadline and
  one client's trickling connections cannot crowd out the rest
  (:mod:`._protocol`); a body within another (:mod:`._body`); uvicorn's
  limits on header sizes and idle keep-alives hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import uvicorn

from streamkit.errors import InvalidConfig
from streamkit.web._app import build_app
from streamkit.web._protocol import guarded_protocol
from streamkit.web._sse import LiveStreams

if TYPE_CHECKING:
    from streamkit.config import HttpSettings
    from streamkit.host import ProcessorHost

__all__ = ["HttpService", "read_token"]

_log = structlog.get_logger("streamkit.web")

_START_TIMEOUT = 10.0

_CONNECTIONS_PER_REQUEST_SLOT = 4
"""Open connections allowed per request served at once (kept-alive and slow ones wait)."""

_MIN_CONNECTIONS = 1024
"""The fewest open connections the backstop allows (one client's waiting heads are capped)."""

_STOP_GRACE = 2
"""Seconds a stop gives live streams to end, and then requests in flight to finish."""


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the host owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpService:
    """The HTTP surface of one host (see the module docstring)."""

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.port: int | None = None
        """The port bound (the one the kernel chose for port 0); None until started."""
        self.token: str | None = None
        """The bearer token requests must carry; None until started."""
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._streams = LiveStreams()

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running server (the loopback for a wildcard listen)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.settings.host, self.settings.host)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"

    async def start(self, host: ProcessorHost) -> None:
        """Bind and serve ``host``; raises if the address cannot be bound."""
        settings = self.settings
        token = (
            secrets.token_urlsafe(32)
            if settings.token_file is None
            else read_token(settings.token_file)
        )
        app = build_app(host, settings, token, streams=self._streams)
        sock = _bind(settings.host, settings.port)
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            proxy_headers=False,
            server_header=False,
            date_header=True,
            # The app bounds the requests served (RequestLimit, /healthz aside); the
            # protocol caps the connections open, idle and trickling ones included.
            limit_concurrency=None,
            timeout_graceful_shutdown=_STOP_GRACE,
            http=guarded_protocol(
                max(_MIN_CONNECTIONS, settings.max_connections * _CONNECTIONS_PER_REQUEST_SLOT),
                settings.head_timeout,
            ),
        )
        server = self._server = _Server(config)
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        deadline = asyncio.get_running_loop().time() + _START_TIMEOUT
        while not server.started:
            if self._task.done() or asyncio.get_running_loop().time() > deadline:
                await self.close()
                raise InvalidConfig(
                    f"the HTTP server could not start on {settings.listen}; nothing is served "
                    "there; see the log for why",
                    details={"listen": settings.listen},
                )
            await asyncio.sleep(0.005)
        self.port = sock.getsockname()[1]
        self.token = token
        _log.info(
            "http.listening",
            url=self.url,
            token_file=None if settings.token_file is None else str(settings.token_file),
            admin="`streamkit admin` prints the admin page's address with its token",
        )

    def access(self) -> dict[str, str] | None:
        """``{url, token, admin}`` while serving (``admin``: the page's address with its token).

        For the control socket's ``http`` op: what its owner needs to call this
        server. The token rides in the address's fragment, which a browser
        never sends to a server; the page moves it into the tab's storage.
        """
        if self.port is None or self.token is None:
            return None
        return {"url": self.url, "token": self.token, "admin": f"{self.url}/#token={self.token}"}

    async def close(self) -> None:
        """Stop serving (open streams are ended); idempotent."""
        server, task = self._server, self._task
        self._server = self._task = None
        self.port = self.token = None
        if server is None or task is None:
            return
        ended = await self._streams.close_all(_STOP_GRACE)
        if ended:
            _log.info("http.streams_ended", streams=ended)
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Named IPPROTO_TCP, not 0: asyncio turns Nagle off only for sockets that say
    # TCP, and with it on, a response written in two parts waits out the client's
    # delayed ACK (measured: 42 ms per keep-alive request instead of 1.3 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise InvalidConfig(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); nothing was started; "
            "choose another address with --http or http = in streamkit.toml",
            details={"host": host, "port": port},
        ) from exc
    return sock


def read_token(path: Path) -> str:
    """The bearer token in ``path``: refused if missing, empty, or readable by others."""
    try:
        info = os.stat(path)
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InvalidConfig(
            f"the HTTP token file {str(path)!r} cannot be read ({exc.strerror}); nothing was "
            "started",
            details={"token_file": str(path)},
        ) from exc
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidConfig(
            f"the HTTP token file {str(path)!r} may be read by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}); make it the owner's alone (chmod 600); nothing "
            "was started",
            details={"token_file": str(path)},
        )
    if len(text) < 16 or any(c.isspace() for c in text):
        raise InvalidConfig(
            f"the HTTP token in {str(path)!r} must be at least 16 characters with no spaces "
            "(e.g. from `python -c 'import secrets; print(secrets.token_urlsafe(32))'`); nothing "
            "was started",
            details={"token_file": str(path)},
        )
    return text

"""How many requests a host serves at once: past the limit, a coded 503, never a hang.

:class:`RequestLimit` counts the requests being served (a live stream counts
for as long as it is open) and answers one past ``max_connections`` with
``503 HOST_BUSY`` (``application/problem+json``, ``Retry-After``) before it
reads anything. ``GET /healthz`` and ``GET /readyz`` are never counted nor
refused: a monitor must hear how the host is while the rest of its clients
are turned away.
Connections that have not sent a whole request head yet are the connection
layer's (:mod:`._protocol`): they hold no request here.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from streamkit.errors import HostBusy
from streamkit.web._problems import problem

__all__ = ["RequestLimit"]

_ALWAYS = frozenset({"/healthz", "/readyz"})


class RequestLimit:
    """Serves at most ``limit`` requests at once (the probes aside); see the module."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self._app = app
        self._limit = limit
        self._serving = 0

    @property
    def app(self) -> ASGIApp:
        """The application it limits."""
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _ALWAYS:
            await self._app(scope, receive, send)
            return
        if self._serving >= self._limit:
            error = HostBusy(
                f"this host serves {self._limit} requests at once (max_connections) and is "
                "serving that many; nothing was done; retry shortly",
                details={"limit": self._limit},
            )
            await problem(error, instance=scope["path"])(scope, receive, send)
            return
        self._serving += 1
        try:
            await self._app(scope, receive, send)
        finally:
            self._serving -= 1

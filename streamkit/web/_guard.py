"""What a request must show before any route reads it: a Host served here, a trusted Origin, the token.

The HTTP surface grants no more than the control socket, which only its
owner can use. Every host serves HTTP with a token (the configured
``token_file``, or one made at start and handed out over the control socket
by ``streamkit admin``). :class:`RequestGuard` wraps the application and,
in this order, refuses:

- a request whose ``Host`` is not one this server answers to (400
  ``INVALID_REQUEST``): the IP address it listens on (any address for a
  wildcard listen), ``localhost`` on the loopback or a wildcard, or a name in
  ``allowed_hosts``. A DNS-rebinding page reaches the server under its own
  name, so it is refused before anything is read;
- a state-changing request (any method but GET, HEAD and OPTIONS) that a
  browser sent from another origin (403 ``FORBIDDEN``): its ``Origin`` is
  neither this server's own nor one of ``cors_origins``;
- a request without ``Authorization: Bearer <token>`` (401
  ``UNAUTHORIZED``, compared in constant time), but ``GET`` of the open
  paths: ``/healthz``, ``/readyz``, what a refusal's ``type`` names, the admin page's own
  files (they carry no data; the page sends the token with every request it
  makes) and ``/metrics`` with ``open_metrics``.

A browser cannot attach the token to a request another origin's page makes,
and a body is read only when declared JSON (:mod:`._body`), so a page
elsewhere can make no write succeed, with or without the token check.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from streamkit.errors import Forbidden, InvalidRequest, StreamkitError, Unauthorized
from streamkit.web._problems import problem

__all__ = ["OPEN_PATHS", "RequestGuard", "served_names"]

OPEN_PATHS = frozenset({"/", "/healthz", "/readyz", "/favicon.ico"})
"""Paths every GET may read without the token: no data but the host's health."""

_OPEN_PREFIXES = ("/static/", "/problems/")

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_WILDCARDS = frozenset({"0.0.0.0", "::"})
_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def served_names(listen_host: str, allowed: Iterable[str]) -> tuple[frozenset[str], bool]:
    """The host names a Host header may carry, and whether any IP address is one.

    ``listen_host`` is the address bound; ``allowed`` the configured names.
    """
    names = {name.lower() for name in allowed}
    wildcard = listen_host in _WILDCARDS
    names.add(listen_host.lower())
    if wildcard or listen_host in _LOOPBACK:
        names.add("localhost")
    return frozenset(names), wildcard


class RequestGuard:
    """Refuses what the module names, before the wrapped application sees the request."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        listen_host: str,
        allowed_hosts: Iterable[str] = (),
        cors_origins: Iterable[str] = (),
        open_metrics: bool = False,
    ) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()
        self._names, self._any_address = served_names(listen_host, allowed_hosts)
        self._origins = frozenset(origin.lower() for origin in cors_origins)
        self._open = OPEN_PATHS | ({"/metrics"} if open_metrics else frozenset())

    @property
    def app(self) -> ASGIApp:
        """The application it guards."""
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        try:
            self._check(scope)
        except StreamkitError as error:
            await problem(error, instance=scope["path"])(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _check(self, scope: Scope) -> None:
        host = _header(scope, b"host")
        if host is not None and not self._serves(host):
            shown = host.decode("latin-1")[:200]
            raise InvalidRequest(
                f"this server does not answer to Host {shown!r} (a page reaching it under "
                "another name, as DNS rebinding does, is refused); nothing was done; call it by "
                "its address, or add the name to allowed_hosts under [http]",
                details={"host": shown},
            )
        method = scope.get("method", "GET")
        if method not in _SAFE_METHODS:
            origin = _header(scope, b"origin")
            if origin is not None and not self._trusted(origin, host):
                shown = origin.decode("latin-1")[:200]
                raise Forbidden(
                    f"a page from {shown!r} may not {method} here (a browser sent it from "
                    "another origin); nothing was done; name the origin in cors_origins under "
                    "[http] if its page is meant to call this host",
                    details={"origin": shown},
                )
        path = scope["path"]
        if method == "OPTIONS" or (
            method in ("GET", "HEAD") and (path in self._open or path.startswith(_OPEN_PREFIXES))
        ):
            # A CORS preflight never carries the token (browsers send none); it reads
            # and writes nothing, and the request it clears must carry the token.
            return
        given = _header(scope, b"authorization")
        if given is None or not hmac.compare_digest(given, self._expected):
            raise Unauthorized(
                "this host's HTTP surface needs its token: send Authorization: Bearer <token> "
                "(`streamkit admin --token` prints it where the host runs, or it is the content "
                "of the configured token_file); nothing was done",
                details={"path": path},
            )

    def _serves(self, host: bytes) -> bool:
        name = _host_name(host.decode("latin-1"))
        if name is None:
            return False
        if name in self._names:
            return True
        if not self._any_address:
            return False
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def _trusted(self, origin: bytes, host: bytes | None) -> bool:
        text = origin.decode("latin-1").lower()
        if text in self._origins:
            return True
        if host is None:
            return False
        # Same origin: the page was served by this server under the Host it calls.
        own = host.decode("latin-1").lower()
        return text in (f"http://{own}", f"https://{own}")


def _host_name(value: str) -> str | None:
    """The name part of a Host header (``[::1]:80`` -> ``::1``), lowercased; None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (end + 1 < len(value) and value[end + 1] != ":"):
            return None
        return value[1:end]
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".") or None


def _header(scope: Scope, name: bytes) -> bytes | None:
    headers: Any = scope.get("headers") or []
    for key, value in headers:
        if key.lower() == name:
            return bytes(value)
    return None

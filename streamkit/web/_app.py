"""The ASGI application of a host's HTTP surface: routes, the token rule, refusals as problems.

:func:`build_app` binds :class:`~._routes.Endpoints` to a host. Guarantees:

- every request passes :class:`~._guard.RequestGuard` first: a Host served
  here, no write from another origin's page, the token (all but the open
  paths); a refused request is answered before its body is read;
- no cookie is ever read or set; no CORS header is sent unless origins are
  named (``cors_origins``, never a wildcard), so browsers keep other
  origins' scripts out;
- every refusal is ``application/problem+json`` with the error's code, and a
  handler that fails unexpectedly answers 500 ``INTERNAL`` (logged with its
  traceback); nothing a client sends stops the server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from streamkit.errors import (
    InternalError,
    InvalidRequest,
    NotFound,
    StreamkitError,
)
from streamkit.web._body import json_body
from streamkit.web._guard import RequestGuard
from streamkit.web._limits import RequestLimit
from streamkit.web._plugins import HttpAnswer, HttpCall, HttpRoute, plugin_routes
from streamkit.web._problems import problem
from streamkit.web._routes import Endpoints
from streamkit.web._sse import LiveStreams

if TYPE_CHECKING:
    from streamkit.config import HttpSettings
    from streamkit.host import ProcessorHost

__all__ = ["build_app"]

_log = structlog.get_logger("streamkit.web")


def build_app(
    host: ProcessorHost,
    settings: HttpSettings,
    token: str,
    *,
    plugins: Sequence[HttpRoute] | None = None,
    streams: LiveStreams | None = None,
) -> ASGIApp:
    """The application serving ``host``, guarded by ``token`` (see :mod:`._guard`).

    ``plugins`` are the routes packages add (default: the installed
    ``streamkit.http`` entry points, :mod:`._plugins`). ``streams`` tracks the
    live streams served, for the server to end them when it stops.
    """
    endpoints = Endpoints(host, settings, streams)
    routes = [
        Route("/v1/events", endpoints.append, methods=["POST"]),
        Route("/v1/events", endpoints.events, methods=["GET"]),
        Route("/v1/events/{offset}", endpoints.event, methods=["GET"]),
        Route("/v1/paths", endpoints.paths, methods=["GET"]),
        Route("/v1/hosts", endpoints.hosts, methods=["GET"]),
        Route("/v1/processors", endpoints.processors, methods=["GET"]),
        Route("/v1/processors/{slug}", endpoints.processor, methods=["GET"]),
        Route("/v1/processors/{slug}/live", endpoints.live, methods=["GET"]),
        Route("/v1/processors/{slug}/processed", endpoints.processed, methods=["GET"]),
        Route("/v1/processors/{slug}/skip", endpoints.skip, methods=["POST"]),
        Route("/v1/processors/{slug}/versions", endpoints.versions, methods=["GET"]),
        Route("/v1/processors/{slug}/cutover", endpoints.cutover, methods=["POST"]),
        Route("/v1/processors/{slug}/rollback", endpoints.rollback, methods=["POST"]),
        Route("/healthz", endpoints.healthz, methods=["GET"]),
        Route("/readyz", endpoints.readyz, methods=["GET"]),
        Route("/metrics", endpoints.metrics, methods=["GET"]),
        Route("/problems/{code}", endpoints.problem_type, methods=["GET"]),
        Route("/", _admin_page, methods=["GET"]),
        Route("/favicon.ico", _favicon, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    for route in plugin_routes() if plugins is None else plugins:
        routes.append(
            Route(route.path, _plugin_endpoint(host, settings, route), methods=[route.method])
        )
    app = Starlette(
        routes=routes,
        exception_handlers={
            StreamkitError: _refused,
            HTTPException: _http_refused,
            Exception: _failed,
        },
    )
    served: ASGIApp = app
    if settings.cors_origins:
        served = CORSMiddleware(
            app,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "If-Match", "Idempotency-Key"],
            allow_credentials=False,
            max_age=600,
        )
    served = RequestLimit(served, settings.max_connections)
    return RequestGuard(
        served,
        token=token,
        listen_host=settings.host,
        allowed_hosts=settings.allowed_hosts,
        cors_origins=settings.cors_origins,
        open_metrics=settings.open_metrics,
    )


STATIC = Path(__file__).parent / "static"
"""The admin page's files: HTML, CSS and JavaScript, served as they are (no build step)."""

# The page loads its own script and style only: no inline code, no other origin.
_PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


async def _admin_page(request: Request) -> Response:
    return FileResponse(
        STATIC / "index.html",
        headers={"Content-Security-Policy": _PAGE_POLICY, "Cache-Control": "no-store"},
    )


async def _favicon(request: Request) -> Response:
    """Browsers ask for /favicon.ico whatever the page links: the same icon, no 404 in the log."""
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


def _plugin_endpoint(
    host: ProcessorHost, settings: HttpSettings, route: HttpRoute
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        body = None
        if route.method == "POST":
            body = await json_body(request, settings.max_request_bytes, settings.body_timeout)
        call = HttpCall(host, dict(request.path_params), dict(request.query_params), body)
        answer = await route.handler(call)
        if isinstance(answer, HttpAnswer):
            return JSONResponse(answer.body, status_code=answer.status)
        return JSONResponse(answer)

    return endpoint


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StreamkitError)
    return problem(exc, instance=request.url.path)


async def _http_refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        error: StreamkitError = NotFound(
            f"{request.method} {request.url.path} is not served here (see docs/http.md for "
            "the endpoints); nothing was done",
            details={"path": request.url.path},
        )
        return problem(error, instance=request.url.path)
    error = InvalidRequest(
        f"{request.method} {request.url.path} was refused ({exc.status_code}: {exc.detail}); "
        "nothing was done",
        details={"status": exc.status_code},
    )
    response = problem(error, instance=request.url.path, status=exc.status_code)
    response.headers.update(exc.headers or {})  # a 405's Allow
    return response


async def _failed(request: Request, exc: Exception) -> Response:
    _log.error(
        "http.handler_failed",
        method=request.method,
        path=request.url.path,
        error=repr(exc),
        exc_info=exc,
    )
    error = InternalError(
        f"the host failed to answer {request.method} {request.url.path} ({type(exc).__name__}); "
        "it was logged; what the request asked may or may not have been done",
        details={},
    )
    return problem(error, instance=request.url.path)

"""HTTP routes that packages add: the ``streamkit.http`` entry-point group.

The core HTTP surface never imports a processor. A package (the first-party
tasks and dlq processors, or a user's) adds its operator verbs by naming, in
the ``streamkit.http`` entry-point group, a function that returns
:class:`HttpRoute` values, and its own metrics by naming, in the
``streamkit.metrics`` group, an async function that returns
:class:`Gauge` values read from the host (a DLQ's depth, tasks by status). A route's handler takes an :class:`HttpCall` (the
host, the path parameters, the query and the parsed JSON body) and returns
an :class:`HttpAnswer` or any JSON value (a 200); a
:class:`~streamkit.errors.StreamkitError` it raises is the refusal, as
everywhere. Handlers see plain Python values only, never the web framework,
so a plugin depends on this module alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import structlog

if TYPE_CHECKING:
    from streamkit.host import ProcessorHost

__all__ = [
    "METRICS_GROUP",
    "ROUTES_GROUP",
    "Gauge",
    "HttpAnswer",
    "HttpCall",
    "HttpRoute",
    "plugin_gauges",
    "plugin_routes",
]

ROUTES_GROUP = "streamkit.http"
METRICS_GROUP = "streamkit.metrics"

_log = structlog.get_logger("streamkit.web")


@dataclass(frozen=True)
class HttpCall:
    """One request to a plugin route, as plain values."""

    host: ProcessorHost
    path_params: Mapping[str, str]
    query: Mapping[str, str]
    body: Any = None
    """The parsed JSON body (None for a GET, or a request without one)."""


@dataclass(frozen=True)
class HttpAnswer:
    """A handler's answer: a status and a JSON body."""

    status: int
    body: Any = field(default=None)


class HttpRoute(NamedTuple):
    """A route a plugin adds: ``/v1/...`` paths with ``{name}`` parameters."""

    method: Literal["GET", "POST"]
    path: str
    handler: Callable[[HttpCall], Awaitable[Any]]


def plugin_routes() -> list[HttpRoute]:
    """Every route the installed ``streamkit.http`` entry points add (a broken one is logged)."""
    routes: list[HttpRoute] = []
    for point in entry_points(group=ROUTES_GROUP):
        try:
            add: Callable[[], list[HttpRoute]] = point.load()
            routes.extend(add())
        except Exception as exc:  # one broken plugin must not take the HTTP surface down
            _log.error("http.plugin_failed", entry_point=point.name, error=repr(exc), exc_info=exc)
    return routes


@dataclass(frozen=True)
class Gauge:
    """One gauge a plugin reports: its name (``streamkit_`` prefixed), help, and labelled values."""

    name: str
    help: str
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)


async def plugin_gauges(host: ProcessorHost) -> list[Gauge]:
    """The gauges every installed ``streamkit.metrics`` entry point reports now (failures logged)."""
    gauges: list[Gauge] = []
    for point in entry_points(group=METRICS_GROUP):
        try:
            read: Callable[[ProcessorHost], Awaitable[list[Gauge]]] = point.load()
            gauges.extend(await read(host))
        except Exception as exc:  # a scrape still answers with everything else
            _log.warning(
                "http.metrics_plugin_failed", entry_point=point.name, error=repr(exc), exc_info=exc
            )
    return gauges

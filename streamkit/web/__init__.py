"""The HTTP surface of a host (the ``web`` extra: Starlette, uvicorn, prometheus-client).

``streamkit host --http 127.0.0.1:8700`` serves, from the host's own event
loop, the events (append, read, follow as Server-Sent Events), the
processors (status, snapshot, live state as SSE, skip), ``/healthz`` and
``/metrics``. See docs/http.md and docs/metrics.md.
"""

from streamkit.web._app import build_app
from streamkit.web._plugins import (
    METRICS_GROUP,
    ROUTES_GROUP,
    Gauge,
    HttpAnswer,
    HttpCall,
    HttpRoute,
)
from streamkit.web._server import HttpService, read_token

__all__ = [
    "METRICS_GROUP",
    "ROUTES_GROUP",
    "Gauge",
    "HttpAnswer",
    "HttpCall",
    "HttpRoute",
    "HttpService",
    "build_app",
    "read_token",
]

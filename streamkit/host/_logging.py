"""How the ``streamkit host`` daemon writes its log lines (structlog).

One line per notable thing, to stderr: JSON objects when stderr is not a
terminal (for collectors), ``key=value`` text on a terminal (for people).
A line that carries an exception (every failure of user code does) holds its
traceback: in JSON as structured data (``exception``: a list of the chained
exceptions, each with its type, message and frames: file, line, function),
never the frames' local variables, which may hold secrets.
Lines of the libraries underneath (uvicorn, asyncio, psycopg) that go through
the standard :mod:`logging` module are rendered the same way, tracebacks
included, so a JSON log holds nothing but JSON lines. A program that embeds
:class:`~streamkit.host.ProcessorHost` configures logging itself; only the CLI
calls :func:`configure_logging`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, TextIO

import structlog

__all__ = ["configure_logging"]


def configure_logging(fmt: Literal["json", "console"], stream: TextIO | None = None) -> None:
    """Send structlog output, and stdlib logging's from WARNING up, to ``stream`` in one format."""
    out = stream or sys.stderr
    stamps: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: list[Any]
    if fmt == "json":
        renderer = [
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False, use_rich=False)
            ),
            structlog.processors.JSONRenderer(sort_keys=False),
        ]
    else:
        # The console renderer formats exceptions itself (and warns if they were already).
        renderer = [structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(
        processors=[*stamps, *renderer],
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamps],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)

"""How the ``streamkit host`` daemon writes its log lines (structlog).

One line per notable thing, to stderr: JSON objects when stderr is not a
terminal (for collectors), ``key=value`` text on a terminal (for people). A
program that embeds :class:`~streamkit.host.ProcessorHost` configures
structlog itself; only the CLI calls :func:`configure_logging`.
"""

from __future__ import annotations

import sys
from typing import Any, Literal, TextIO

import structlog

__all__ = ["configure_logging"]


def configure_logging(fmt: Literal["json", "console"], stream: TextIO | None = None) -> None:
    """Send structlog output to ``stream`` (default stderr) as JSON lines or key=value text."""
    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        processors += [
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ]
    else:
        # The console renderer formats exceptions itself (and warns if they were already).
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=processors,
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )

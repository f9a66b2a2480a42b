"""How far a version re-reduce has come: what ``status`` shows and the log says while it runs.

A processor restarted under a new contract version re-reduces the log from
the start up to its old cursor before it serves (reduce only, no effects).
On a long log that takes a while, and a host that says nothing meanwhile
looks dead or, worse, caught up (its cursor is the old one). A
:class:`Rebuild` is created when the re-reduce starts and dropped when it
ends; it owns the position reached, the events folded and the timing, logs
``processor.rebuild.started``, ``processor.rebuild.progress`` every
:data:`PROGRESS_EVERY` seconds and ``processor.rebuild.done``, and gives
the snapshot ``statistics()`` carries.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

__all__ = ["PROGRESS_EVERY", "Rebuild"]

PROGRESS_EVERY = 5.0
"""Seconds between two ``processor.rebuild.progress`` log lines."""

_log = structlog.get_logger("streamkit.engine")


class Rebuild:
    """One re-reduce of ``(0, target]`` for a new contract version (see the module)."""

    def __init__(self, slug: str, version: str, target: int) -> None:
        self.slug = slug
        self.version = version
        self.target = target
        self.through = 0
        self.events = 0
        self._started = time.monotonic()
        self._logged = self._started
        _log.info("processor.rebuild.started", slug=slug, version=version, target=target)

    def advanced(self, through: int, events: int) -> None:
        """The re-reduce folded ``events`` in all and reached ``through`` (after each page)."""
        self.through = through
        self.events = events
        now = time.monotonic()
        if now - self._logged >= PROGRESS_EVERY:
            self._logged = now
            _log.info("processor.rebuild.progress", slug=self.slug, **self.snapshot(now))

    def done(self) -> None:
        _log.info("processor.rebuild.done", slug=self.slug, **self.snapshot())

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """``{version, through, target, events, seconds, events_per_second, eta_seconds}``."""
        seconds = (time.monotonic() if now is None else now) - self._started
        rate = self.events / seconds if seconds > 0 else None
        left = self.target - self.through
        return {
            "version": self.version,
            "through": self.through,
            "target": self.target,
            "events": self.events,
            "seconds": round(seconds, 3),
            "events_per_second": None if rate is None else round(rate, 1),
            "eta_seconds": round(left / rate, 1) if rate and self.through else None,
        }

"""How far a shadow rebuild has come: what ``status`` shows and the log says while it runs.

A processor started under a new contract version builds in the shadow: it
reduces the log up to the serving version's cursor before it cuts over
(reduce only, no effects). On a long log that takes a while, and a host
that says nothing meanwhile looks dead or, worse, caught up. A
:class:`Rebuild` is created when the rebuild starts (or resumes from the
shadow's own checkpoint) and dropped when it ends; it owns the position
reached, the events folded and the timing, logs
``processor.rebuild.started``, ``processor.rebuild.progress`` every
:data:`PROGRESS_EVERY` seconds and ``processor.rebuild.done``, says when
the shadow's row is due to be written (every :data:`CHECKPOINT_EVERY`
seconds: a crash loses at most that much of the work), holds the
:class:`~._turns.Turns` its pages are read and folded in, and gives the
snapshot ``statistics()`` carries (with how long it gave way to the host's
serving processors).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from streamkit.engine._pages import MAX_CATCH_UP_PAGE
from streamkit.engine._turns import Turns

__all__ = ["CHECKPOINT_EVERY", "PROGRESS_EVERY", "Rebuild"]

PROGRESS_EVERY = 5.0
"""Seconds between two ``processor.rebuild.progress`` log lines."""

CHECKPOINT_EVERY = 2.0
"""Seconds of rebuilding between two checkpoints of the shadow's row.

A write encodes the whole state: every page would cost a large state its
encoding 500 events at a time; every 2 s it costs well under 1% of the
rebuild, and a crash repeats at most 2 s of it.
"""

_log = structlog.get_logger("streamkit.engine")


class Rebuild:
    """One rebuild of ``(start, target]`` for a version in the shadow (see the module)."""

    def __init__(
        self,
        slug: str,
        version: str,
        target: int,
        start: int = 0,
        give_way: Callable[[float], Awaitable[float]] | None = None,
    ) -> None:
        self.slug = slug
        self.version = version
        self.target = target
        self.start = start
        self.through = start
        self.events = 0
        self.waiting = False
        """Built, and holding at the serving cursor for an operator's cutover (manual mode)."""
        self.held: str | None = None
        """Why an automatic cutover holds for an operator (None: it does not, or is manual)."""
        self._started = time.monotonic()
        self._logged = self._started
        self._saved = self._started
        self.turns = Turns(give_way, most=MAX_CATCH_UP_PAGE)
        """How it shares the loop with the host's serving processors."""
        _log.info(
            "processor.rebuild.started", slug=slug, version=version, target=target, resumed_at=start
        )

    def checkpoint_due(self) -> bool:
        """Whether the shadow's row is due to be written now (then the clock restarts)."""
        now = time.monotonic()
        if now - self._saved < CHECKPOINT_EVERY:
            return False
        self._saved = now
        return True

    def advanced(self, through: int, events: int) -> None:
        """The re-reduce folded ``events`` in all and reached ``through`` (after each page)."""
        self.through = through
        self.events = events
        now = time.monotonic()
        if now - self._logged >= PROGRESS_EVERY:
            self._logged = now
            _log.info("processor.rebuild.progress", slug=self.slug, **self.snapshot(now))

    def wait_for_cutover(self, held: str | None = None) -> None:
        """Built up to the serving cursor: it follows it now until an operator cuts over.

        ``held``: why an automatic cutover waits (logged as a warning, shown in status).
        """
        self.waiting = True
        self.held = held
        detail = (
            "built in the shadow; it follows the serving version until an operator runs "
            "`streamkit processor cutover`"
        )
        # Held, it is a warning: the version skipped what the serving one read.
        say = _log.info if held is None else _log.warning
        say(
            "processor.cutover.waiting" if held is None else "processor.cutover.held",
            slug=self.slug,
            version=self.version,
            through=self.through,
            reason=held,
            detail=detail,
        )

    def done(self) -> None:
        _log.info("processor.rebuild.done", slug=self.slug, **self.snapshot())

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """``{version, start, through, target, events, seconds, events_per_second, eta_seconds,
        gave_way_seconds, awaiting_cutover, cutover_held}``."""
        seconds = (time.monotonic() if now is None else now) - self._started
        rate = self.events / seconds if seconds > 0 else None
        left = self.target - self.through
        return {
            "version": self.version,
            "start": self.start,
            "through": self.through,
            "target": self.target,
            "events": self.events,
            "seconds": round(seconds, 3),
            "events_per_second": None if rate is None else round(rate, 1),
            "eta_seconds": round(left / rate, 1) if rate and self.through else None,
            "gave_way_seconds": round(self.turns.waited, 3),
            "awaiting_cutover": self.waiting,
            "cutover_held": self.held,
        }

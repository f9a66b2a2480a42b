"""The host's alarm: sleeps until the earliest claim of a processor it runs, then revives it.

Claims live in the log's claims table (one per path and slug, written by each
engine through its stream), so they survive restarts: a host that starts finds
the claim a dead host left and revives that processor as soon as it holds the
lease. The alarm keeps each runner's due time in memory (loaded when the
runner's engine starts, updated on every claim the engine sends) and wakes
early whenever one changes.

Spending a claim: the alarm forgets the due time and queues a revive; the
revive ends by sending the claim the engine wants now (none when nothing is
owed), which replaces the spent one in the table. A host that dies before that
leaves the claim due, so the next host revives again: at least once, never lost.

A processor that keeps asking for a wakeup in the past cannot spin the host:
one runner is revived at most once per ``min_gap`` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import structlog

from streamkit.host._runner import ProcessorRunner
from streamkit.protocols import Clock

__all__ = ["Alarm"]

_log = structlog.get_logger("streamkit.host")

MAX_SLEEP = 30.0
"""Seconds the alarm sleeps at most, so a wall clock that jumps is noticed."""


class Alarm:
    """Revives due processors (see the module docstring)."""

    def __init__(
        self, runners: Sequence[ProcessorRunner], *, clock: Clock, min_gap: float = 0.05
    ) -> None:
        self._runners = runners
        self._clock = clock
        self._min_gap = min_gap
        self._changed = asyncio.Event()
        self._last_revive: dict[int, float] = {}

    def changed(self) -> None:
        """A claim moved: re-plan the next wakeup."""
        self._changed.set()

    async def run(self) -> None:
        """Loop until cancelled."""
        while True:
            self._changed.clear()
            now = self._clock()
            next_due: float | None = None
            for runner in self._runners:
                due = runner.claim_due
                if due is None or runner.engine is None:
                    continue
                if due <= now:
                    since = time.monotonic() - self._last_revive.get(id(runner), -1e9)
                    if since < self._min_gap:
                        wait_for = now + (self._min_gap - since)
                        next_due = wait_for if next_due is None else min(next_due, wait_for)
                        continue
                    self._last_revive[id(runner)] = time.monotonic()
                    runner.claim_due = None
                    _log.info("claim.spent", slug=runner.slug, path=runner.path, due=due)
                    runner.request_revive()
                else:
                    next_due = due if next_due is None else min(next_due, due)
            sleep = MAX_SLEEP if next_due is None else min(MAX_SLEEP, max(0.0, next_due - now))
            try:
                async with asyncio.timeout(sleep):
                    await self._changed.wait()
            except TimeoutError:
                pass

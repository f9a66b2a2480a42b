"""Work that was cancelled and did not stop: counted, named, and never waited for past a bound.

A coroutine can catch ``CancelledError`` and go on (a task handler that
swallows it in a loop, a blocker that retries on any exception). Awaiting
such work after cancelling it waits for ever, so a stop or a hand-off never
ends. :class:`Strays` is where an engine hands every piece of work it (or its
processor) cancelled: work still running :data:`CANCEL_WAIT` seconds after its
cancel is a stray, logged once as ``processor.work_refused_cancel`` with its
label, counted (``refused_cancel``, since start) and named while it runs
(``refusing_cancel``: status, ``/metrics``, the admin page). Nothing waits
for a stray: a host's stop passes it, and a daemon whose stop is done exits
with its strays still running (see ``ProcessorHost.run``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog

__all__ = ["CANCEL_WAIT", "Strays"]

_log = structlog.get_logger("streamkit.engine")

CANCEL_WAIT = 2.0
"""Seconds cancelled work gets to stop before it counts as a stray."""


class Strays:
    """The cancelled work of one engine that has not stopped yet (see the module)."""

    def __init__(self, slug: str) -> None:
        self._slug = slug
        self._watched: dict[asyncio.Future[Any], str] = {}
        self._strays: dict[asyncio.Future[Any], str] = {}
        self.refused_cancel = 0
        """Pieces of work that were still running CANCEL_WAIT seconds after their cancel."""

    @property
    def refusing_cancel(self) -> list[str]:
        """The labels of the strays still running now."""
        return sorted(self._strays.values())

    def watch(self, work: asyncio.Future[Any], label: str) -> None:
        """``work`` was just cancelled: a stray if it still runs :data:`CANCEL_WAIT` s from now."""
        if work.done() or work in self._watched:
            return
        self._watched[work] = label
        work.add_done_callback(self._stopped)
        asyncio.get_running_loop().call_later(CANCEL_WAIT, self._check, work)

    async def wait_out(self, cancelled: Iterable[tuple[asyncio.Future[Any], str]]) -> None:
        """Wait up to :data:`CANCEL_WAIT` s for work just cancelled; what still runs is a stray."""
        pending = {work: label for work, label in cancelled if not work.done()}
        if not pending:
            return
        _, still = await asyncio.wait(pending, timeout=CANCEL_WAIT)
        for work in still:
            self._watched.setdefault(work, pending[work])
            work.add_done_callback(self._stopped)
            self._stray(work)

    def _check(self, work: asyncio.Future[Any]) -> None:
        if not work.done() and work in self._watched:
            self._stray(work)

    def _stray(self, work: asyncio.Future[Any]) -> None:
        if work in self._strays:
            return
        label = self._watched[work]
        self._strays[work] = label
        self.refused_cancel += 1
        _log.warning(
            "processor.work_refused_cancel",
            slug=self._slug,
            work=label,
            detail=f"still running {CANCEL_WAIT} s after it was cancelled (it catches "
            "CancelledError); nothing waits for it, and it is counted until it ends",
        )

    def _stopped(self, work: asyncio.Future[Any]) -> None:
        self._watched.pop(work, None)
        if self._strays.pop(work, None) is not None:
            _log.info("processor.stray_stopped", slug=self._slug)

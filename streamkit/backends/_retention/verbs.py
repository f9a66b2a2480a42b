"""A log's retention in one part, whatever the backend: its reads, its verbs and its runs.

A host store holds one :class:`Retention` over its log and its backend's rows
(:class:`~streamkit.backends._retention.cuts.TruncationRows`): horizons, holds,
forgetting a processor, key windows, retention runs and the archive's proof,
each the backend-independent rule of its own module. The part owns no state
beyond what it was built with; every promise is the rule module's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from streamkit._speed import FAST
from streamkit.backends._retention import key_windows, rules
from streamkit.backends._retention.archive_files import verify_archive
from streamkit.backends._retention.chunk_prep import (
    ChunkPreparer,
    Opener,
    ProcessPreparer,
    ThreadPreparer,
)
from streamkit.backends._retention.cuts import TruncationRows
from streamkit.backends._retention.run import run_retention
from streamkit.events import StreamEvent
from streamkit.horizon import Hold, Horizon
from streamkit.key_window import KeyWindow
from streamkit.log import Log
from streamkit.records import RetentionAsk, RetentionRun, Segment

__all__ = ["LiveHosts", "Retention"]

LiveHosts = Callable[[float, float], Awaitable[Mapping[str, Sequence[str]]]]
"""``live_hosts(now, ttl)``: each host that beat within ``ttl`` and the ``slug@path`` it runs."""


class Retention:
    """What retention reads and changes in one log (see :class:`~streamkit.protocols.RetentionVerbs`)."""

    def __init__(
        self,
        log: Log,
        rows: TruncationRows,
        live_hosts: LiveHosts,
        opener: Opener | None = None,
        cut_log: Callable[[], Log] | None = None,
    ) -> None:
        self._log = log
        self._rows = rows
        self._live_hosts = live_hosts
        # Runs commit their cuts through a log of their own, opened with this (a speed
        # trick: appends to the path then wait only for a cut's last statements and its
        # commit); without it, or under STREAMKIT_PLAIN=1, through ``log``.
        self._cut_log = cut_log if FAST else None
        # Runs prepare their chunks in a worker process that opens the log with this
        # (a speed trick); without it, or under STREAMKIT_PLAIN=1, in a thread.
        self._preparer: ChunkPreparer = (
            ProcessPreparer(opener, rows)
            if opener is not None and FAST
            else ThreadPreparer(log, rows)
        )

    async def horizons(self, now: float, path: str | None = None) -> list[Horizon]:
        return await rules.horizons(self._log, self._rows, now, path)

    async def place_hold(self, hold: Hold) -> StreamEvent:
        return await rules.place_hold(self._log, hold, self._rows)

    async def release_hold(self, path: str, name: str, *, by: str, reason: str) -> StreamEvent:
        return await rules.release_hold(self._log, path, name, by, reason, self._rows)

    @property
    def preparer(self) -> ChunkPreparer:
        """Where this log's runs prepare their chunks (a worker process, or a thread)."""
        return self._preparer

    async def forget_processor(
        self, slug: str, version: str | None, *, by: str, reason: str, now: float, ttl: float
    ) -> StreamEvent:
        return await rules.forget_processor(
            self._log,
            slug,
            version,
            by=by,
            reason=reason,
            running=await self._live_hosts(now, ttl),
            rows=self._rows,
        )

    async def key_window(self, path: str) -> KeyWindow | None:
        return await key_windows.key_window(self._log, self._rows, path)

    async def set_key_window(
        self, path: str, keep_for: float | None, *, by: str, reason: str, now: float
    ) -> StreamEvent:
        return await key_windows.set_key_window(
            self._log, self._rows, path, keep_for, by=by, reason=reason, now=now
        )

    async def run(self, ask: RetentionAsk) -> RetentionRun:
        return await run_retention(
            self._log, self._rows, ask, preparer=self._preparer, open_cutter=self._cut_log
        )

    async def segments(self, path: str | None = None) -> list[Segment]:
        return await self._log.query(lambda conn: self._rows.segments(conn, path))

    async def verify_archive(self, path: str | None = None) -> list[str]:
        return await verify_archive(self._log, self._rows, path)

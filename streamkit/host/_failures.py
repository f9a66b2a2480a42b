"""What one processor's failures in a host amount to: the retries, the stall, the last error.

A :class:`Failures` belongs to one :class:`~streamkit.host._runner.ProcessorRunner`
and owns what ``status`` shows of its trouble: how many items failed in a
row, whether that made it stalled (``retry.stall_after`` in a row, or at
once when its fold stopped before an event: a payload it cannot read or a
reduce that raised; retrying the same code cannot pass those) and at which
offset, the last error (cut to 1,000 characters, with a bounded traceback
excerpt), whether a build of its version cannot be done (``cannot_build``),
and whether it met a
payload newer than its code (``ahead_of_code``: the host then stops offering
to run it, see :mod:`._acquire`). It decides the backoff before the next try
and logs each step (``batch.failed``, ``processor.stalled``,
``processor.schema_ahead``, ``processor.recovered``); the runner says what
happened and where.
"""

from __future__ import annotations

from typing import Any

import structlog

from streamkit.config import RetrySettings
from streamkit.errors import (
    HistoryTruncated,
    PayloadMalformed,
    ReduceFailed,
    SchemaAhead,
    StreamkitError,
)
from streamkit.protocols import Clock
from streamkit.tracebacks import traceback_excerpt

__all__ = ["Failures"]

_log = structlog.get_logger("streamkit.host")

STOPS = (PayloadMalformed, ReduceFailed)
"""Failures of a fold that stopped before an event: the same code fails the same way, so
the processor counts as stalled at the first, not after ``stall_after`` retries. (A payload
newer than the code is not among them: the host hands that processor to newer code.)"""


class Failures:
    """One processor's failures in this host (see the module docstring)."""

    def __init__(self, slug: str, path: str, retry: RetrySettings, clock: Clock) -> None:
        self._slug = slug
        self._path = path
        self._retry = retry
        self._clock = clock
        self.count = 0
        """Items failed in a row (0 once one succeeds)."""
        self.stalled = False
        self.stalled_at: int | None = None
        self.last_error: dict[str, Any] | None = None
        # Set when the processor met a payload newer than this code (SCHEMA_AHEAD): this
        # host stops offering to run it, so placement hands it to a host with newer code,
        # and never takes it back (this code cannot read it). An operator's skip of that
        # event clears it.
        self.ahead_of_code: dict[str, Any] | None = None
        # Set when a version building in the shadow met history that was deleted: it can
        # never be built from there, so it is not retried (this host gives its shadow lease
        # up and takes it no more); {reason, start, deleted, advice}. A restart clears it.
        self.cannot_build: dict[str, Any] | None = None

    def succeeded(self, cursor: int) -> None:
        """An item went through: the run of failures (and the stall) is over."""
        if self.count:
            _log.info(
                "processor.recovered",
                slug=self._slug,
                path=self._path,
                failures=self.count,
                cursor=cursor,
            )
        self.count = 0
        self.stalled = False
        self.stalled_at = None

    def keep(
        self,
        error: str,
        code: str | None,
        offset: int | None,
        cursor: int,
        traceback: str | None = None,
    ) -> None:
        """What ``status`` shows of the last failure (its message cut to 1,000 characters)."""
        self.last_error = {
            "error": error[:1000],
            "code": code,
            "offset": offset,
            "cursor": cursor,
            "failures": self.count,
            "at": self._clock(),
            "traceback": traceback,
        }

    def failed(self, exc: Exception, offset: int | None, cursor: int) -> float:
        """An item failed at ``offset``: keep it, stall after enough; the delay before a retry."""
        self.count += 1
        delay = self._retry.delay(self.count)
        code = exc.code if isinstance(exc, StreamkitError) else None
        # A reduce's own traceback (the fold kept it) says more than the engine's frames.
        kept = exc.details.get("traceback") if isinstance(exc, StreamkitError) else None
        self.keep(
            repr(exc),
            code,
            offset,
            cursor,
            kept if isinstance(kept, str) else traceback_excerpt(exc),
        )
        if isinstance(exc, SchemaAhead) and self.ahead_of_code is None:
            self.ahead_of_code = dict(exc.details)
            _log.warning(
                "processor.schema_ahead",
                slug=self._slug,
                path=self._path,
                offset=exc.details.get("offset"),
                type=exc.details.get("type"),
                stored=exc.details.get("stored"),
                version=exc.details.get("version"),
                detail="this host no longer offers to run it; a host with newer code takes it",
            )
        _log.warning(
            "batch.failed",
            slug=self._slug,
            path=self._path,
            cursor=cursor,
            offset=offset,
            failures=self.count,
            retry_in=round(delay, 3),
            error=repr(exc)[:500],
            # The traceback once per run of failures; a fold's stop was logged with the
            # user code's own traceback where it happened.
            exc_info=exc if self.count == 1 and not isinstance(exc, STOPS) else None,
        )
        if self.count >= self._retry.stall_after or isinstance(exc, STOPS):
            if not self.stalled:
                _log.error(
                    "processor.stalled",
                    slug=self._slug,
                    path=self._path,
                    offset=offset,
                    failures=self.count,
                    error=repr(exc)[:500],
                    detail=f"retrying every {self._retry.max_delay:g} s at most; "
                    f"`streamkit skip {self._slug} --offset {offset}` moves past the event",
                )
            self.stalled = True
            self.stalled_at = offset
        return delay

    def cannot_build_past(self, exc: HistoryTruncated, version: str) -> None:
        """A shadow build of ``version`` met deleted history: stop it for good (see above)."""
        if self.cannot_build is not None:
            return
        deleted = exc.details.get("deleted") or []
        below = max((int(last) for _, last in deleted), default=0) + 1
        reason = f"history before {below} was deleted"
        advice = (
            f"version {version} cannot be built from offset 1, so it is not retried; run the "
            f"serving version's code here again (a rollback of the deploy), or give this "
            f"version up (`streamkit processor forget {self._slug} --version {version} "
            "--db DB --reason ...` removes its rows), or deploy it under a new slug declared "
            'to start at the path\'s start (start = "start": it reduces from there, without '
            "the deleted history)"
        )
        self.cannot_build = {
            "reason": reason,
            "start": exc.details.get("start"),
            "deleted": deleted,
            "advice": advice,
        }
        _log.error(
            "processor.cannot_build",
            slug=self._slug,
            path=self._path,
            version=version,
            reason=reason,
            detail=advice,
        )

    def skipped(self, offset: int) -> None:
        """An operator skipped ``offset``: a payload newer than the code there no longer holds
        the processor back."""
        if self.ahead_of_code is not None and self.ahead_of_code.get("offset") == offset:
            self.ahead_of_code = None

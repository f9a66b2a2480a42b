"""A retention run, whatever the backend: a path's history below its horizon, cut in chunks.

:func:`run_retention` takes a path's oldest events, archived (``archive``, a
directory) or deleted, up to ``through`` but never at or past the path's
horizon (:mod:`streamkit.horizon`), in chunks of at most ``chunk`` events so
appends keep flowing between them. Each chunk:

1. reads the stored rows after the path's start;
2. archive mode: writes them to a segment file, synced, read back and
   hashed (:func:`~streamkit.backends._retention.segments.write_segment`), chained to
   the path's last segment; and hashes each keyed event's body;
3. then ONE transaction, the :data:`~streamkit.history.TRUNCATED_EVENT`
   control event's. Before the event takes the path's head
   (:meth:`TruncationRows.take`) it checks the start did not move, records
   the segment, records each idempotency key's body hash (so a retry still
   answers, :mod:`streamkit.backends._keys`) and deletes the rows; after
   (:meth:`TruncationRows.move_start`, in the seal) it reads the horizon
   again and refuses if the chunk reaches it (a hold placed meanwhile, a
   processor registered), takes deleted events out of the summary of
   stored types (archived ones are still read by rebuilds, so schema checks
   still count them) and moves the start. On PostgreSQL the cuts commit
   through a log of their own (``open_cutter``), so appends to the path wait
   only for the part after the head and the commit, and appends to other
   paths not at all.

A policy narrows what a run takes: ``keep_for`` seconds keeps every event
younger than that (the run stops at the first such event, so a path's
history stays one contiguous range) and ``keep_last`` keeps that many of the
newest offsets. A last chunk of nothing but earlier runs' own
:data:`~streamkit.history.TRUNCATED_EVENT` records (or of no event at all)
is left where it is: cutting it would write one more such record, which the
next run would take, forever. A run under a host's retention lease passes its ``fence``,
which every cut's transaction runs first: a host that lost the lease writes
nothing.

Last, the keys the path's key window lets go are forgotten
(:mod:`.key_windows`), each batch under the same fence.

A chunk is prepared off the event loop (:mod:`streamkit.backends._retention.chunk_prep`:
in a worker process when the backend gives an ``opener``, else a thread).
While other writes go through the log's writer, a run below ``share`` 1.0
paces itself: after each cut it waits so that its own time (the cut's, and
the preparing when that ran in this process) stays ``share`` of the whole;
an idle log is cut at full speed. The pauses are counted in the run's
``paused_seconds``.

A crash anywhere leaves at worst a segment file that no row records
(:mod:`.archive_files` removes it later). Rows are never deleted without
their segment recorded in the same transaction (archive mode); what one
cut's transaction writes and checks is :mod:`.cuts`.

The run goes in phases, each a method of one :class:`_Run` that owns the
run's state: :meth:`_Run.plan` (the limit, the start, the chain's last link),
:meth:`_Run.cut_all` (prepare, cut and pace each chunk) and
:meth:`_Run.finish` (the last sweep, the keys, the space given back).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from streamkit._timestamps import format_timestamp
from streamkit.backends._retention.archive_files import discard, sweep
from streamkit.backends._retention.chunk_prep import (
    PREPARE_ERRORS,
    ChunkAsk,
    ChunkPreparer,
    Prepared,
    ThreadPreparer,
)
from streamkit.backends._retention.cuts import Cut, TruncationRows, sealed, taken, truncated_event
from streamkit.backends._retention.key_windows import forget_expired_keys
from streamkit.backends._retention.rules import horizon_in
from streamkit.errors import InvalidRequest, LeaseLost, StorageError
from streamkit.events import validate_path
from streamkit.log import Log
from streamkit.records import RetentionAsk, RetentionRun

__all__ = ["run_retention"]


async def run_retention(
    log: Log,
    rows: TruncationRows,
    ask: RetentionAsk,
    *,
    clock: Callable[[], float] = time.time,
    preparer: ChunkPreparer | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    open_cutter: Callable[[], Log] | None = None,
) -> RetentionRun:
    """Take ``ask.path``'s history through ``ask.through`` (default: all below its horizon).

    Archived into segment files in ``ask.archive`` (an absolute directory),
    or deleted when it is None. Never at or past the horizon: a ``through``
    beyond it stops at it. Nor an event younger than ``keep_for`` seconds,
    nor one of the newest ``keep_last`` offsets. ``fence`` runs first in
    every cut's transaction. ``preparer`` prepares the chunks (default: the
    log's readers and a thread); ``share`` (0 < share <= 1) is the most of
    the writer's time the run takes while other writes go on; ``sleep``
    waits its pauses. ``open_cutter`` opens the log that commits the cuts (at
    the first cut; closed at the end): a second log over the same storage,
    with a writer (and connection) of its own, so appends through ``log`` do
    not queue behind a cut's transaction (default: ``log`` itself commits
    them).
    """
    started = time.monotonic()
    one = _Run(log, rows, ask, clock, ThreadPreparer(log, rows) if preparer is None else preparer)
    run = await one.plan()
    await one.cut_all(sleep, open_cutter)
    await one.finish()
    run.seconds = time.monotonic() - started
    return run


class _Run:
    """One run's state from its plan to its end: where it stands and what it did."""

    __slots__ = (
        "_ask",
        "_clock",
        "_folder",
        "_limit",
        "_log",
        "_path",
        "_prev",
        "_ready",
        "_rows",
        "_start",
        "_young",
        "run",
    )

    def __init__(
        self,
        log: Log,
        rows: TruncationRows,
        ask: RetentionAsk,
        clock: Callable[[], float],
        ready: ChunkPreparer,
    ) -> None:
        self._path, self._folder = _checked(ask)
        self._log, self._rows, self._ask, self._clock, self._ready = log, rows, ask, clock, ready
        self._limit = self._start = 0
        self._young: str | None = None
        self._prev: str | None = None
        self.run: RetentionRun

    async def plan(self) -> RetentionRun:
        """What the run may take: its limit and why, its start, the archive chain's last link."""
        log, rows, path, ask = self._log, self._rows, self._path, self._ask
        now = self._clock()
        horizon = horizon_in(await log.query(rows.facts), path, now)
        limit, stopped_by = horizon.offset - 1, "horizon"
        if ask.through is not None and ask.through < limit:
            limit, stopped_by = ask.through, "through"
        if ask.keep_last is not None and horizon.head - ask.keep_last < limit:
            limit, stopped_by = horizon.head - ask.keep_last, "keep_last"
        self._limit = limit
        # Timestamps are fixed-width UTC text: compared as text, they compare as instants.
        if ask.keep_for is not None:
            self._young = format_timestamp(max(0.0, now - ask.keep_for))
        self._start = start = await log.query(lambda conn: rows.truncated_through(conn, path))
        self.run = run = RetentionRun(
            path=path,
            mode="delete" if self._folder is None else "archive",
            horizon=horizon.offset,
            start_before=start + 1,
            start_after=start + 1,
            stopped_by=stopped_by,
        )
        if self._folder is not None:
            run.orphans_removed, recorded = await sweep(log, rows, self._folder, path)
            # The chain's last link; each chunk this run records becomes the next one.
            self._prev = recorded[-1].sha256 if recorded else None
        return run

    async def cut_all(
        self, sleep: Callable[[float], Awaitable[None]], open_cutter: Callable[[], Log] | None
    ) -> None:
        """Prepare and cut chunk after chunk up to the limit, pacing to the ask's share."""
        log, run, share = self._log, self.run, self._ask.share
        seen = log.stats.transactions
        cutter: Log | None = None
        try:
            while self._start < self._limit:
                began = time.monotonic()
                prepared = await self._prepare()
                if prepared.young_at is not None:
                    self._limit, run.stopped_by = prepared.young_at - 1, "keep_for"
                if prepared.stop is not None:
                    run.stopped_by = prepared.stop
                    break
                if cutter is None:
                    cutter = log if open_cutter is None else await asyncio.to_thread(open_cutter)
                cutting = time.monotonic()
                before = log.stats.transactions
                await self._cut(cutter, prepared)
                ended = time.monotonic()
                # Pacing: while other writes share the log's writer, the run keeps its own
                # time (the cut's, and the preparing when it ran in this process) to
                # ``share`` of it.
                others, seen = before - seen, log.stats.transactions
                if share < 1.0 and others > 0 and self._start < self._limit:
                    busy = ended - (began if self._ready.in_process else cutting)
                    pause = busy * (1.0 / share - 1.0)
                    run.paused_seconds += pause
                    await sleep(pause)
        finally:
            if cutter is not None and cutter is not log:
                # After a cancelled wait too: its cut commits (or not) before the log closes.
                await cutter.aclose()

    async def _prepare(self) -> Prepared:
        """The next chunk read (and archived), off the event loop."""
        path, folder, after = self._path, self._folder, self._start
        ask = ChunkAsk(
            path=path,
            after=after,
            limit=self._limit,
            chunk=self._ask.chunk,
            young=self._young,
            folder=None if folder is None else str(folder),
            prev=self._prev,
            created_at=format_timestamp(self._clock()),
        )
        try:
            return await self._ready.prepare(ask)
        except PREPARE_ERRORS as exc:
            what = "read" if folder is None else f"written in {str(folder)!r}"
            raise StorageError(
                f"the chunk of {path!r} after offset {after} could not be {what} ({exc}); no "
                "event was taken and nothing was written",
                details={"path": path, "archive": str(folder), "error": repr(exc)},
            ) from exc

    async def _cut(self, cutter: Log, prepared: Prepared) -> None:
        """One chunk's transaction, then the run's counts and start moved past it."""
        run, rows, segment = self.run, self._rows, prepared.segment
        cut = Cut(
            path=self._path,
            after=self._start,
            through=prepared.through,
            segment=segment,
            keys=list(prepared.keys),
            types=dict(prepared.types),
        )
        try:
            await cutter.append_control(
                self._path,
                truncated_event(cut, run.mode, prepared.count),
                sealed(rows, cut, self._clock),
                first=taken(rows, cut, self._ask.fence),
            )
        except (InvalidRequest, LeaseLost):
            # Refused inside the transaction, so rolled back: the segment is recorded
            # nowhere and goes now. On any other way out (a cancelled wait, a broken
            # connection) the commit may still land: the file stays, and if no row
            # records it the next run removes it.
            if segment is not None:
                await asyncio.to_thread(discard, segment.file)
            raise
        run.events += prepared.count
        run.chunks += 1
        if segment is not None:
            self._prev = segment.sha256
            run.segments.append(segment)
            run.bytes += segment.bytes
        self._start = prepared.through
        run.start_after = self._start + 1

    async def finish(self) -> None:
        """The last sweep, the keys the path's key window lets go, the space given back."""
        log, rows, run, path = self._log, self._rows, self.run, self._path
        if self._folder is not None and run.chunks:
            # A crashed run's file whose range this run has now taken.
            run.orphans_removed += (await sweep(log, rows, self._folder, path))[0]
        # Keys of events taken by this run or an earlier one, older than the path's key window.
        run.keys_forgotten = await forget_expired_keys(
            log, rows, path, self._clock(), fence=self._ask.fence
        )
        if run.chunks or run.keys_forgotten:
            # Each step is a transaction of the log's own writer, in order with appends.
            while (given := await log.write_transaction(rows.reclaim_step)) > 0:
                run.pages_reclaimed += given


def _checked(ask: RetentionAsk) -> tuple[str, Path | None]:
    """The ask's path, validated, and its archive folder; InvalidRequest for a bad field."""
    path = validate_path(ask.path)
    _check_count("chunk", ask.chunk, 1)
    share = ask.share
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise InvalidRequest(
            f"a retention share must be a number in (0, 1], got {share!r}; nothing was written",
            details={"share": repr(share)},
        )
    if ask.keep_last is not None:
        _check_count("keep_last", ask.keep_last, 0)
    keep_for = ask.keep_for
    if keep_for is not None and (
        isinstance(keep_for, bool)
        or not isinstance(keep_for, int | float)
        or not math.isfinite(keep_for)
        or keep_for < 0
    ):
        raise InvalidRequest(
            f"retention keep_for must be a number of seconds >= 0, got {keep_for!r}; nothing "
            "was written",
            details={"keep_for": repr(keep_for)},
        )
    folder = None if ask.archive is None else Path(ask.archive)
    if folder is not None and not folder.is_absolute():
        # Segments are recorded by where they are: a relative name would move with the cwd.
        raise InvalidRequest(
            f"the archive directory must be an absolute path, got {str(ask.archive)!r}; "
            "nothing was written",
            details={"archive": str(ask.archive)},
        )
    return path, folder


def _check_count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidRequest(
            f"a retention {name} must be an integer >= {least}, got {value!r}; nothing was written",
            details={name: repr(value)},
        )

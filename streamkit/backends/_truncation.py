"""A retention run, whatever the backend: a path's history below its horizon, cut in chunks.

:func:`run_retention` takes a path's oldest events, archived (``archive``, a
directory) or deleted, up to ``through`` but never at or past the path's
horizon (:mod:`streamkit.horizon`), in chunks of at most ``chunk`` events so
appends keep flowing between them. Each chunk:

1. reads the stored rows after the path's start;
2. archive mode: writes them to a segment file, synced, read back and
   hashed (:func:`~streamkit.backends._segments.write_segment`), chained to
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
(:mod:`streamkit.backends._key_windows`), each batch under the same fence.

A chunk is prepared off the event loop (:mod:`streamkit.backends._chunk_prep`:
in a worker process when the backend gives an ``opener``, else a thread).
While other writes go through the log's writer, a run below ``share`` 1.0
paces itself: after each cut it waits so that its own time (the cut's, and
the preparing when that ran in this process) stays ``share`` of the whole;
an idle log is cut at full speed. The pauses are counted in the run's
``paused_seconds``.

A crash anywhere leaves at worst a segment file that no row records; a
run removes such a file once the path's start has passed its range (before
it writes, and after its chunks: the next run normally cuts that range
again). A file above the start is left alone, since it may be another
run's, about to be recorded: two runs of one path at once (a host's and
``streamkit retention run``) never remove, nor overwrite, each other's
files (each write names its file with a tag of its own); one of their cuts
of a range is refused. Rows are never deleted without their segment
recorded in the same transaction (archive mode). A backend supplies the
table operations (:class:`TruncationRows`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from streamkit._requests import Connection
from streamkit._timestamps import format_timestamp
from streamkit.backends._chunk_prep import (
    PREPARE_ERRORS,
    ChunkAsk,
    ChunkPreparer,
    ThreadPreparer,
)
from streamkit.backends._key_windows import KeyWindowRows, forget_expired_keys
from streamkit.backends._retention_rules import RetentionRows, horizon_in
from streamkit.backends._segments import check_chain, check_segment, segment_range
from streamkit.backends._stored import Row
from streamkit.errors import InvalidRequest, LeaseLost, StorageError
from streamkit.events import StreamEvent, validate_path
from streamkit.history import RETENTION_CHUNK, TRUNCATED_EVENT
from streamkit.log import Log
from streamkit.records import RetentionRun, Segment

__all__ = [
    "DEFAULT_CHUNK",
    "Cut",
    "TruncationRows",
    "check_start_unmoved",
    "run_retention",
    "segment_values",
    "verify_archive",
]

DEFAULT_CHUNK = RETENTION_CHUNK


@dataclass(frozen=True, slots=True)
class Cut:
    """One chunk's change, as its transaction writes it."""

    path: str
    after: int
    """The path's start before the cut, minus one (what it must still be)."""
    through: int
    segment: Segment | None
    keys: list[tuple[str, int, str, str]]
    """``(key, offset, body_sha256, created_at)`` of each keyed event taken."""
    types: dict[tuple[str, int], int]
    """Events deleted per stored ``(type, payload version)`` (none when archived)."""


def check_start_unmoved(cut: Cut, through: int) -> None:
    """Inside a cut's transaction: InvalidRequest unless the path was cut through ``cut.after``."""
    if through != cut.after:
        raise InvalidRequest(
            f"{cut.path!r} was cut through {through} by another run meanwhile (this one began "
            f"at {cut.after}); nothing was written",
            details={"path": cut.path, "through": through},
        )


def segment_values(segment: Segment) -> tuple[str, int, int, int, int, str, str, str | None]:
    """A segment's row, in the order of its columns (path .. prev_sha256)."""
    return (
        segment.path,
        segment.first,
        segment.last,
        segment.count,
        segment.bytes,
        segment.file,
        segment.sha256,
        segment.prev_sha256,
    )


class TruncationRows(RetentionRows, KeyWindowRows, Protocol):
    """A backend's start, segments and rows, key windows, and the one write of a cut."""

    def truncated_through(self, conn: Connection, path: str) -> int:
        """The offset ``path``'s history was taken through (0: none was)."""
        ...

    def segments(self, conn: Connection, path: str | None) -> list[Segment]:
        """The recorded segments (of ``path`` only, if given), by path and range."""
        ...

    def stored_rows(
        self, conn: Connection, path: str, after: int, through: int, limit: int
    ) -> list[Row]:
        """The stored rows of ``path`` in ``(after, through]``, ascending, at most ``limit``."""
        ...

    def reclaim_step(self, conn: Connection) -> int:
        """After the cuts, inside one write transaction of the log's writer: give back at
        most a short step of freed space; the pages given (0: nothing more now).

        A run repeats it, so appends go on between the steps.
        """
        ...

    def take(self, conn: Connection, cut: Cut) -> int:
        """In the control event's transaction, before its row: the first half of ``cut``.

        Checks the path's start is still ``cut.after`` + 1 (InvalidRequest,
        nothing written, if another run cut meanwhile; two runs of one path
        must not both get past this check), records the segment and the
        keys' body hashes and deletes the rows: the rows that cost time and
        that no append touches, so it runs before the path's head is taken.
        The rows it deleted.
        """
        ...

    def move_start(self, conn: Connection, cut: Cut) -> None:
        """In the same transaction, after the control event's row: the rest of ``cut``.

        Takes the deleted events out of the summary of stored types (which
        appends to the path also move) and moves the path's start.
        """
        ...


def _remove_orphans(folder: Path, path: str, through: int, recorded: set[str]) -> list[str]:
    """Segment files of ``path`` in ``folder`` that no row records and never will, removed.

    Never will: their range ends at or below ``through``, the path's start
    (read before ``recorded``), so a cut of it would be refused. A file
    above it may be another run's, written and about to be recorded: it
    stays until a run takes its range.
    """
    if not folder.is_dir():
        return []
    removed = []
    for file in sorted(folder.iterdir()):
        covered = segment_range(path, file.name)
        if covered is None or covered[1] > through or str(file) in recorded:
            continue
        with contextlib.suppress(FileNotFoundError):
            file.unlink()
        removed.append(str(file))
    return removed


async def _sweep(
    log: Log, rows: TruncationRows, folder: Path, path: str
) -> tuple[list[str], list[Segment]]:
    """The files :func:`_remove_orphans` removed, and the path's recorded segments."""
    # The start first: a segment recorded before it moved there is in the second read.
    through = await log.query(lambda conn: rows.truncated_through(conn, path))
    recorded = await log.query(lambda conn: rows.segments(conn, path))
    files = {s.file for s in recorded}
    return await asyncio.to_thread(_remove_orphans, folder, path, through, files), recorded


async def run_retention(
    log: Log,
    rows: TruncationRows,
    path: str,
    *,
    through: int | None = None,
    archive: str | Path | None = None,
    chunk: int = DEFAULT_CHUNK,
    keep_for: float | None = None,
    keep_last: int | None = None,
    fence: Callable[[Connection], None] | None = None,
    clock: Callable[[], float] = time.time,
    preparer: ChunkPreparer | None = None,
    share: float = 1.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    open_cutter: Callable[[], Log] | None = None,
) -> RetentionRun:
    """Take ``path``'s history through ``through`` (default: all below its horizon).

    Archived into segment files in ``archive`` (an absolute directory), or
    deleted when it is None.
    Never at or past the horizon: a ``through`` beyond it stops at it. Nor
    an event younger than ``keep_for`` seconds, nor one of the newest
    ``keep_last`` offsets. ``fence`` runs first in every cut's transaction.
    ``preparer`` prepares the chunks (default: the log's readers and a
    thread); ``share`` (0 < share <= 1) is the most of the writer's time the
    run takes while other writes go on; ``sleep`` waits its pauses.
    ``open_cutter`` opens the log that commits the cuts (at the first cut;
    closed at the end): a second log over the same storage, with a writer
    (and connection) of its own, so appends through ``log`` do not queue
    behind a cut's transaction (default: ``log`` itself commits them).
    """
    path = validate_path(path)
    _check_count("chunk", chunk, 1)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise InvalidRequest(
            f"a retention share must be a number in (0, 1], got {share!r}; nothing was written",
            details={"share": repr(share)},
        )
    if keep_last is not None:
        _check_count("keep_last", keep_last, 0)
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
    folder = None if archive is None else Path(archive)
    if folder is not None and not folder.is_absolute():
        # Segments are recorded by where they are: a relative name would move with the cwd.
        raise InvalidRequest(
            f"the archive directory must be an absolute path, got {str(archive)!r}; nothing "
            "was written",
            details={"archive": str(archive)},
        )
    started = time.monotonic()
    now = clock()
    horizon = horizon_in(await log.query(rows.facts), path, now)
    limit, stopped_by = horizon.offset - 1, "horizon"
    if through is not None and through < limit:
        limit, stopped_by = through, "through"
    if keep_last is not None and horizon.head - keep_last < limit:
        limit, stopped_by = horizon.head - keep_last, "keep_last"
    # Timestamps are fixed-width UTC text: compared as text, they compare as instants.
    young = None if keep_for is None else format_timestamp(max(0.0, now - keep_for))
    start = await log.query(lambda conn: rows.truncated_through(conn, path))
    run = RetentionRun(
        path=path,
        mode="delete" if folder is None else "archive",
        horizon=horizon.offset,
        start_before=start + 1,
        start_after=start + 1,
        stopped_by=stopped_by,
    )
    prev: str | None = None
    if folder is not None:
        run.orphans_removed, recorded = await _sweep(log, rows, folder, path)
        # The chain's last link; each chunk this run records becomes the next one.
        prev = recorded[-1].sha256 if recorded else None
    ready = ThreadPreparer(log, rows) if preparer is None else preparer
    seen = log.stats.transactions
    cutter: Log | None = None
    try:
        while start < limit:
            after = start
            began = time.monotonic()
            ask = ChunkAsk(
                path=path,
                after=after,
                limit=limit,
                chunk=chunk,
                young=young,
                folder=None if folder is None else str(folder),
                prev=prev,
                created_at=format_timestamp(clock()),
            )
            try:
                prepared = await ready.prepare(ask)
            except PREPARE_ERRORS as exc:
                what = "read" if folder is None else f"written in {str(folder)!r}"
                raise StorageError(
                    f"the chunk of {path!r} after offset {after} could not be {what} ({exc}); no "
                    "event was taken and nothing was written",
                    details={"path": path, "archive": str(folder), "error": repr(exc)},
                ) from exc
            if prepared.young_at is not None:
                limit, run.stopped_by = prepared.young_at - 1, "keep_for"
            if prepared.stop is not None:
                run.stopped_by = prepared.stop
                break
            segment = prepared.segment
            cut = Cut(
                path=path,
                after=after,
                through=prepared.through,
                segment=segment,
                keys=list(prepared.keys),
                types=dict(prepared.types),
            )
            if cutter is None:
                cutter = log if open_cutter is None else await asyncio.to_thread(open_cutter)
            cutting = time.monotonic()
            before = log.stats.transactions
            try:
                await cutter.append_control(
                    path,
                    _truncated_event(cut, run.mode, prepared.count),
                    _sealed(rows, cut, clock),
                    first=_taken(rows, cut, fence),
                )
            except (InvalidRequest, LeaseLost):
                # Refused inside the transaction, so rolled back: the segment is recorded
                # nowhere and goes now. On any other way out (a cancelled wait, a broken
                # connection) the commit may still land: the file stays, and if no row
                # records it the next run removes it.
                if segment is not None:
                    await asyncio.to_thread(_discard, segment.file)
                raise
            ended = time.monotonic()
            run.events += prepared.count
            run.chunks += 1
            if segment is not None:
                prev = segment.sha256
                run.segments.append(segment)
                run.bytes += segment.bytes
            start = prepared.through
            run.start_after = start + 1
            # Pacing: while other writes share the log's writer, the run keeps its own time
            # (the cut's, and the preparing when it ran in this process) to ``share`` of it.
            others, seen = before - seen, log.stats.transactions
            if share < 1.0 and others > 0 and start < limit:
                busy = ended - (began if ready.in_process else cutting)
                pause = busy * (1.0 / share - 1.0)
                run.paused_seconds += pause
                await sleep(pause)
    finally:
        if cutter is not None and cutter is not log:
            # After a cancelled wait too: its cut commits (or not) before the log closes.
            await cutter.aclose()
    if folder is not None and run.chunks:
        # A crashed run's file whose range this run has now taken.
        run.orphans_removed += (await _sweep(log, rows, folder, path))[0]
    # Keys of events taken by this run or an earlier one, older than the path's key window.
    run.keys_forgotten = await forget_expired_keys(log, rows, path, clock(), fence=fence)
    if run.chunks or run.keys_forgotten:
        # Each step is a transaction of the log's own writer, in order with appends.
        while (given := await log.write_transaction(rows.reclaim_step)) > 0:
            run.pages_reclaimed += given
    run.seconds = time.monotonic() - started
    return run


def _check_count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidRequest(
            f"a retention {name} must be an integer >= {least}, got {value!r}; nothing was written",
            details={name: repr(value)},
        )


def _discard(file: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(file)


def _truncated_event(cut: Cut, mode: str, count: int) -> dict[str, Any]:
    segment = cut.segment
    payload: dict[str, Any] = {
        "through": cut.through,
        "mode": mode,
        "count": count,
        "segment": None
        if segment is None
        else {
            "file": segment.file,
            "first": segment.first,
            "last": segment.last,
            "sha256": segment.sha256,
            "prev_sha256": segment.prev_sha256,
            "bytes": segment.bytes,
        },
    }
    return {"type": TRUNCATED_EVENT, "payload": payload}


def _taken(
    rows: TruncationRows, cut: Cut, fence: Callable[[Connection], None] | None
) -> Callable[[Connection], None]:
    def take(conn: Connection) -> None:
        if fence is not None:
            fence(conn)  # a host's run: its lease, first, or nothing is written
        rows.take(conn, cut)

    return take


def _sealed(
    rows: TruncationRows, cut: Cut, clock: Callable[[], float]
) -> Callable[[Connection, list[StreamEvent]], None]:
    def seal(conn: Connection, events: list[StreamEvent]) -> None:
        # The horizon again, inside the cut's transaction and after the control event
        # took the path's head: a hold (placed by a control event on the path, so it
        # committed before or waits) or a processor that appeared since the run began
        # holds here too, and the rows taken first go back with the refusal.
        horizon = horizon_in(rows.facts(conn), cut.path, clock())
        if cut.through >= horizon.offset:
            held = ", ".join(f"{n.kind} {n.name}" for n in horizon.held_by) or "nothing"
            raise InvalidRequest(
                f"retention of {cut.path!r} through {cut.through} refused: the horizon is "
                f"{horizon.offset} now (held by {held}); nothing was written",
                details={"path": cut.path, "through": cut.through, "horizon": horizon.offset},
            )
        rows.move_start(conn, cut)

    return seal


async def verify_archive(log: Log, rows: TruncationRows, path: str | None = None) -> list[str]:
    """Every problem of the recorded archive (of ``path`` only), in words; empty: all proven.

    Each path's segments as a chain (:func:`~streamkit.backends._segments.check_chain`)
    and each file against its record, every byte hashed (off the event loop).
    """
    recorded = await log.query(lambda conn: rows.segments(conn, path))
    by_path: dict[str, list[Segment]] = {}
    for segment in recorded:
        by_path.setdefault(segment.path, []).append(segment)
    problems: list[str] = []
    for segments in by_path.values():
        problems += check_chain(segments)
        for segment in segments:
            found = await asyncio.to_thread(check_segment, segment)
            if found is not None:
                problems.append(found)
    return problems

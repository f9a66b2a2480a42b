"""One replay pass of the DLQ: walk the log backwards, replay live records page by page.

A pass serves one ``dlq.replay-requested``. It scans from the head it found at
its start down to the DLQ's floor, newest first (see ``_dlq_scan``): a body
(``dlq.dead-lettered``) is live when no later event named its offset. Each
page's live, selected records are settled with as few appends as possible:
one append of the page's ``dlq.record-replaying`` markers (and abandonments),
the replays themselves (the default replay re-appends the page's requests in
one append), then one append of the page's outcomes together with the pass's
progress. Every event carries a key derived from the record id and the replay
number, so a resumed pass re-appends nothing; a batch refused because one of
its events was already recorded differently is retried event by event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streamkit.processors.dlq._events import (
    DEAD_LETTERED,
    RECORD_ABANDONED,
    RECORD_REPLAYING,
    REPLAY_COMPLETED,
    REPLAY_PROGRESS,
    ActiveReplay,
    Kind,
    RecordAbandoned,
    RecordReplaying,
    ReplayCompleted,
    ReplayContext,
    ReplayHandler,
    ReplayProgress,
    ReplayRef,
    dead_lettered_event,
    record_succeeded_event,
)
from streamkit.processors.dlq._scan import (
    DlqRecord,
    LogReader,
    ReplayFilter,
    find_head,
    pages_backwards,
    record_from_event,
    supersedes,
)

from streamkit import IdempotencyConflict, ProcessEventArgs, StreamEvent

__all__ = ["ReplayPass", "ReplayStream", "abandoned_event", "append_all", "completed_event"]

# Progress is recorded after a page that did something, and at least this often.
PROGRESS_EVERY_PAGES = 20


class ReplayStream(LogReader, Protocol):
    """What the DLQ reads records from and re-appends requests to (a log or memory stream)."""

    async def append(self, *events: Mapping[str, Any]) -> list[StreamEvent]: ...


async def append_all(
    args: ProcessEventArgs[Any], events: Sequence[Mapping[str, Any]]
) -> list[StreamEvent | None]:
    """Append ``events`` in one commit; if one was already recorded differently, one by one.

    Returns the committed event for each input (None for one the log refused
    because its key already names another body: another run recorded that
    step first, and the log keeps the first).
    """
    if not events:
        return []
    try:
        return list(await args.append(*events))
    except IdempotencyConflict:
        pass
    committed: list[StreamEvent | None] = []
    for event in events:
        try:
            (one,) = await args.append(event)
        except IdempotencyConflict:
            one = None
        committed.append(one)
    return committed


def abandoned_event(
    key: Callable[..., str], record: DlqRecord, max_attempts: int
) -> dict[str, Any]:
    """``dlq.record-abandoned`` for ``record`` (the same body and key whoever appends it)."""
    body = RecordAbandoned(
        record_id=record.record_id,
        replay=record.replays,
        record_offset=record.offset,
        reason=f"{record.replays} replay(s) reached max_attempts={max_attempts}; "
        f"last error: {record.error}"[:2000],
    )
    return {
        "type": RECORD_ABANDONED,
        "payload": body.model_dump(mode="json"),
        "idempotency_key": key("abandoned", record.record_id, record.replays),
    }


def completed_event(key: Callable[..., str], body: ReplayCompleted) -> dict[str, Any]:
    """``dlq.replay-completed`` for one request (one per request, whoever appends it)."""
    return {
        "type": REPLAY_COMPLETED,
        "payload": body.model_dump(mode="json"),
        "idempotency_key": key("completed", body.request_offset),
    }


@dataclass
class _Dispatch:
    record: DlqRecord
    ctx: ReplayContext
    handler: ReplayHandler | None  # None: the default replay (re-append the request)


class ReplayPass:
    """Runs (or resumes) the replay of ``active`` over ``reader`` down to ``floor``."""

    def __init__(
        self,
        *,
        args: ProcessEventArgs[Any],
        reader: ReplayStream,
        active: ActiveReplay,
        floor: int,
        handlers: Mapping[str, ReplayHandler],
        max_attempts: int,
        key: Callable[..., str],
    ) -> None:
        self._args = args
        self._reader = reader
        self._active = active
        self._floor = floor
        self._handlers = handlers
        self._max = max_attempts
        self._key = key
        self._report = active.report.model_copy(deep=True)
        self._selection = ReplayFilter(
            record_ids=active.record_ids, origin=active.origin, operation=active.operation
        )
        # A page's outcomes, written with the progress that follows the page.
        self._pending: list[Mapping[str, Any]] = []

    async def run(self) -> None:
        """Replay every live, selected record, then append ``dlq.replay-completed``."""
        active = self._active
        request = active.request_offset
        superseded: set[int] = set()
        if active.start_offset is None or active.scanned_down_to is None:
            start = await find_head(self._reader)
            scanned = start
            await append_all(self._args, [self._progress(start, scanned)])
        else:
            start, scanned = active.start_offset, active.scanned_down_to
            # Resuming: the offsets the part already done settled must be known again.
            async for _, events in pages_backwards(self._reader, start, scanned):
                superseded.update(o for o in map(supersedes, events) if o is not None)
        wanted = None if active.record_ids is None else set(active.record_ids)
        found: set[str] = set()
        lowest_skipped: int | None = None
        pages = 0
        async for after, events in pages_backwards(self._reader, scanned, self._floor):
            live: list[DlqRecord] = []
            for event in events:
                settled = supersedes(event)
                if settled is not None:
                    superseded.add(settled)
                    continue
                if event.type != DEAD_LETTERED or event.offset > request:
                    continue
                if event.offset in superseded:
                    superseded.discard(event.offset)
                    continue
                record = record_from_event(event)
                if record is None or not self._selection.matches(
                    record.record_id, record.origin, record.operation
                ):
                    continue
                if wanted is not None:
                    if record.record_id in found:
                        continue
                    found.add(record.record_id)
                live.append(record)
            pages += 1
            if live:
                skipped = await self._replay_page(live)
                if skipped:
                    lowest_skipped = min(skipped)
            if live or pages % PROGRESS_EVERY_PAGES == 0:
                await append_all(self._args, [*self._pending, self._progress(start, after)])
                self._pending = []
        for rid in active.record_ids or ():
            if rid not in found:
                found.add(rid)
                self._report.add("skipped", rid)
        filtered = (
            active.record_ids is not None
            or active.origin is not None
            or active.operation is not None
        )
        new_floor = None
        if not filtered:
            new_floor = request if lowest_skipped is None else min(request, lowest_skipped - 1)
        body = ReplayCompleted(
            request_offset=request,
            requested_by=active.requested_by,
            report=self._report,
            new_floor=new_floor,
        )
        await append_all(self._args, [completed_event(self._key, body)])

    def _progress(self, start: int, scanned: int) -> dict[str, Any]:
        request = self._active.request_offset
        body = ReplayProgress(
            request_offset=request,
            start_offset=start,
            scanned_down_to=scanned,
            report=self._report,
        )
        return {
            "type": REPLAY_PROGRESS,
            "payload": body.model_dump(mode="json"),
            "idempotency_key": self._key("progress", request, start, scanned),
        }

    async def _replay_page(self, live: list[DlqRecord]) -> list[int]:
        """Settle one page's live records; return the body offsets skipped (left pending)."""
        first: list[Mapping[str, Any]] = []
        dispatch: list[_Dispatch] = []
        skipped: list[int] = []
        kinds: dict[str, Kind] = {}
        for record in live:
            rid = record.record_id
            if record.replays >= self._max:
                first.append(abandoned_event(self._key, record, self._max))
                kinds[rid] = "abandoned"
                continue
            handler = self._handlers.get(record.operation)
            if handler is None and record.request_type is None:
                kinds[rid] = "skipped"
                skipped.append(record.offset)
                continue
            replay = record.replays + 1
            marker = RecordReplaying(
                record_id=rid,
                replay=replay,
                record_offset=record.offset,
                request_offset=self._active.request_offset,
            )
            first.append(
                {
                    "type": RECORD_REPLAYING,
                    "payload": marker.model_dump(mode="json"),
                    "idempotency_key": self._key("replaying", rid, replay),
                }
            )
            ctx = ReplayContext(
                replay=replay,
                idempotency_key=self._key("replay", rid, replay),
                request_offset=self._active.request_offset,
                requested_by=self._active.requested_by,
            )
            dispatch.append(_Dispatch(record, ctx, handler))
        await append_all(self._args, first)
        outcomes: list[Mapping[str, Any]] = []
        failed: list[tuple[DlqRecord, int]] = []
        defaults = [d for d in dispatch if d.handler is None]
        errors = await self._reappend(defaults)
        for item in dispatch:
            rid = item.record.record_id
            if item.handler is None:
                error = errors.get(rid)
            else:
                try:
                    await item.handler(item.record, item.ctx)
                    error = None
                except Exception as exc:
                    error = exc
            if error is None:
                kinds[rid] = "replayed"
                if item.handler is not None:
                    ref = ReplayRef(record_id=rid, replay=item.ctx.replay)
                    outcomes.append(record_succeeded_event(ref))
                continue
            outcomes.append(self._failed_event(item.record, item.ctx.replay, error))
            failed.append((item.record, item.ctx.replay))
            kinds[rid] = "retried" if item.ctx.replay < self._max else "abandoned"
        # The outcomes go out with the page's progress, in one commit (run()).
        self._pending = outcomes
        if any(replay >= self._max for _, replay in failed):
            # Abandoning needs the offset of the new body: write the outcomes now.
            written = await append_all(self._args, outcomes)
            self._pending = []
            for event in written:
                if event is None or event.type != DEAD_LETTERED:
                    continue
                again = record_from_event(event)
                if again is not None and again.replays >= self._max:
                    await append_all(self._args, [abandoned_event(self._key, again, self._max)])
        for record in live:
            self._report.add(kinds[record.record_id], record.record_id)
        return skipped

    async def _reappend(self, items: list[_Dispatch]) -> dict[str, Exception]:
        """The default replay of a page's records: their requests again, in one append."""
        requests = [
            {
                "type": item.record.request_type,
                "payload": item.record.payload,
                # At the version it was recorded in: the consumer's fold lifts an old one.
                "payload_version": item.record.request_version,
                # Marked as this replay of this record, so its origin reports the outcome.
                "metadata": {
                    "dlq": {"record_id": item.record.record_id, "replay": item.ctx.replay}
                },
                "idempotency_key": item.ctx.idempotency_key,
            }
            for item in items
        ]
        if not requests:
            return {}
        try:
            await self._reader.append(*requests)
            return {}
        except Exception:
            pass
        # One of them was refused (a bad payload, say): find which, one at a time.
        errors: dict[str, Exception] = {}
        for item, request in zip(items, requests, strict=True):
            try:
                await self._reader.append(request)
            except Exception as exc:
                errors[item.record.record_id] = exc
        return errors

    def _failed_event(self, record: DlqRecord, replay: int, exc: Exception) -> dict[str, Any]:
        return dead_lettered_event(
            record_id=record.record_id,
            origin=record.origin,
            operation=record.operation,
            payload=record.payload,
            error=f"replay {replay} failed: {type(exc).__name__}: {exc}"[:4000],
            attempts=record.attempts,
            resource_id=record.resource_id,
            actor=record.actor,
            request_type=record.request_type,
            request_version=record.request_version,
            replay_of=ReplayRef(record_id=record.record_id, replay=replay),
            idempotency_key=self._key("dead-lettered", record.record_id, replay),
        )

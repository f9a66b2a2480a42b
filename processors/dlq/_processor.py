"""The dead-letter queue: collects records other processors gave up on, and replays them.

Any processor (tasks, notifications, yours) that gives up on a piece of work
appends a ``dlq.dead-lettered`` event (build it with :func:`dead_lettered_event`).
:class:`DlqProcessor` counts the records, and on ``dlq.replay-requested``
replays the pending ones through per-operation replay handlers, ending every
request with one ``dlq.replay-completed`` report of replayed, retried,
abandoned and skipped record ids.

Guarantees:

- **Bounded state.** The reduced state keeps counters, the replay queue and a
  scan floor, never the records: the log is the record store. A replay walks
  the log page by page (newest first, from the replay's start down to the
  floor), so replaying 100k records holds one page of events plus one integer
  per record already settled above the floor, never the records themselves.
- **A record lives in its latest event.** Every change of a record is an
  event: ``dlq.dead-lettered`` (pending; ``replay`` says how many replays it
  has had), ``dlq.record-replaying``, ``dlq.record-succeeded``,
  ``dlq.record-abandoned``. The latest one about a record id is its status.
- **Nothing is lost, nothing runs twice by accident.** Every event the DLQ
  appends has an idempotency key derived from the record id and replay
  number, so a pass interrupted by a crash resumes and re-appends nothing.
  Replay handlers may run again after a crash (at least once): make them
  idempotent with the key they are given.

Replay outcomes come back through the record id: a replayed request carries
``metadata["dlq"] = {"record_id", "replay"}`` (:func:`replay_ref`); the origin
reports success with :func:`record_succeeded_event`, and failure by
dead-lettering again with the same record id and ``replay`` (pass
``replay_of=`` to :func:`dead_lettered_event`). A record whose replays reach
``max_attempts`` is abandoned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from streamkit.processors._handlers import resolve_handler
from streamkit.processors.dlq._events import (
    DLQ_CONTRACT,
    MAX_QUEUED_REPLAYS,
    ActiveReplay,
    DeadLettered,
    DlqState,
    RecordAbandoned,
    RecordReplaying,
    RecordSucceeded,
    ReplayCompleted,
    ReplayHandler,
    ReplayProgress,
    ReplayReport,
    ReplayRequested,
)
from streamkit.processors.dlq._replay import (
    ReplayPass,
    abandoned_event,
    append_all,
    completed_event,
)
from streamkit.processors.dlq._scan import (
    DlqRecord,
    record_from_event,
)

from streamkit import (
    InvalidContract,
    ProcessEventArgs,
    StreamEvent,
    StreamProcessor,
)

__all__ = [
    "DlqProcessor",
]

_RETRY_PASS_AFTER = 5.0


class DlqProcessor(StreamProcessor[DlqState]):
    """Collects ``dlq.dead-lettered`` records and replays them on ``dlq.replay-requested``.

    Replays read the records from, and re-append requests to, the stream the
    processor runs on (``args.stream``, fenced by the host's lease): the log
    itself is the record store, and nothing names the database twice. ``handlers`` maps an operation to an async replay handler (or
    a ``"module:function"`` string); a record without one is replayed by
    re-appending its original request (``request_type``), or skipped when it has
    none. A record whose replays reach ``max_attempts`` is abandoned.
    """

    contract = DLQ_CONTRACT

    def __init__(
        self,
        *,
        handlers: Mapping[str, ReplayHandler | str] | None = None,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidContract(
                f"DlqProcessor max_attempts must be an integer >= 1, got {max_attempts!r}; "
                "nothing was built",
                details={"max_attempts": repr(max_attempts)},
            )
        self._handlers = {
            op: resolve_handler(f'DLQ replay handler for "{op}"', h, {"operation": op})
            for op, h in (handlers or {}).items()
        }
        self.max_attempts = max_attempts
        self._clock = clock
        # The request offset of the pass this incarnation runs (None: none running).
        self._pass_for: int | None = None

    # -- reduce ---------------------------------------------------------------------

    def retain_from(self, state: DlqState) -> int | None:
        """Above the scan floor while any record is pending or replaying, or a replay is queued.

        The records live in the log, and no pending record's body lies at or
        below the floor: retention keeps everything after it, so every
        pending record can still be read and replayed. A queue with nothing
        pending keeps nothing back.
        """
        counts = state.counts
        if counts.pending or counts.replaying or state.replays:
            return state.floor + 1
        return None

    def reduce(self, event: StreamEvent, state: DlqState) -> DlqState | None:
        p = event.payload
        counts = state.counts
        if isinstance(p, DeadLettered):
            if p.replay == 0:
                counts = counts.model_copy(
                    update={"pending": counts.pending + 1, "total": counts.total + 1}
                )
            else:
                counts = counts.model_copy(
                    update={
                        "pending": counts.pending + 1,
                        "replaying": max(0, counts.replaying - 1),
                    }
                )
        elif isinstance(p, RecordReplaying):
            counts = counts.model_copy(
                update={"pending": max(0, counts.pending - 1), "replaying": counts.replaying + 1}
            )
        elif isinstance(p, RecordSucceeded):
            counts = counts.model_copy(
                update={
                    "replaying": max(0, counts.replaying - 1),
                    "succeeded": counts.succeeded + 1,
                }
            )
        elif isinstance(p, RecordAbandoned):
            counts = counts.model_copy(
                update={"pending": max(0, counts.pending - 1), "abandoned": counts.abandoned + 1}
            )
        elif isinstance(p, ReplayRequested):
            if len(state.replays) > MAX_QUEUED_REPLAYS:
                return state.model_copy(update={"refused_replays": state.refused_replays + 1})
            queued = ActiveReplay(
                request_offset=event.offset,
                record_ids=p.record_ids,
                origin=p.origin,
                operation=p.operation,
                requested_by=p.requested_by,
            )
            return state.model_copy(update={"replays": [*state.replays, queued]})
        elif isinstance(p, ReplayProgress):
            replays = [
                r.model_copy(
                    update={
                        "start_offset": p.start_offset,
                        "scanned_down_to": p.scanned_down_to,
                        "report": p.report,
                    }
                )
                if r.request_offset == p.request_offset
                else r
                for r in state.replays
            ]
            return state.model_copy(update={"replays": replays})
        elif isinstance(p, ReplayCompleted):
            replays = [r for r in state.replays if r.request_offset != p.request_offset]
            floor = state.floor if p.new_floor is None else max(state.floor, p.new_floor)
            return state.model_copy(update={"replays": replays, "floor": floor})
        else:
            return None
        return state.model_copy(update={"counts": counts})

    # -- effects --------------------------------------------------------------------

    def process_event(self, args: ProcessEventArgs[DlqState]) -> None:
        event = args.event
        if event is not None:
            p = event.payload
            if isinstance(p, DeadLettered) and p.replay >= self.max_attempts:
                record = record_from_event(event)
                if record is not None:
                    args.run_in_background(lambda: self._abandon(args, record))
            elif isinstance(p, ReplayRequested) and not any(
                r.request_offset == event.offset for r in args.state.replays
            ):
                refused = ReplayCompleted(
                    request_offset=event.offset,
                    requested_by=p.requested_by,
                    report=ReplayReport(),
                    error=f"refused: {MAX_QUEUED_REPLAYS} replay requests are already queued; "
                    "nothing was replayed; request again once the queue drains",
                )
                args.run_in_background(lambda: append_all(args, [self._completed(refused)]))
        if args.delivery.caught_up and args.state.replays:
            active = args.state.replays[0]
            if self._pass_for != active.request_offset:
                self._pass_for = active.request_offset
                floor = args.state.floor
                args.run_in_background(lambda: self._run_pass(args, active, floor))

    def _key(self, *parts: object) -> str:
        return self.idempotency_key("/".join(str(p) for p in parts))

    def _completed(self, body: ReplayCompleted) -> dict[str, Any]:
        return completed_event(self._key, body)

    async def _abandon(self, args: ProcessEventArgs[DlqState], record: DlqRecord) -> None:
        await append_all(args, [abandoned_event(self._key, record, self.max_attempts)])

    async def _run_pass(
        self, args: ProcessEventArgs[DlqState], active: ActiveReplay, floor: int
    ) -> None:
        try:
            await ReplayPass(
                args=args,
                reader=args.stream,
                active=active,
                floor=floor,
                handlers=self._handlers,
                max_attempts=self.max_attempts,
                key=self._key,
            ).run()
        except Exception:
            # A failure (a read, say) leaves the request queued:
            # this wakeup, or the next at-head pass, starts it again.
            self._pass_for = None
            args.schedule_wakeup(self._clock() + _RETRY_PASS_AFTER)
            raise
        except BaseException:
            # Cancelled (a shutdown): the claim this attempt held revives the
            # processor, and the pass resumes from its recorded progress.
            self._pass_for = None
            raise

"""Durable background tasks: request a named task, and it runs with retries until it settles.

A ``task.requested`` event asks for one run of a named handler. The
:class:`TasksProcessor` runs it in the background under a timeout, retries a
failed attempt with exponential backoff and jitter up to ``max_attempts``, and
records every step as an event: ``task.attempt-started``, ``task.succeeded``,
``task.attempt-failed``, ``task.dead-lettered``, ``task.cancelled`` (and
``task.rejected`` for a request or cancel it cannot honour). A dead-lettered
task also appends ``dlq.dead-lettered``, so the DLQ collects it and can replay it.

Guarantees:

- **At least once.** An attempt that a crash interrupted (started, never
  settled) is found by the revive's at-head pass and counted as failed, then
  retried. A handler may therefore run more than once for one attempt budget:
  handlers must be idempotent, using ``ctx.idempotency_key`` (stable for the
  task run, across its attempts) for their side effects.
- **One outcome per attempt.** Every outcome event's idempotency key is derived
  from the task run and the attempt number, and all outcomes of one attempt
  share it: a retried append returns the event already written, and a second,
  different outcome for the same attempt is refused by the log.
- **Time is passed in.** Due times, retry times and wakeups come from the
  ``clock`` given to the processor (epoch seconds); handler timeouts use the
  event loop's clock. Scheduled (``not_before``) and retried tasks wake the
  processor through ``schedule_wakeup``.
- **State is only what is live.** The reduced state keeps live tasks and
  counters, never history: a task that succeeds, dead-letters or is cancelled
  leaves the state. Its story is in the log.

A task run is identified by its id and the offset of its request: once a task
has finished, a new request with the same id is a new run (with new keys); a
request for an id that is still live is rejected.

The class stays whole at about 600 lines: its slots, attempts in flight, cancels
and settling steps change together in every pass; what splits off already has:
the outcomes' appends (``_outcomes``), the index of waiting tasks (``_index``),
the joint appends (``_joint``) and the handler's call (``_handler_call``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from streamkit.processors._handlers import resolve_handler
from streamkit.processors.dlq import (
    dead_lettered_event,
    replay_ref,
)
from streamkit.processors.tasks._events import (
    ORIGIN,
    TASK_ATTEMPT_STARTED,
    TASK_REJECTED,
    TASK_REQUESTED,
    TASKS_CONTRACT,
    LiveTask,
    TaskAttemptFailed,
    TaskAttemptStarted,
    TaskCancelled,
    TaskCancelRequested,
    TaskContext,
    TaskCounts,
    TaskDeadLettered,
    TaskHandler,
    TaskRejected,
    TaskRequested,
    TasksState,
    TaskSucceeded,
    _RunEvent,
)
from streamkit.processors.tasks._handler_call import error_text, run_handler
from streamkit.processors.tasks._index import TaskIndex
from streamkit.processors.tasks._outcomes import Outcomes, run_key

from streamkit import (
    IdempotencyConflict,
    InvalidContract,
    ProcessEventArgs,
    SharedMap,
    StreamEvent,
    StreamkitError,
    StreamProcessor,
)
from streamkit.errors import did_you_mean

__all__ = [
    "TasksProcessor",
]


def _state(tasks: SharedMap[str, LiveTask], counts: TaskCounts) -> TasksState:
    """A new state from parts that are validated already.

    Validating them again would walk every live task on every event, a cost
    that grows with the backlog rather than with the change.
    """
    return TasksState.model_construct(tasks=tasks, counts=counts)


def _started_at(event: StreamEvent, default: float) -> float:
    payload = event.payload
    if isinstance(payload, TaskAttemptStarted):
        return payload.started_at
    if isinstance(payload, Mapping) and isinstance(payload.get("started_at"), int | float):
        return float(payload["started_at"])
    return default


class TasksProcessor(StreamProcessor[TasksState]):
    """Runs ``task.requested`` tasks with the registered ``handlers``.

    ``handlers`` maps a task name to ``async def handler(args, ctx)`` (or a
    ``"module:function"`` string, for the host's config). A name with no
    handler dead-letters the task at once. Retries wait
    ``min(backoff_max, backoff_base * 2 ** (attempt - 1))`` seconds plus up
    to ``jitter`` of that, derived from the task run and attempt (so the same
    failure always schedules the same retry). At most ``concurrency``
    attempts run at once. ``clock`` gives epoch seconds.
    """

    contract = TASKS_CONTRACT

    def __init__(
        self,
        *,
        handlers: Mapping[str, TaskHandler | str] | None = None,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        jitter: float = 0.25,
        concurrency: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for label, value, low in (
            ("backoff_base", backoff_base, 0.0),
            ("backoff_max", backoff_max, 0.0),
            ("jitter", jitter, 0.0),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
                raise InvalidContract(
                    f"TasksProcessor {label} must be a number >= {low}, got {value!r}; "
                    "nothing was built",
                    details={label: repr(value)},
                )
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidContract(
                f"TasksProcessor concurrency must be an integer >= 1, got {concurrency!r}; "
                "nothing was built",
                details={"concurrency": repr(concurrency)},
            )
        self._handlers = {
            name: resolve_handler(f'task handler "{name}"', h, {"task": name})
            for name, h in (handlers or {}).items()
        }
        self._backoff_base = float(backoff_base)
        self._backoff_max = float(backoff_max)
        self._jitter = float(jitter)
        self._concurrency = concurrency
        self._clock = clock
        # Attempts this incarnation started ("run/attempt"): never started twice,
        # and never mistaken for one a crash interrupted.
        self._owned: set[str] = set()
        # Runs with an attempt in flight here -> the handler's future (to cancel it).
        self._inflight: dict[str, asyncio.Future[Any]] = {}
        # Attempts scheduled here and not finished (what ``concurrency`` limits).
        self._active = 0
        # Runs whose in-flight handler was cancelled on request -> the reason.
        self._cancelling: dict[str, str | None] = {}
        # Settling steps (run, step) this incarnation already started: a cancel,
        # an interrupted attempt, a dead-letter. Each is appended once.
        self._settling: set[tuple[str, str]] = set()
        self._index = TaskIndex()
        # The latest at-head pass (its args and state) while no event came since:
        # slots that free up before the next pass are filled from it (_refill).
        self._at_head: tuple[ProcessEventArgs[TasksState], TasksState] | None = None
        self._refill_due = False
        self._outcomes = Outcomes(
            self.idempotency_key,
            self.retry_delay,
            self.contract.payload_version_of(TASK_REQUESTED),
        )

    # -- pure parts -----------------------------------------------------------------

    def retry_delay(self, task_id: str, request_offset: int, attempt: int) -> float:
        """Seconds to wait after failed ``attempt`` (deterministic per run and attempt)."""
        base = min(self._backoff_max, self._backoff_base * 2 ** (attempt - 1))
        digest = hashlib.sha256(f"{task_id}@{request_offset}/{attempt}".encode()).digest()
        fraction = int.from_bytes(digest[:8], "big") / 2**64
        return float(base * (1.0 + self._jitter * fraction))

    def retain_from(self, state: TasksState) -> int | None:
        """The request of the oldest task not settled: its history stays readable until it is.

        ``GET /v1/tasks/{id}`` and ``streamkit tasks show`` read a live task's
        events from its request on; retention keeps them (one pass over the
        live tasks, at each checkpoint).
        """
        return min((task.request_offset for task in state.tasks.values()), default=None)

    def reduce(self, event: StreamEvent, state: TasksState) -> TasksState | None:
        p = event.payload
        counts = state.counts
        if isinstance(p, TaskRequested):
            if p.task_id in state.tasks:
                return None  # rejected by the effects; the live run is untouched
            created = LiveTask(
                task_id=p.task_id,
                name=p.name,
                args=p.args,
                max_attempts=p.max_attempts,
                timeout_s=p.timeout_s,
                request_offset=event.offset,
                due=p.not_before or 0.0,
                dlq=replay_ref(event),
            )
            return _state(
                state.tasks.set(p.task_id, created),
                counts.model_copy(update={"requested": counts.requested + 1}),
            )
        if isinstance(p, TaskCancelRequested):
            live = state.tasks.get(p.task_id)
            if live is None or live.cancel_requested:
                return None
            changed = live.model_copy(update={"cancel_requested": True, "cancel_reason": p.reason})
            return state.model_copy(update={"tasks": state.tasks.set(p.task_id, changed)})
        if isinstance(p, TaskRejected):
            return state.model_copy(
                update={"counts": counts.model_copy(update={"rejected": counts.rejected + 1})}
            )
        if not isinstance(p, _RunEvent):
            return None
        task = state.tasks.get(p.task_id)
        if task is None or task.request_offset != p.request_offset:
            return None  # an outcome of a run that already settled
        if isinstance(p, TaskAttemptStarted):
            if p.attempt != task.attempt + 1:
                return None
            changed = task.model_copy(
                update={"attempt": p.attempt, "running": True, "started_at": p.started_at}
            )
            return _state(
                state.tasks.set(p.task_id, changed),
                counts.model_copy(update={"attempts": counts.attempts + 1}),
            )
        if isinstance(p, TaskAttemptFailed):
            if p.attempt != task.attempt:
                return None
            changed = task.model_copy(
                update={"running": False, "due": p.retry_at, "last_error": p.error}
            )
            return _state(
                state.tasks.set(p.task_id, changed),
                counts.model_copy(update={"failed_attempts": counts.failed_attempts + 1}),
            )
        if isinstance(p, TaskSucceeded):
            field = "succeeded"
        elif isinstance(p, TaskDeadLettered):
            field = "dead_lettered"
        elif isinstance(p, TaskCancelled):
            field = "cancelled"
        else:
            return None
        return _state(
            state.tasks.delete(p.task_id),
            counts.model_copy(update={field: getattr(counts, field) + 1}),
        )

    # -- effects --------------------------------------------------------------------

    def process_event(self, args: ProcessEventArgs[TasksState]) -> None:
        event = args.event
        self._at_head = None
        if event is not None:
            task_id = getattr(event.payload, "task_id", None)
            self._index.follow(args.previous_state, args.state, task_id, self._owns)
            self._check_request(args, event)
        if not args.delivery.caught_up:
            return
        state = args.state
        self._prune(state)
        if self._index.state is not state:
            self._index.rebuild(state, self._owns)
        for task_id in self._index.flagged():
            task = state.tasks.get(task_id)
            if task is None:
                continue
            if task.cancel_requested:
                self._cancel(args, task)
            elif task.running and not self._owns(task, task.attempt):
                self._interrupted(args, task)
        now = self._clock()
        slots = self._concurrency - self._active
        starting: list[LiveTask] = []
        # Earliest due first, then oldest request. A pass that runs out of slots stops:
        # each attempt in flight brings another pass when its outcome lands.
        while (task := self._index.waiting(state)) is not None:
            if task.due > now:
                args.schedule_wakeup(task.due)
                break
            run = run_key(task)
            if self._owns(task, task.attempt + 1):
                self._index.taken()  # started here; its start is on the way
            elif task.name not in self._handlers:
                self._index.taken()
                if (run, "unknown") in self._settling:
                    continue
                self._settling.add((run, "unknown"))
                error = (
                    f'no handler is registered for task name "{task.name}" '
                    f"({did_you_mean(task.name, self._handlers)}registered: "
                    f"{', '.join(sorted(self._handlers)) or 'none'}); the task was not run"
                )
                args.run_in_background(partial(self._outcomes.dead_letter, args, task, error))
            elif slots > 0:
                slots -= 1
                starting.append(self._take_slot(task))
            else:
                break
        if starting:
            args.run_in_background(partial(self._attempts, args, starting))
        self._at_head = (args, state)

    def _take_slot(self, task: LiveTask) -> LiveTask:
        """The waiting task first in the index starts here: its entry, a slot, its attempt."""
        self._index.taken()
        self._owned.add(f"{run_key(task)}/{task.attempt + 1}")
        self._active += 1
        return task

    def _refill_soon(self) -> None:
        """A slot freed: fill the free slots once the attempts ending now have all freed theirs."""
        if not self._refill_due:
            self._refill_due = True
            asyncio.get_running_loop().call_soon(self._refill)

    def _refill(self) -> None:
        """Start waiting tasks in the free slots, as the latest at-head pass would now.

        Only while nothing was delivered since that pass (its state is still the
        head as far as this processor knows): an attempt's outcome would
        otherwise bring the next pass only once it is committed and read back,
        and the slot would idle meanwhile. The tasks it starts are due, have a
        handler, and are started as a pass starts them; anything else (a
        wakeup to ask, a task to dead-letter) waits for the next pass. Nor
        while the host gives its clients first claim: its passes are paced
        then, and what a refill starts would run in the pauses meant for them.
        """
        self._refill_due = False
        head = self._at_head
        if head is None:
            return
        args, state = head
        if self._index.state is not state:
            return  # an event came since: the pass of its batch decides
        if args.yield_to_clients():
            return  # clients first: the host's paced passes start what is due
        now = self._clock()
        slots = self._concurrency - self._active
        starting: list[LiveTask] = []
        while slots > 0 and (task := self._index.waiting(state)) is not None:
            if task.due > now or task.name not in self._handlers:
                break
            if self._owns(task, task.attempt + 1):
                self._index.taken()  # started here; its start is on the way
                continue
            slots -= 1
            starting.append(self._take_slot(task))
        if not starting:
            return
        try:
            args.run_in_background(partial(self._attempts, args, starting))
        except StreamkitError:
            # This engine may start nothing more (its lease was lost, it stopped):
            # the tasks stay waiting in the state for whoever runs the processor next.
            self._active -= len(starting)
            for task in starting:
                self._owned.discard(f"{run_key(task)}/{task.attempt + 1}")
            self._index.state = None  # their entries were taken: rebuilt at the next pass

    def _owns(self, task: LiveTask, attempt: int) -> bool:
        """Whether this incarnation started ``attempt`` of ``task``'s run."""
        return f"{run_key(task)}/{attempt}" in self._owned

    def _prune(self, state: TasksState) -> None:
        """Forget what this incarnation noted about runs that are no longer live."""

        def live(run: str) -> bool:
            task_id, _, offset = run.rpartition("@")
            task = state.tasks.get(task_id)
            return task is not None and str(task.request_offset) == offset

        self._owned = {key for key in self._owned if live(key.rpartition("/")[0])}
        self._settling = {step for step in self._settling if live(step[0])}
        self._cancelling = {r: v for r, v in self._cancelling.items() if live(r)}

    def _check_request(self, args: ProcessEventArgs[TasksState], event: StreamEvent) -> None:
        p = event.payload
        reason: str | None = None
        if isinstance(p, TaskRequested):
            live = args.state.tasks.get(p.task_id)
            if live is not None and live.request_offset != event.offset:
                reason = (
                    f'task "{p.task_id}" is already live (requested at offset '
                    f"{live.request_offset}); this request was not run; request again with "
                    "another id, or once the live run has finished"
                )
        elif isinstance(p, TaskCancelRequested) and p.task_id not in args.state.tasks:
            reason = (
                f'no live task "{p.task_id}" to cancel (it finished, or was never requested); '
                "nothing was changed"
            )
        if reason is None:
            return
        assert isinstance(p, TaskRequested | TaskCancelRequested)
        rejected = {
            "type": TASK_REJECTED,
            "payload": TaskRejected(task_id=p.task_id, offset=event.offset, reason=reason),
            "idempotency_key": self.idempotency_key("rejected", event),
        }
        events: list[dict[str, Any]] = [rejected]
        ref = replay_ref(event) if isinstance(p, TaskRequested) else None
        if ref is not None and isinstance(p, TaskRequested):
            # A DLQ replay that cannot run goes back to the DLQ, or it would
            # wait in "replaying" forever.
            events.append(
                dead_lettered_event(
                    record_id=ref.record_id,
                    origin=ORIGIN,
                    operation=p.name,
                    payload=p.model_dump(mode="json"),
                    error=f"rejected: {reason}",
                    attempts=0,
                    request_type=TASK_REQUESTED,
                    request_version=self.contract.payload_version_of(TASK_REQUESTED),
                    replay_of=ref,
                    idempotency_key=self.idempotency_key("rejected-dlq", event),
                )
            )
        args.run_in_background(lambda: self._outcomes.append(args, *events))

    async def _attempts(self, args: ProcessEventArgs[TasksState], tasks: list[LiveTask]) -> None:
        """Start the attempts of one pass together (one append), then run each on its own."""
        try:
            started = await self._start(args, tasks)
        except BaseException:
            self._active -= len(tasks)
            raise
        runs = [self._attempt(args, task, at) for task, at in zip(tasks, started, strict=True)]
        # Every attempt settles before this background work does: the claim covers them
        # all, so one that fails (its outcome could not be appended) must not end it early.
        outcomes = await asyncio.gather(*runs, return_exceptions=True)
        errors = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ExceptionGroup(f"{len(errors)} task attempts failed", errors)

    async def _start(
        self, args: ProcessEventArgs[TasksState], tasks: list[LiveTask]
    ) -> list[float | None]:
        """Append ``task.attempt-started`` for each task in one call; each one's start time.

        None for an attempt another incarnation started first (its outcome is
        theirs). One such conflict refuses the joint append whole, so the
        attempts are then started one append each, and only the conflicting
        ones are given up.
        """
        now = self._clock()
        events = [
            {
                "type": TASK_ATTEMPT_STARTED,
                "payload": TaskAttemptStarted(
                    task_id=task.task_id,
                    request_offset=task.request_offset,
                    attempt=task.attempt + 1,
                    started_at=now,
                ),
                "idempotency_key": self._outcomes.key(task, f"{task.attempt + 1}/started"),
            }
            for task in tasks
        ]
        written: list[StreamEvent | None]
        try:
            written = list(await args.append(*events))
        except IdempotencyConflict:
            if len(events) == 1:
                written = [None]
            else:
                alone = [await self._outcomes.append(args, event) for event in events]
                written = [None if w is None else w[0] for w in alone]
        # An idempotent retry returns the event as first written, with its own time.
        return [None if event is None else _started_at(event, now) for event in written]

    async def _attempt(
        self, args: ProcessEventArgs[TasksState], task: LiveTask, started_at: float | None
    ) -> None:
        held = True

        def free_slot() -> None:
            nonlocal held
            if held:
                held = False
                self._active -= 1
                current = asyncio.current_task()
                if current is None or not current.cancelling():
                    self._refill_soon()  # a cancelled attempt (a stop) starts no other

        try:
            if started_at is not None:
                await self._run_attempt(args, task, started_at, free_slot)
        finally:
            free_slot()

    async def _run_attempt(
        self,
        args: ProcessEventArgs[TasksState],
        task: LiveTask,
        started_at: float,
        free_slot: Callable[[], None],
    ) -> None:
        run = run_key(task)
        attempt = task.attempt + 1
        handler = self._handlers[task.name]
        ctx = TaskContext(
            task_id=task.task_id,
            name=task.name,
            attempt=attempt,
            max_attempts=task.max_attempts,
            idempotency_key=self.idempotency_key(f"run/{run}"),
            request_offset=task.request_offset,
            replay=None if task.dlq is None else task.dlq.replay,
        )
        loop = asyncio.get_running_loop()
        began = loop.time()
        label = f"task handler {task.name!r} (task {task.task_id}, attempt {attempt})"
        call = loop.create_task(run_handler(handler, dict(task.args), ctx), name=label)
        self._inflight[run] = call
        if run in self._cancelling:
            call.cancel()  # cancelled between its start's commit and now (see _cancel)
        try:
            done, _ = await asyncio.wait({call}, timeout=task.timeout_s)
        finally:
            if not call.done():
                call.cancel()  # timed out, or this coroutine itself was cancelled (shutdown)
                # A handler that catches its cancel runs on: counted and named, not awaited.
                args.track_cancelled(call, label)
            self._inflight.pop(run, None)
            # Free before the outcome is appended: the at-head pass that outcome brings
            # must see the slot free, or a backlog waits for a revive to start again.
            free_slot()
        # A handler that held the event loop (blocking code) can finish past its
        # deadline without the wait ever timing out: it outlived timeout_s all the same.
        if done and loop.time() - began > task.timeout_s and not call.cancelled():
            done = set()
        if not done:
            await self._outcomes.failed(
                args, task, attempt, started_at, f"timed out after {task.timeout_s} s"
            )
        elif call.cancelled():
            if run in self._cancelling:
                await self._outcomes.cancelled(args, task, attempt, self._cancelling[run])
            else:
                await self._outcomes.failed(
                    args, task, attempt, started_at, "CancelledError: the handler was cancelled"
                )
        elif call.exception() is not None:
            exc = call.exception()
            assert exc is not None
            await self._outcomes.failed(args, task, attempt, started_at, error_text(exc), exc)
        else:
            await self._outcomes.succeeded(args, task, attempt, started_at, call.result())

    def _interrupted(self, args: ProcessEventArgs[TasksState], task: LiveTask) -> None:
        # Started (the log says so) but not by this incarnation and never
        # settled: the host died mid-attempt. Count it failed; the retry (or
        # dead-letter) follows from the same rules as any failure.
        run = run_key(task)
        self._owned.add(f"{run}/{task.attempt}")
        error = (
            f"attempt {task.attempt} was interrupted: the host stopped before it settled "
            "(the handler may or may not have completed its work)"
        )
        started_at = task.started_at if task.started_at is not None else self._clock()
        args.run_in_background(
            lambda: self._outcomes.failed(args, task, task.attempt, started_at, error)
        )

    def _cancel(self, args: ProcessEventArgs[TasksState], task: LiveTask) -> None:
        run = run_key(task)
        call = self._inflight.get(run)
        if call is not None:
            # The attempt records the cancellation itself when its handler stops.
            self._cancelling[run] = task.cancel_reason
            call.cancel()
            return
        if task.running and f"{run}/{task.attempt}" in self._owned:
            # Started here and not in flight: its handler is about to be called (its start
            # committed, its coroutine not yet run), which then cancels it at once, or its
            # outcome is being appended and the next pass sees where it went.
            self._cancelling[run] = task.cancel_reason
            return
        if (run, "cancel") in self._settling:
            return
        self._settling.add((run, "cancel"))
        args.run_in_background(
            lambda: self._outcomes.cancelled(args, task, task.attempt, task.cancel_reason)
        )

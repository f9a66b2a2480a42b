"""What the end of a task attempt appends: one outcome per attempt, written once.

Every outcome event's idempotency key is derived from the task run and the
attempt number (``tasks/<id>@<request offset>/<attempt>/outcome``), and all
outcomes of one attempt share it: an append retried after a crash returns the
event already written, and a second, different outcome for the same attempt
(another incarnation got there first) is refused by the log, which keeps the
first. A dead-lettered task also appends ``dlq.dead-lettered``, and a replayed
task that settles tells the DLQ, in the same append as its outcome. The
outcomes of attempts that end in the same loop turn go in one append call
(:mod:`._joint`), each alone again if the log refuses the joint one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from streamkit.processors.dlq import dead_lettered_event, record_succeeded_event
from streamkit.processors.tasks._events import (
    _ERROR_CHARS,
    ORIGIN,
    SLUG,
    TASK_ATTEMPT_FAILED,
    TASK_CANCELLED,
    TASK_DEAD_LETTERED,
    TASK_REQUESTED,
    TASK_SUCCEEDED,
    LiveTask,
    TaskAttemptFailed,
    TaskCancelled,
    TaskDeadLettered,
    TaskRequested,
    TasksState,
    TaskSucceeded,
)
from streamkit.processors.tasks._handler_call import log_failure
from streamkit.processors.tasks._joint import JointAppends

from streamkit import IdempotencyConflict, ProcessEventArgs, StreamEvent
from streamkit.tracebacks import traceback_excerpt

__all__ = ["Outcomes", "run_key"]


def run_key(task: LiveTask) -> str:
    """A task run's name: its id and the offset of its request."""
    return f"{task.task_id}@{task.request_offset}"


class Outcomes:
    """What a :class:`~._processor.TasksProcessor` appends when a task run moves on.

    ``idempotency_key`` is the processor's (stable per event and step),
    ``retry_delay(task_id, request_offset, attempt)`` its backoff,
    ``request_version`` the payload version of its ``task.requested`` (what a
    dead-lettered record's request is, for its replay).
    """

    def __init__(
        self,
        idempotency_key: Callable[..., str],
        retry_delay: Callable[[str, int, int], float],
        request_version: int = 1,
    ) -> None:
        self._idempotency_key = idempotency_key
        self._retry_delay = retry_delay
        self._request_version = request_version
        # An attempt's outcome goes in one append with the others ending in its loop turn.
        self._joint = JointAppends(lambda args, events: self.append(args, *events))

    def key(self, task: LiveTask, what: str) -> str:
        return self._idempotency_key(f"{run_key(task)}/{what}")

    async def append(
        self, args: ProcessEventArgs[TasksState], *events: Mapping[str, Any]
    ) -> list[StreamEvent] | None:
        # A conflict means this step was already recorded, possibly with another
        # outcome (another incarnation got there first): the log keeps the first.
        try:
            return await args.append(*events)
        except IdempotencyConflict:
            return None

    async def succeeded(
        self,
        args: ProcessEventArgs[TasksState],
        task: LiveTask,
        attempt: int,
        started_at: float,
        result: Any,
    ) -> None:
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            error = f"the handler returned a result that is not JSON ({exc}); it was not recorded"
            await self.failed(args, task, attempt, started_at, error)
            return
        body = TaskSucceeded(
            task_id=task.task_id, request_offset=task.request_offset, attempt=attempt, result=result
        )
        events: list[Mapping[str, Any]] = [
            {
                "type": TASK_SUCCEEDED,
                "payload": body,
                "idempotency_key": self.key(task, f"{attempt}/outcome"),
            }
        ]
        if task.dlq is not None:
            events.append(record_succeeded_event(task.dlq))
        await self._joint.append(args, events)

    async def failed(
        self,
        args: ProcessEventArgs[TasksState],
        task: LiveTask,
        attempt: int,
        started_at: float,
        error: str,
        exc: BaseException | None = None,
    ) -> None:
        """Record attempt ``attempt`` failed (``exc``: what the handler raised, if it did).

        Every failed attempt is logged once here, whatever failed it (a raise, a
        timeout, a cancel, an interrupted host), with the handler's traceback when it
        raised; its event and any dead-letter keep a bounded excerpt of it.
        """
        log_failure(task, attempt, error, exc)
        traceback = None if exc is None else traceback_excerpt(exc)
        if attempt >= task.max_attempts:
            await self.dead_letter(
                args,
                task,
                f"attempt {attempt} of {task.max_attempts} failed: {error}",
                attempt,
                traceback,
            )
            return
        body = TaskAttemptFailed(
            task_id=task.task_id,
            request_offset=task.request_offset,
            attempt=attempt,
            error=error[:_ERROR_CHARS],
            retry_at=started_at + self._retry_delay(task.task_id, task.request_offset, attempt),
            traceback=traceback,
        )
        failed = {
            "type": TASK_ATTEMPT_FAILED,
            "payload": body,
            "idempotency_key": self.key(task, f"{attempt}/outcome"),
        }
        await self._joint.append(args, [failed])

    def _request_payload(self, task: LiveTask) -> dict[str, Any]:
        # What the DLQ replays: the request as it was, not_before dropped (a
        # replay runs now), with a fresh attempt budget.
        return TaskRequested(
            task_id=task.task_id,
            name=task.name,
            args=task.args,
            max_attempts=task.max_attempts,
            timeout_s=task.timeout_s,
        ).model_dump(mode="json")

    async def dead_letter(
        self,
        args: ProcessEventArgs[TasksState],
        task: LiveTask,
        error: str,
        attempt: int = 0,
        traceback: str | None = None,
    ) -> None:
        attempts = attempt or task.attempt
        body = TaskDeadLettered(
            task_id=task.task_id,
            request_offset=task.request_offset,
            attempts=attempts,
            error=error[:_ERROR_CHARS],
            traceback=traceback,
        )
        await self.append(
            args,
            {
                "type": TASK_DEAD_LETTERED,
                "payload": body,
                "idempotency_key": self.key(task, f"{attempts}/outcome"),
            },
            dead_lettered_event(
                record_id=f"{SLUG}/{run_key(task)}",
                origin=ORIGIN,
                operation=task.name,
                payload=self._request_payload(task),
                error=error[:_ERROR_CHARS],
                attempts=attempts,
                resource_id=task.task_id,
                request_type=TASK_REQUESTED,
                request_version=self._request_version,
                replay_of=task.dlq,
                idempotency_key=self.key(task, f"{attempts}/dlq"),
                traceback=traceback,
            ),
        )

    async def cancelled(
        self,
        args: ProcessEventArgs[TasksState],
        task: LiveTask,
        attempts: int,
        reason: str | None,
    ) -> None:
        body = TaskCancelled(
            task_id=task.task_id,
            request_offset=task.request_offset,
            attempts=attempts,
            reason=reason,
        )
        events: list[Mapping[str, Any]] = [
            {
                "type": TASK_CANCELLED,
                "payload": body,
                "idempotency_key": self.key(task, "cancelled"),
            }
        ]
        if task.dlq is not None:
            # A cancelled replay goes back to the DLQ as pending, not "replaying" forever.
            events.append(
                dead_lettered_event(
                    record_id=task.dlq.record_id,
                    origin=ORIGIN,
                    operation=task.name,
                    payload=self._request_payload(task),
                    error=f"cancelled: {reason or 'no reason given'}",
                    attempts=attempts,
                    resource_id=task.task_id,
                    request_type=TASK_REQUESTED,
                    request_version=self._request_version,
                    replay_of=task.dlq,
                    idempotency_key=self.key(task, "cancelled-dlq"),
                )
            )
        await self.append(args, *events)

"""The task board: tasks by category, as a processor whose live state clients watch.

The board folds the tasks processor's events into what a screen shows: tasks
*queued* by id (requested, not settled yet; *retrying* after a failed attempt,
*replaying* when the DLQ handed them back), per category the tasks *done*
(created on the board) and the dead-letterings (a replay that fails again
counts again), and the records the DLQ *abandoned* in total. When
a ``create-task`` run succeeds, the board records it once with its own event,
``board.task-created`` (idempotency key ``task-board/created/<task_id>``), which
is what notifications watch: one created task, one event, one notification.

Guarantees:

- **Bounded state.** Only tasks still in flight are kept by id; finished ones
  are counters per category plus the last ``RECENT`` created. The checkpoint
  stays small whatever the volume.
- **A task is created on the board once.** ``board.task-created`` is appended
  under a key derived from the task id, so a batch re-run after a crash (or a
  second ``task.succeeded`` for the id, which the tasks processor never writes)
  returns the event already written instead of adding another.
- **One commit for many.** A success is first *owed* (kept in the state), and
  the owed entries are appended together, in one call and one commit, at the
  batch's at-head pass or once :data:`OWED_FLUSH` of them are owed. The cursor
  does not pass the event whose pass appends them until they are durable,
  and an entry stays owed (in the checkpointed state) until its event is
  folded, so a crash loses none. Appending each success on its own, blocking,
  costs one commit round trip per task: on a loaded PostgreSQL server, 5-50 ms
  each, which held the board tens of seconds behind its tasks.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from pydantic import BaseModel, Field
from streamkit.processors.dlq import DLQ_EVENTS, RecordAbandoned, replay_ref
from streamkit.processors.tasks import (
    TASKS_CONTRACT,
    TaskAttemptFailed,
    TaskDeadLettered,
    TaskRequested,
    TaskSucceeded,
)

from streamkit import (
    EventDefinition,
    IdempotencyConflict,
    ProcessEventArgs,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
)

CREATE_TASK = "create-task"
"""The task name whose successful runs create tasks on the board."""

TASK_CREATED = "board.task-created"
RECENT = 3
OWED_FLUSH = 200
"""Owed entries that are appended at once, at-head pass or not (a bound on the state)."""


class TaskCreated(BaseModel):
    """A task now exists on the board."""

    task_id: str
    title: str
    category: str


class QueuedTask(BaseModel):
    """A task requested and not settled yet."""

    title: str
    category: str
    status: Literal["queued", "retrying", "replaying"] = "queued"


class Column(BaseModel):
    """One category's counters."""

    done: int = 0
    dead_lettered: int = 0


class BoardState(BaseModel):
    """What the board shows: tasks in flight, counters per category, the latest created."""

    queued: dict[str, QueuedTask] = Field(default_factory=dict)
    owed: dict[str, TaskCreated] = Field(default_factory=dict)
    """Tasks whose run succeeded and whose ``board.task-created`` is not folded yet."""
    categories: dict[str, Column] = Field(default_factory=dict)
    recent: list[TaskCreated] = Field(default_factory=list)
    created: int = 0
    dead_lettered: int = 0
    abandoned: int = 0


BOARD_CONTRACT = define_processor_contract(
    slug="task-board",
    version="1",
    description="tasks by category: queued, done, dead-lettered",
    state_schema=BoardState,
    events={
        TASK_CREATED: EventDefinition(
            description="a create-task run succeeded: the task is on the board",
            payload_schema=TaskCreated,
        )
    },
    processor_deps=[TASKS_CONTRACT, DLQ_EVENTS],
    consumes=[
        "task.requested",
        "task.attempt-failed",
        "task.succeeded",
        "task.dead-lettered",
        "dlq.record-abandoned",
        TASK_CREATED,
    ],
    emits=[TASK_CREATED],
)


def _column(state: BoardState, category: str) -> Column:
    return state.categories.get(category, Column())


def _without(queued: dict[str, QueuedTask], task_id: str) -> dict[str, QueuedTask]:
    return {k: v for k, v in queued.items() if k != task_id}


class TaskBoard(StreamProcessor[BoardState]):
    """Folds ``create-task`` runs into a board; records each created task once."""

    contract = BOARD_CONTRACT

    def reduce(self, event: StreamEvent, state: BoardState) -> BoardState | None:
        p = event.payload
        if isinstance(p, TaskRequested):
            if p.name != CREATE_TASK:
                return None
            status: Literal["queued", "replaying"] = (
                "replaying" if replay_ref(event) is not None else "queued"
            )
            queued = QueuedTask(
                title=str(p.args.get("title", "")),
                category=str(p.args.get("category", "")),
                status=status,
            )
            return state.model_copy(update={"queued": {**state.queued, p.task_id: queued}})
        if isinstance(p, TaskAttemptFailed):
            task = state.queued.get(p.task_id)
            if task is None:
                return None
            retrying = task.model_copy(update={"status": "retrying"})
            return state.model_copy(update={"queued": {**state.queued, p.task_id: retrying}})
        if isinstance(p, TaskSucceeded):
            created = _created(p)
            if p.task_id not in state.queued and created is None:
                return None
            # Done once board.task-created is folded; until then it is owed, not queued.
            owed = state.owed
            if created is not None and created.task_id not in owed:
                owed = {**owed, created.task_id: created}
            return state.model_copy(
                update={"queued": _without(state.queued, p.task_id), "owed": owed}
            )
        if isinstance(p, TaskDeadLettered):
            task = state.queued.get(p.task_id)
            if task is None:
                return None
            column = _column(state, task.category)
            return state.model_copy(
                update={
                    "queued": _without(state.queued, p.task_id),
                    "categories": {
                        **state.categories,
                        task.category: column.model_copy(
                            update={"dead_lettered": column.dead_lettered + 1}
                        ),
                    },
                    "dead_lettered": state.dead_lettered + 1,
                }
            )
        if isinstance(p, RecordAbandoned):
            return state.model_copy(update={"abandoned": state.abandoned + 1})
        if isinstance(p, TaskCreated):
            column = _column(state, p.category)
            return state.model_copy(
                update={
                    "owed": {k: v for k, v in state.owed.items() if k != p.task_id},
                    "categories": {
                        **state.categories,
                        p.category: column.model_copy(update={"done": column.done + 1}),
                    },
                    "recent": [*state.recent, p][-RECENT:],
                    "created": state.created + 1,
                }
            )
        return None

    def process_event(self, args: ProcessEventArgs[BoardState]) -> None:
        owed = args.state.owed
        if not owed or (not args.delivery.caught_up and len(owed) < OWED_FLUSH):
            return
        appends = [
            {
                "type": TASK_CREATED,
                "payload": created.model_dump(mode="json"),
                "idempotency_key": self.idempotency_key(f"created/{task_id}"),
            }
            for task_id, created in owed.items()
        ]

        async def record() -> None:
            try:
                await args.append(*appends)  # one call: one commit for them all
            except IdempotencyConflict:
                # One of them is on the board already with another body; the first
                # stands. Record the others one by one.
                for append in appends:
                    with contextlib.suppress(IdempotencyConflict):
                        await args.append(append)

        # Blocking: the cursor does not pass this event until the entries are durable.
        args.block_processor_while(record)


def _created(succeeded: TaskSucceeded) -> TaskCreated | None:
    """The board entry a ``create-task`` success makes, or None for any other success."""
    result: Any = succeeded.result
    if not isinstance(result, dict) or result.get("created") is not True:
        return None
    return TaskCreated(
        task_id=succeeded.task_id,
        title=str(result.get("title", "")),
        category=str(result.get("category", "")),
    )

"""The code of docs/tutorial.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/tutorial.py
"""

import asyncio


async def main() -> None:
    # --- docs/tutorial.md:46
    from pydantic import BaseModel, Field

    from streamkit import EventDefinition, StreamEvent, StreamProcessor, define_processor_contract
    from streamkit.processors.tasks import (
        TASKS_CONTRACT,
        TaskDeadLettered,
        TaskRequested,
        TaskSucceeded,
    )


    class TaskCreated(BaseModel):
        task_id: str
        title: str
        category: str


    class BoardState(BaseModel):
        queued: dict[str, str] = Field(default_factory=dict)  # task id -> category
        done: dict[str, int] = Field(default_factory=dict)  # category -> tasks created
        dead_lettered: dict[str, int] = Field(default_factory=dict)  # category -> gave up
        recent: list[TaskCreated] = Field(default_factory=list)  # the last 5 created


    BOARD = define_processor_contract(
        slug="task-board",
        version="1",
        description="tasks by category",
        state_schema=BoardState,
        events={
            "board.task-created": EventDefinition(
                description="a task is on the board", payload_schema=TaskCreated
            )
        },
        processor_deps=[TASKS_CONTRACT],
        consumes=["task.requested", "task.succeeded", "task.dead-lettered", "board.task-created"],
        emits=["board.task-created"],
    )
    assert BOARD.initial_state() == BoardState()
    # --- docs/tutorial.md:94
    def bump(counts: dict[str, int], key: str) -> dict[str, int]:
        return {**counts, key: counts.get(key, 0) + 1}


    class TaskBoard(StreamProcessor[BoardState]):
        contract = BOARD

        def reduce(self, event: StreamEvent, state: BoardState) -> BoardState | None:
            p = event.payload
            if isinstance(p, TaskRequested) and p.name == "create-task":
                queued = {**state.queued, p.task_id: str(p.args.get("category", ""))}
                return state.model_copy(update={"queued": queued})
            if isinstance(p, TaskSucceeded | TaskDeadLettered) and p.task_id in state.queued:
                queued = {k: v for k, v in state.queued.items() if k != p.task_id}
                if isinstance(p, TaskSucceeded):
                    return state.model_copy(update={"queued": queued})
                failed = bump(state.dead_lettered, state.queued[p.task_id])
                return state.model_copy(update={"queued": queued, "dead_lettered": failed})
            if isinstance(p, TaskCreated):
                return state.model_copy(
                    update={"done": bump(state.done, p.category), "recent": [*state.recent, p][-5:]}
                )
            return None
    # --- docs/tutorial.md:123
    from streamkit.processors.tasks import task_requested_event
    from streamkit.testing import reduce_processor

    state = reduce_processor(
        TaskBoard(),
        [
            task_requested_event(task_id="t1", name="create-task", args={"category": "home"}),
            task_requested_event(task_id="t2", name="create-task", args={"category": "work"}),
            {
                "type": "board.task-created",
                "payload": {"task_id": "t1", "title": "Mop", "category": "home"},
            },
        ],
    )
    assert state.queued == {"t1": "home", "t2": "work"}  # t1 is done, but its success is still to come
    assert state.done == {"home": 1}
    # --- docs/tutorial.md:151
    from streamkit import ProcessEventArgs


    class TaskBoardWithEffects(TaskBoard):
        def process_event(self, args: ProcessEventArgs[BoardState]) -> None:
            event = args.event
            if event is None or not isinstance(event.payload, TaskSucceeded):
                return
            result = event.payload.result
            if not isinstance(result, dict) or not result.get("created"):
                return
            created = {
                "type": "board.task-created",
                "payload": {
                    "task_id": event.payload.task_id,
                    "title": result["title"],
                    "category": result["category"],
                },
                "idempotency_key": self.idempotency_key(f"created/{event.payload.task_id}"),
            }
            args.block_processor_while(lambda: args.append(created))
    # --- docs/tutorial.md:193
    from streamkit.processors.tasks import TaskContext

    store: dict[str, dict] = {}  # idempotency key -> the created task
    locked: set[str] = {"archive"}


    async def create_task(args: dict, ctx: TaskContext) -> dict:
        title, category = args.get("title", ""), args.get("category", "")
        if not title:
            raise ValueError("a task needs a title")
        if category in locked:
            raise RuntimeError(f"category {category!r} is locked")
        # A second run of the same task run finds its task and creates nothing new.
        task = {"task_id": ctx.task_id, "title": title, "category": category}
        task = store.setdefault(ctx.idempotency_key, task)
        return {"created": True, **task}
    # --- docs/tutorial.md:220
    from streamkit import ProcessorEngine
    from streamkit.processors.tasks import TasksProcessor
    from streamkit.testing import ManualClock, memory_storage, memory_stream, settle

    clock = ManualClock(1_700_000_000.0)
    stream = memory_stream(clock=clock)
    storage = memory_storage()  # one checkpoint table; a row per processor slug
    engines: list[ProcessorEngine] = []


    def run(processor: StreamProcessor) -> ProcessorEngine:
        engine = ProcessorEngine(processor, stream=stream, storage=storage, clock=clock)
        stream.engines.append(engine)
        engines.append(engine)
        return engine


    async def run_until_quiet() -> None:
        """Let every push land and every effect finish; revive claims as they fall due."""
        for _ in range(1000):
            await settle(0.005)
            if any(e.statistics().background_in_flight or e.cursor < stream.head for e in engines):
                continue
            due = [e for e in engines if e.statistics().claimed_at is not None]
            if not due:
                return
            first = min(due, key=lambda e: e.statistics().claimed_at)
            clock.now = max(clock.now, first.statistics().claimed_at)  # time passes: the wakeup falls due
            await first.revive()
        raise AssertionError("the service did not go quiet")


    tasks = run(TasksProcessor(handlers={"create-task": create_task}, clock=clock))
    board = run(TaskBoardWithEffects())


    def request(task_id: str, title: str, category: str) -> dict:
        return task_requested_event(
            task_id=task_id,
            name="create-task",
            args={"title": title, "category": category},
            max_attempts=3,
        )


    await stream.append(request("t1", "Water the plants", "home"), request("t2", "File taxes", "work"))
    await run_until_quiet()

    offset, state = await board.snapshot()
    assert state.queued == {}
    assert state.done == {"home": 1, "work": 1}
    assert [t.title for t in state.recent] == ["Water the plants", "File taxes"]
    assert len(store) == 2
    # --- docs/tutorial.md:278
    t1 = [e.type for e in stream.events if e.payload.get("task_id") == "t1"]
    assert t1 == ["task.requested", "task.attempt-started", "task.succeeded", "board.task-created"]
    # --- docs/tutorial.md:286
    before = len(stream.events)
    (again,) = await stream.append(request("t1", "Water the plants", "home"))
    assert again.offset == 1 and len(stream.events) == before
    # --- docs/tutorial.md:301
    from dataclasses import dataclass, field
    from typing import Any

    from streamkit import LIVE_STATE_CHANGED, apply_delta


    @dataclass
    class BoardView:
        """A client's copy of the board: a revision, the state at it, and how far it has read."""

        rev: int
        state: dict[str, Any]
        seen: int = field(default=0)

        async def follow(self) -> None:
            """Apply the board's deltas until the view holds the engine's current revision."""
            target, _ = await board.live_snapshot()
            for _ in range(200):
                for event in stream.pushed_events[self.seen :]:
                    if event.type == LIVE_STATE_CHANGED and event.payload["key"] == "task-board":
                        if event.payload["from"] == self.rev:
                            self.state = apply_delta(self.state, event.payload["patch"])
                            self.rev = event.payload["to"]
                self.seen = len(stream.pushed_events)
                if self.rev == target:
                    return
                await settle(0.005)
            raise AssertionError("the board's deltas did not arrive")


    rev, seed = await board.live_snapshot()
    view = BoardView(rev, seed.model_dump(mode="json"), seen=len(stream.pushed_events))

    await stream.append(request("t3", "Buy stamps", "errands"))
    await run_until_quiet()
    await view.follow()

    assert view.state == (await board.snapshot()).state.model_dump(mode="json")
    assert view.state["done"] == {"home": 1, "work": 1, "errands": 1}
    # --- docs/tutorial.md:351
    from streamkit.processors.notifications import NotificationsProcessor, OutboxChannel, read_outbox

    notifications = run(
        NotificationsProcessor(
            rules=[
                {
                    "name": "task-created",
                    "event_type": "board.task-created",
                    "subject": "New task in ${category}",
                    "template": "${title} is on the board.",
                    "recipients": ["team-${category}@example.com"],
                    "channel": "outbox",
                }
            ],
            channels={"outbox": OutboxChannel("outbox.jsonl")},
            sources=[BOARD],
            clock=clock,
        )
    )
    await notifications.catch_up_from_log()
    await run_until_quiet()

    # Deliveries run side by side, so the lines come in any order.
    lines = {line["body"]: line for line in read_outbox("outbox.jsonl")}
    assert sorted(lines) == [
        "Buy stamps is on the board.",
        "File taxes is on the board.",
        "Water the plants is on the board.",
    ]
    assert lines["Buy stamps is on the board."]["recipients"] == ["team-errands@example.com"]
    # --- docs/tutorial.md:397
    from streamkit.processors.dlq import DlqProcessor, iter_records, replay_requested_event

    dlq = run(DlqProcessor(max_attempts=1, clock=clock))

    t4, t5 = await stream.append(request("t4", "Old notes", "archive"), request("t5", "", "home"))
    await run_until_quiet()

    offset, state = await board.snapshot()
    assert state.dead_lettered == {"archive": 1, "home": 1}
    pending = {r.resource_id: r.error async for r in iter_records(stream, status=["pending"])}
    assert set(pending) == {"t4", "t5"}
    assert "locked" in pending["t4"] and "needs a title" in pending["t5"]
    # --- docs/tutorial.md:419
    locked.clear()
    await stream.append(replay_requested_event(requested_by="tutorial"))
    await run_until_quiet()

    (completed,) = [e.payload for e in stream.events if e.type == "dlq.replay-completed"]
    # A task's record id is "tasks/<task id>@<offset of its request>".
    assert sorted(completed["report"]["replayed"]) == [f"tasks/t4@{t4.offset}", f"tasks/t5@{t5.offset}"]
    status = {r.resource_id: r.status async for r in iter_records(stream)}
    assert status == {"t4": "succeeded", "t5": "abandoned"}

    offset, state = await board.snapshot()
    assert state.done == {"home": 1, "work": 1, "errands": 1, "archive": 1}
    assert read_outbox("outbox.jsonl")[-1]["body"] == "Old notes is on the board."
    # --- docs/tutorial.md:438
    assert sorted(t["task_id"] for t in store.values()) == ["t1", "t2", "t3", "t4"]
    created = [e.payload["task_id"] for e in stream.events if e.type == "board.task-created"]
    assert sorted(created) == ["t1", "t2", "t3", "t4"]
    assert len(read_outbox("outbox.jsonl")) == 4

    for engine in engines:
        await engine.aclose()
    storage.close()


if __name__ == "__main__":
    asyncio.run(main())

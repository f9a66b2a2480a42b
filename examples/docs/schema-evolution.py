"""The code of docs/schema-evolution.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/schema-evolution.py
"""

import asyncio


async def main() -> None:
    # --- docs/schema-evolution.md:25
    from streamkit import EventInput, open_log

    log = open_log("evolution.db")
    stream = log.stream("/tasks")
    committed = await stream.append(
        EventInput(type="task.created", payload={"title": "plan", "owner": "ana"}, payload_version=2)
    )
    assert committed[0].payload_version == 2
    assert (await stream.read()).events[0].payload_version == 2
    # --- docs/schema-evolution.md:52
    from pydantic import BaseModel

    from streamkit import DROP, EventDefinition, StreamEvent, StreamProcessor
    from streamkit import define_processor_contract


    class Task(BaseModel):  # version 3 of task.created
        title: str
        priority: int
        owner: str


    def add_priority(payload: dict) -> dict:  # 1 -> 2: a required field is added
        return {**payload, "priority": 0}


    def rename_assignee(payload: dict) -> dict:  # 2 -> 3: a field is renamed
        rest = {key: value for key, value in payload.items() if key != "assignee"}
        return {**rest, "owner": payload.get("assignee", "")}


    TASK_CREATED = EventDefinition(
        description="a task was opened",
        payload_schema=Task,
        version=3,
        upcasters={1: add_priority, 2: rename_assignee},
        renamed_from=("task.opened",),
    )
    # --- docs/schema-evolution.md:94
    class TaskWithLabels(Task):  # an optional field added: still version 3
        labels: list[str] = []


    stored_before = {"title": "a", "priority": 1, "owner": "ana"}  # written before labels existed
    assert TaskWithLabels.model_validate(stored_before).labels == []
    # --- docs/schema-evolution.md:119
    class TaskEvent(BaseModel):
        pass


    class Board(BaseModel):
        titles: list[str] = []
        owners: list[str] = []


    class TaskBoard(StreamProcessor[Board]):
        contract = define_processor_contract(
            slug="task-board",
            version="1",
            state_schema=Board,
            events={
                "task.created": TASK_CREATED,
                "task.noted": EventDefinition(
                    description="retired: notes moved to another service",
                    payload_schema=TaskEvent,
                    version=2,
                    upcasters={1: lambda payload: DROP},
                ),
            },
            consumes=["task.created", "task.noted"],
        )

        def reduce(self, event: StreamEvent, state: Board) -> Board:
            task = event.payload  # always a Task: every older shape was lifted
            return Board(titles=[*state.titles, task.title], owners=[*state.owners, task.owner])
    # --- docs/schema-evolution.md:153
    from streamkit.testing import reduce_processor

    history = [
        {"type": "task.opened", "payload": {"title": "a", "assignee": "ana"}},
        {"type": "task.noted", "payload": {"text": "remember"}, "payload_version": 1},
        {
            "type": "task.created",
            "payload": {"title": "b", "priority": 2, "assignee": "bo"},
            "payload_version": 2,
        },
        {
            "type": "task.created",
            "payload": {"title": "c", "priority": 1, "owner": "cy"},
            "payload_version": 3,
        },
    ]
    assert reduce_processor(TaskBoard(), history) == Board(
        titles=["a", "b", "c"], owners=["ana", "bo", "cy"]
    )
    # --- docs/schema-evolution.md:177
    from streamkit import ProcessorEngine
    from streamkit.testing import memory_storage

    await log.stream("/board").append(*history)
    engine = ProcessorEngine(
        TaskBoard(),
        stream=log.stream("/board").for_processor("task-board"),
        storage=memory_storage(),
    )
    snapshot = await engine.snapshot()
    assert snapshot.state.titles == ["a", "b", "c"]
    assert engine.statistics().dropped_events == 1
    await engine.aclose()
    # --- docs/schema-evolution.md:216
    from streamkit import SchemaAhead

    future = {
        "type": "task.created",
        "payload": {"title": "d", "priority": 1, "owner": "di", "labels": []},
        "payload_version": 4,
    }
    (placed,) = await log.stream("/board").append(future)
    stalled = ProcessorEngine(
        TaskBoard(),
        stream=log.stream("/board").for_processor("task-board"),
        storage=memory_storage(),
    )
    stopped = None
    try:
        await stalled.catch_up_from_log()
    except SchemaAhead as exc:
        stopped = exc
    assert stopped is not None and stopped.details["offset"] == placed.offset
    assert stalled.cursor == placed.offset - 1  # everything before it is folded and checkpointed
    await stalled.aclose()
    # --- docs/schema-evolution.md:277
    from streamkit import PayloadMalformed
    from streamkit.testing import reduce_processor


    class LenientBoard(TaskBoard):
        contract = define_processor_contract(
            slug="lenient-board",
            version="1",
            state_schema=Board,
            events={"task.created": TASK_CREATED},
            on_malformed="skip",
        )


    bad = {"type": "task.created", "payload": {"title": "x", "priority": "high"}, "payload_version": 3}
    good = {"type": "task.created", "payload": {"title": "y", "priority": 1, "owner": "yo"}, "payload_version": 3}
    try:
        reduce_processor(TaskBoard(), [good, bad, good])
    except PayloadMalformed as exc:
        assert exc.details["offset"] == 2 and exc.details["type"] == "task.created"
    else:
        raise AssertionError("by default a processor never skips")

    lenient = ProcessorEngine(
        LenientBoard(),
        stream=log.stream("/lenient").for_processor("lenient-board"),
        storage=memory_storage(),
    )
    placed = await log.stream("/lenient").append(good, bad, good)
    assert (await lenient.snapshot()).state.titles == ["y", "y"]
    assert lenient.statistics().malformed_by_type == (
        {"type": "task.created", "version": 3, "count": 1, "first_offsets": [placed[1].offset]},
    )
    await lenient.aclose()
    await log.aclose()
    # --- docs/schema-evolution.md:340
    from streamkit import InvalidEvent

    door = open_log("door.db", contracts=[TaskBoard.contract])
    tasks = door.stream("/tasks")
    try:
        await tasks.append({"type": "task.created", "payload": {"title": "x", "priority": "high"}})
    except InvalidEvent as refused:
        assert refused.details["field"] == "payload"
        assert "priority" in refused.details["error"]
    else:
        raise AssertionError("a payload no reader can read is never committed")
    assert await tasks.head() == 0
    (stamped,) = await tasks.append(
        {"type": "task.created", "payload": {"title": "y", "priority": 1, "owner": "yo"}}
    )
    assert stamped.payload_version == 3
    # --- docs/schema-evolution.md:373
    rolling = open_log("rolling.db", contracts=[TaskBoard.contract], unversioned=2)
    (old_shape,) = await rolling.stream("/tasks").append(
        {"type": "task.created", "payload": {"title": "z", "priority": 1, "assignee": "zo"}}
    )
    assert old_shape.payload_version == 2  # read as version 2, lifted to 3 by the board
    await rolling.aclose()
    # --- docs/schema-evolution.md:396
    (first,) = await tasks.append(
        {"type": "task.opened", "payload": {"title": "z", "assignee": "zoe"}, "idempotency_key": "z"}
    )
    retried = await tasks.append(
        {
            "type": "task.created",
            "payload": {"title": "z", "priority": 0, "owner": "zoe"},
            "idempotency_key": "z",
        }
    )
    assert retried == [first]
    await door.aclose()
    # --- docs/schema-evolution.md:421
    from streamkit.lifting import as_read_by

    stored = StreamEvent(path="/board", offset=1, type="task.opened", payload={"title": "a", "assignee": "ana"})
    read, note = as_read_by(TaskBoard.contract, stored)
    assert (read.type, read.payload_version) == ("task.created", 3)
    assert read.payload == {"title": "a", "priority": 0, "owner": "ana"}
    assert note == {"from_type": "task.opened", "from_version": 1}
    # --- docs/schema-evolution.md:455
    from streamkit.schema_check import check_processor

    checked = open_log("deploy-check.db")
    board = checked.stream("/board")
    await board.append(
        {"type": "task.opened", "payload": {"title": "a", "assignee": "ana"}},
        {"type": "task.created", "payload": {"title": "b", "priority": "high", "owner": "bo"}, "payload_version": 3},
        {"type": "task.created", "payload": {"title": "c", "priority": 1, "owner": "cy", "due": "mon"}, "payload_version": 4},
    )
    stored = await checked.stored_types("/board")
    assert [(kind.type, kind.version, kind.count) for kind in stored] == [
        ("task.created", 3, 1),
        ("task.created", 4, 1),
        ("task.opened", 1, 1),
    ]
    result = await check_processor(TaskBoard.contract, board, stored, await board.head(), validate="all")
    outcomes = {(v.stored.type, v.stored.version): v.outcome for v in result.verdicts}
    assert outcomes == {
        ("task.created", 3): "current",
        ("task.created", 4): "ahead",  # written by newer code: this code would stall at 3
        ("task.opened", 1): "lifted",
    }
    malformed = next(v for v in result.verdicts if v.stored.version == 3)
    assert (malformed.validated, malformed.skipped, malformed.first_skipped) == (1, 1, (2,))
    assert not result.ok and len(result.problems) == 2
    await checked.aclose()


if __name__ == "__main__":
    asyncio.run(main())

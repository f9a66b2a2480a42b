"""A task board whose task.created went through three shapes and one rename (not a test module).

Shared by the upcasting suites: ``stored_at(v, ...)`` is a task.created input
as the release of payload version ``v`` wrote it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from streamkit import DROP, EventDefinition, StreamEvent, StreamProcessor, define_processor_contract
from streamkit.log import Log


class TaskV3(BaseModel):
    title: str
    priority: int
    owner: str


class Board(BaseModel):
    titles: list[str] = []


def v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "priority": 0}


def v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in payload.items() if k != "assignee"}
    return {**rest, "owner": payload.get("assignee", "")}


CREATED = EventDefinition(
    description="a task was opened",
    payload_schema=TaskV3,
    version=3,
    upcasters={2: v2_to_v3, 1: v1_to_v2},
    renamed_from=("task.opened",),
)


class Empty(BaseModel):
    pass


class Tasks(BaseModel):
    titles: list[str] = []
    owners: list[str] = []
    priorities: list[int] = []


RETIRED = EventDefinition(
    description="a type no longer read",
    payload_schema=Empty,
    version=2,
    upcasters={1: lambda p: DROP},
)


class TaskBoard(StreamProcessor[Tasks]):
    contract = define_processor_contract(
        slug="task-board",
        version="1",
        state_schema=Tasks,
        events={"task.created": CREATED, "task.retired": RETIRED},
        consumes=["task.created", "task.retired"],
    )

    def reduce(self, event: StreamEvent, state: Tasks) -> Tasks | None:
        if event.type != "task.created":
            raise AssertionError(f"a {event.type} reached the reduce")
        task = event.payload
        assert isinstance(task, TaskV3)
        assert event.payload_version == 3
        return Tasks(
            titles=[*state.titles, task.title],
            owners=[*state.owners, task.owner],
            priorities=[*state.priorities, task.priority],
        )


def strict_board(slug: str = "task-board") -> TaskBoard:
    """A :class:`TaskBoard` (as ``slug``) that stalls at a payload it cannot read."""

    class StrictBoard(TaskBoard):
        contract = define_processor_contract(
            slug=slug,
            version="1",
            state_schema=Tasks,
            events={"task.created": CREATED, "task.retired": RETIRED},
            consumes=["task.created", "task.retired"],
            on_malformed="stall",
        )

    return StrictBoard()


def stored_at(version: int, title: str, priority: int, owner: str) -> dict[str, Any]:
    """A task.created input as the release of ``version`` wrote it."""
    if version == 1:
        return {"type": "task.opened", "payload": {"title": title, "assignee": owner}}
    if version == 2:
        payload = {"title": title, "priority": priority, "assignee": owner}
        return {"type": "task.created", "payload": payload, "payload_version": 2}
    payload = {"title": title, "priority": priority, "owner": owner}
    return {"type": "task.created", "payload": payload, "payload_version": 3}


class TaskV4(TaskV3):
    due: str


CREATED_V4 = EventDefinition(
    description="a task was opened, with a due date",
    payload_schema=TaskV4,
    version=4,
    upcasters={**CREATED.upcasters, 3: lambda payload: {**payload, "due": ""}},
    renamed_from=("task.opened",),
)


class NextTaskBoard(StreamProcessor[Tasks]):
    """The next release of :class:`TaskBoard`: task.created is at version 4 (it gained ``due``)."""

    contract = define_processor_contract(
        slug="task-board",
        version="1",
        state_schema=Tasks,
        events={"task.created": CREATED_V4, "task.retired": RETIRED},
        consumes=["task.created", "task.retired"],
    )

    def reduce(self, event: StreamEvent, state: Tasks) -> Tasks | None:
        task = event.payload
        if not isinstance(task, TaskV4):
            raise AssertionError(f"a {event.type} v{event.payload_version} was not lifted")
        return Tasks(
            titles=[*state.titles, task.title],
            owners=[*state.owners, task.owner],
            priorities=[*state.priorities, task.priority],
        )


def stored_at_v4(title: str, priority: int, owner: str, due: str) -> dict[str, Any]:
    """A task.created input as the release of version 4 writes it."""
    payload = {"title": title, "priority": priority, "owner": owner, "due": due}
    return {"type": "task.created", "payload": payload, "payload_version": 4}


LOTS = {
    "type": "task.created",
    "payload": {"title": "x", "priority": "lots", "owner": "o"},
    "payload_version": 3,
}
"""A version-3 task.created no release could read (its priority is not a number)."""


async def board_log(log: Log, path: str = "/tasks") -> list[int]:
    """Every kind of stored key on ``path``, for the schema check; the appended offsets.

    task.opened v1 twice, task.created v2, v3, :data:`LOTS`, v3 again, v4, a
    retired v1 and a type no board reads.
    """
    committed = await log.stream(path).append(
        stored_at(1, "a", 0, "ana"),
        stored_at(1, "b", 0, "bo"),
        stored_at(2, "c", 1, "cy"),
        stored_at(3, "d", 2, "di"),
        LOTS,
        stored_at(3, "e", 2, "ed"),
        stored_at_v4("f", 3, "fa", "2027-01-01"),
        {"type": "task.retired", "payload": {}},
        {"type": "note", "payload": {"any": "thing"}},
    )
    return [event.offset for event in committed]

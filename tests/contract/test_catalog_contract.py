"""A log opened with contracts: producers refused at the door, retries compared across versions.

Runs over every backend (the ``log_target`` fixture). An append of a type
the contracts define must fit the current definition (stamped with its
version when it names none, lifted when it names an older one), or the
whole call is refused with nothing written; an idempotent retry that
arrives in another version than the event its key names is compared after
lifting, so a retry across a deploy returns the stored event.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from support.backends import Target
from support.upcasting import CREATED, RETIRED, TaskBoard, Tasks, stored_at

from streamkit import (
    EventDefinition,
    IdempotencyConflict,
    InvalidEvent,
    define_processor_contract,
    replayed_offsets,
)
from streamkit.backends import host_store
from streamkit.protocols import RetentionAsk


async def test_an_append_that_does_not_fit_a_known_definition_writes_nothing(
    log_target: Target,
) -> None:
    async with log_target.open(contracts=[TaskBoard.contract]) as log:
        stream = log.stream("/tasks")
        await stream.append(stored_at(3, "a", 1, "ana"))
        bad = {"type": "task.created", "payload": {"title": "x", "priority": "high", "owner": "o"}}
        with pytest.raises(InvalidEvent) as caught:
            await stream.append(stored_at(3, "b", 1, "bo"), bad)
        assert caught.value.details == {
            "index": 1,
            "field": "payload",
            "type": "task.created",
            "version": 3,
            "error": "TaskV3: priority: Input should be a valid integer, unable to parse "
            "string as an integer",
        }
        assert "nothing was appended" in caught.value.message
        assert await stream.head() == 1
        # An older version named is lifted to be judged; one that cannot be is refused.
        with pytest.raises(InvalidEvent, match=r"\(version 2\).*priority: Field required"):
            await stream.append({**stored_at(2, "c", 1, "cy"), "payload": {"title": "c"}})
        # A type no contract defines passes as it is.
        (other,) = await stream.append({"type": "note", "payload": {"any": "thing"}})
        assert other.payload_version == 1
        # Its readers drop every version-1 event of a retired type: appending one is refused.
        with pytest.raises(InvalidEvent, match="retired"):
            await stream.append({"type": "task.retired", "payload": {}, "payload_version": 1})
        assert await stream.head() == 2


async def test_versions_are_stamped_kept_or_passed_on_by_what_the_code_knows(
    log_target: Target,
) -> None:
    async with log_target.open(contracts=[TaskBoard.contract]) as log:
        stream = log.stream("/tasks")
        current = {"type": "task.created", "payload": {"title": "a", "priority": 1, "owner": "o"}}
        newer = {**current, "payload": {"anything": True}, "payload_version": 9}
        placed = await stream.append(
            current,  # no version named: the current shape, stamped 3
            stored_at(2, "b", 2, "bo"),  # named: lifted to be judged, kept at 2
            stored_at(1, "c", 0, "cy"),  # a former name, unnamed: version 1, lifted
            newer,  # newer than this code: stored as it is, for newer code to read
        )
        assert [e.payload_version for e in placed] == [3, 2, 1, 9]
        page = await stream.read()
        assert [e.payload_version for e in page.events] == [3, 2, 1, 9]
        assert page.events[0].payload == current["payload"]


class TaskV1(BaseModel):
    title: str
    assignee: str


class OldBoard(TaskBoard):
    """The board of the release before: ``task.opened`` at version 1."""

    contract = define_processor_contract(
        slug="task-board",
        version="1",
        state_schema=Tasks,
        events={
            "task.opened": EventDefinition(description="v1", payload_schema=TaskV1),
            "task.retired": RETIRED,
        },
    )


FIRST = {
    "type": "task.opened",
    "payload": {"title": "a", "assignee": "ana"},
    "idempotency_key": "order-1",
}
"""A request as the release before sent it."""

RETRY = {
    "type": "task.created",
    "payload": {"title": "a", "priority": 0, "owner": "ana"},
    "idempotency_key": "order-1",
}
"""The same request retried by the next release, in the new name and shape."""


async def test_a_retry_across_a_deploy_returns_the_event_its_first_attempt_stored(
    log_target: Target,
) -> None:
    async with log_target.open(contracts=[OldBoard.contract]) as old:
        (stored,) = await old.stream("/tasks").append(FIRST)
    assert (stored.type, stored.payload_version) == ("task.opened", 1)

    # The producer's next release retries the same request in the new shape and name.
    async with log_target.open(contracts=[TaskBoard.contract]) as new:
        stream = new.stream("/tasks")
        result = await stream.append(RETRY)
        assert result == [stored]
        assert replayed_offsets(result) == {stored.offset}
        # A different body under the key is still a conflict.
        changed = {**RETRY, "payload": {"title": "a", "priority": 5, "owner": "ana"}}
        with pytest.raises(IdempotencyConflict):
            await stream.append(changed)
        # The other way round: stored at 3, retried by a producer still on version 2.
        (kept,) = await stream.append({**stored_at(3, "b", 2, "bo"), "idempotency_key": "k2"})
        again = await stream.append({**stored_at(2, "b", 2, "bo"), "idempotency_key": "k2"})
        assert again == [kept]
        assert await stream.head() == kept.offset


async def test_an_event_must_fit_every_definition_of_its_type_here(log_target: Target) -> None:
    class Strict(BaseModel):
        title: str
        priority: int
        owner: str
        due: str

    class Other(TaskBoard):
        contract = define_processor_contract(
            slug="other-board",
            version="1",
            state_schema=Tasks,
            events={"task.created": EventDefinition(description="v1", payload_schema=Strict)},
        )

    contracts: list[Any] = [TaskBoard.contract, Other.contract]
    async with log_target.open(contracts=contracts) as log:
        stream = log.stream("/tasks")
        plain = {"title": "a", "priority": 1, "owner": "o"}
        # The two definitions disagree on the current version: the producer must say.
        with pytest.raises(InvalidEvent, match="disagree"):
            await stream.append({"type": "task.created", "payload": plain})
        with pytest.raises(InvalidEvent, match="Strict: due"):
            await stream.append({"type": "task.created", "payload": plain, "payload_version": 1})
        both = {**plain, "due": "friday"}
        (ok,) = await stream.append({"type": "task.created", "payload": both, "payload_version": 3})
        assert ok.payload_version == 3
        assert CREATED.version == 3


async def test_a_retry_across_a_deploy_of_an_archived_event_returns_it_too(
    log_target: Target, tmp_path: Any
) -> None:
    """Issue 55: once retention archived the event, the retry in the new shape was compared
    with the stored body's hash only, and refused. The archive gives the event back, and the
    retry is judged as it was while stored."""

    async with log_target.open(contracts=[OldBoard.contract]) as old:
        (stored,) = await old.stream("/tasks").append(FIRST)
        await old.stream("/tasks").append({"type": "note", "payload": {}})
        run = await host_store(old).retention.run(
            RetentionAsk("/tasks", through=stored.offset, archive=str(tmp_path / "archive"))
        )
        assert run.events == 1
    async with log_target.open(contracts=[TaskBoard.contract]) as new:
        stream = new.stream("/tasks")
        head = await stream.head()
        result = await stream.append(RETRY)
        assert [(e.offset, e.type, e.payload) for e in result] == [
            (stored.offset, "task.opened", {"title": "a", "assignee": "ana"})
        ]
        assert replayed_offsets(result) == {stored.offset}
        changed = {**RETRY, "payload": {"title": "a", "priority": 5, "owner": "ana"}}
        with pytest.raises(IdempotencyConflict):
            await stream.append(changed)
        assert await stream.head() == head  # nothing appended

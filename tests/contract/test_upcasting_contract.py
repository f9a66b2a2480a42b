"""Old events on a real log: every path an engine folds reads them alike, and a newer one stalls.

Runs over every backend (the ``log`` fixture): the stored payload version
round-trips through the backend, and the engine's catch-up, its live path,
its version re-reduce and its restart all lift old events through the one
fold. A payload newer than the code stops the engine before it, with the
events before it checkpointed and nothing after it skipped.
"""

from __future__ import annotations

from typing import Any

import pytest
from streamkit.testing import memory_storage, settle
from support.upcasting import (
    CREATED,
    RETIRED,
    TaskBoard,
    Tasks,
    TaskV3,
    stored_at,
    strict_board,
)

from streamkit import (
    EventDefinition,
    PayloadMalformed,
    ProcessorEngine,
    SchemaAhead,
    StreamEvent,
    define_processor_contract,
)
from streamkit.log import Log

MIXED = [
    stored_at(1, "a", 0, "ana"),
    stored_at(2, "b", 2, "bo"),
    {"type": "task.retired", "payload": {}},
    stored_at(3, "c", 3, "cy"),
]
EXPECTED = Tasks(titles=["a", "b", "c"], owners=["ana", "bo", "cy"], priorities=[0, 2, 3])


def engine_on(
    log: Log, processor: Any = None, storage: Any = None, **engine: Any
) -> ProcessorEngine[Any]:
    return ProcessorEngine(
        processor or TaskBoard(),
        stream=log.stream("/tasks").for_processor("task-board"),
        storage=storage or memory_storage(),
        **engine,
    )


async def test_catch_up_and_the_live_path_fold_old_events_as_current(log: Log) -> None:
    stream = log.stream("/tasks")
    await stream.append(*MIXED[:2])
    engine = engine_on(log)
    await engine.catch_up_from_log()
    await stream.append(*MIXED[2:])
    await engine.catch_up_from_log()  # the events appended after: a second range
    assert (await engine.snapshot()).state == EXPECTED
    statistics = engine.statistics()
    assert (statistics.dropped_events, statistics.malformed_payloads) == (1, 0)
    await engine.aclose()


async def test_a_version_bump_re_reduces_old_events_through_the_chain(log: Log) -> None:
    await log.stream("/tasks").append(*MIXED)
    storage = memory_storage()
    first = engine_on(log, storage=storage)
    assert (await first.snapshot()).state == EXPECTED
    await first.aclose()

    class Bumped(TaskBoard):
        contract = define_processor_contract(
            slug="task-board",
            version="2",
            state_schema=Tasks,
            events={"task.created": CREATED, "task.retired": RETIRED},
            consumes=["task.created", "task.retired"],
        )

    again = engine_on(log, Bumped(), storage)
    assert (await again.snapshot()).state == EXPECTED
    await again.aclose()


async def test_a_payload_newer_than_the_code_stalls_before_it_and_skips_nothing(
    log: Log,
) -> None:
    stream = log.stream("/tasks")
    newer = {**stored_at(3, "x", 9, "new"), "payload_version": 4}
    await stream.append(MIXED[0], MIXED[1], newer, MIXED[3])
    storage = memory_storage()
    engine = engine_on(log, storage=storage)
    with pytest.raises(SchemaAhead) as caught:
        await engine.catch_up_from_log()
    assert caught.value.details == {
        "slug": "task-board",
        "offset": 3,
        "type": "task.created",
        "stored": 4,
        "version": 3,
    }
    assert engine.cursor == 2
    assert storage.read("task-board").reduced_through_offset == 2
    statistics = engine.statistics()
    assert statistics.batch_failures == 1
    assert isinstance(statistics.last_error, SchemaAhead)
    # Still stopped there on every later try: nothing past it is folded or checkpointed.
    await stream.append(stored_at(3, "later", 1, "z"))
    with pytest.raises(SchemaAhead):
        await engine.catch_up_from_log()
    await settle()
    assert engine.cursor == 2
    assert storage.read("task-board").reduced_through_offset == 2
    await engine.aclose()

    # A restart of the same code stops at the same place; its state holds what lay before.
    restarted = engine_on(log, storage=storage)
    with pytest.raises(SchemaAhead):
        await restarted.catch_up_from_log()
    assert restarted.cursor == 2
    await restarted.aclose()


BAD = {"type": "task.created", "payload": {"title": "x", "priority": "high"}, "payload_version": 3}


async def test_malformed_payloads_are_counted_per_stored_type_and_version(log: Log) -> None:
    stream = log.stream("/tasks")
    old_bad = {"type": "task.opened", "payload": {"title": 7}}  # version 1, under its old name
    placed = await stream.append(
        MIXED[0], *[BAD] * 7, old_bad, MIXED[3], {**BAD, "payload_version": 2}
    )
    engine = engine_on(log, on_malformed="skip")  # the host's word, as in [[processors]]
    assert (await engine.snapshot()).state.titles == ["a", "c"]
    statistics = engine.statistics()
    offsets = [event.offset for event in placed]
    assert statistics.malformed_payloads == 9
    assert statistics.malformed_by_type == (
        {"type": "task.created", "version": 2, "count": 1, "first_offsets": [offsets[10]]},
        {"type": "task.created", "version": 3, "count": 7, "first_offsets": offsets[1:6]},
        {"type": "task.opened", "version": 1, "count": 1, "first_offsets": [offsets[8]]},
    )
    assert statistics.incidents["malformed_by_type"][1]["count"] == 7
    assert statistics.stopped_at is None
    await engine.aclose()


async def test_on_malformed_stall_stops_before_the_payload_and_skips_nothing(log: Log) -> None:
    stream = log.stream("/tasks")
    before, bad, after = await stream.append(MIXED[0], BAD, MIXED[3])
    storage = memory_storage()
    engine = engine_on(log, strict_board(), storage)
    with pytest.raises(PayloadMalformed) as caught:
        await engine.catch_up_from_log()
    assert caught.value.retryable
    assert caught.value.details["offset"] == bad.offset
    assert caught.value.details["version"] == 3
    assert "priority" in caught.value.details["error"]
    assert "nothing was skipped" in caught.value.message
    assert engine.cursor == before.offset
    assert storage.read("task-board").reduced_through_offset == before.offset
    statistics = engine.statistics()
    assert (statistics.malformed_payloads, statistics.malformed_by_type) == (0, ())
    assert statistics.stopped_at == bad.offset
    # Every later try stops there again: the event after it is never folded.
    with pytest.raises(PayloadMalformed):
        await engine.catch_up_from_log()
    assert engine.cursor == before.offset
    assert engine.statistics().events_reduced == 1
    await engine.aclose()
    assert after.offset > bad.offset


async def test_a_host_setting_overrides_the_contracts_on_malformed(log: Log) -> None:
    stream = log.stream("/tasks")
    await stream.append(MIXED[0], BAD, MIXED[3])
    stalls = ProcessorEngine(
        TaskBoard(),
        stream=stream.for_processor("task-board"),
        storage=memory_storage(),
        on_malformed="stall",
    )
    with pytest.raises(PayloadMalformed):
        await stalls.catch_up_from_log()
    await stalls.aclose()
    skips = ProcessorEngine(
        strict_board(),
        stream=stream.for_processor("task-board"),
        storage=memory_storage(),
        on_malformed="skip",
    )
    assert (await skips.snapshot()).state.titles == ["a", "c"]
    assert skips.statistics().malformed_payloads == 1
    await skips.aclose()


async def test_an_upcaster_that_raises_stalls_a_strict_processor(log: Log) -> None:
    def needs_level(payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "priority": int(payload["level"])}  # KeyError without it

    class Leveled(TaskBoard):
        contract = define_processor_contract(
            slug="task-board",
            version="1",
            state_schema=Tasks,
            events={
                "task.created": EventDefinition(
                    description="priority from a level",
                    payload_schema=TaskV3,
                    version=2,
                    upcasters={1: needs_level},
                )
            },
            on_malformed="stall",
        )

        def reduce(self, event: StreamEvent, state: Tasks) -> Tasks:
            return Tasks(titles=[*state.titles, event.payload.title])

    stream = log.stream("/tasks")
    created = {"type": "task.created", "payload": {"title": "a", "owner": "o", "level": "1"}}
    broken = {"type": "task.created", "payload": {"title": "b", "owner": "o"}}
    first, bad = await stream.append(created, broken)
    engine = engine_on(log, Leveled())
    with pytest.raises(PayloadMalformed) as caught:
        await engine.catch_up_from_log()
    assert caught.value.details["offset"] == bad.offset
    assert "level" in caught.value.details["error"]
    assert engine.cursor == first.offset
    await engine.aclose()

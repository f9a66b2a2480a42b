"""The tasks processor's history outlives its models: a release that adds and renames fields.

The measured case that opened the schema-evolution work: 60,000 task events
(20,000 tasks requested, started and succeeded) written with today's
shapes, folded by a later release whose ``task.attempt-started`` gained a
required field and whose ``task.succeeded`` renamed one. With the upcasters
of that release, every event folds and every task is done (as if it had
been written in the new shapes); without them, the skipped events are
counted per type and version, and a processor that stalls on malformed
payloads stops at the first one: never a silent ``succeeded: 0``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import Field
from streamkit.processors.tasks import TASKS_CONTRACT, TasksProcessor, TasksState
from streamkit.processors.tasks._events import TaskAttemptStarted, TaskSucceeded
from streamkit.testing import memory_storage, reduce_processor

from streamkit import (
    EventDefinition,
    PayloadMalformed,
    ProcessorContract,
    ProcessorEngine,
    StreamEvent,
    open_log,
)

TASKS = 20_000


class StartedV2(TaskAttemptStarted):
    """The next release: every attempt names the worker that ran it (a required field)."""

    worker: str = Field(min_length=1)


class SucceededV2(TaskSucceeded):
    """The next release: ``result`` is called ``output`` (``result`` stays, always None, so the
    class the reduce dispatches on is unchanged)."""

    output: Any = None


def _renamed_result(payload: dict[str, Any]) -> dict[str, Any]:
    rest = {key: value for key, value in payload.items() if key != "result"}
    return {**rest, "output": payload.get("result")}


def next_release(*, upcasters: bool, on_malformed: str = "skip") -> Any:
    """Today's tasks processor, with the next release's two changed definitions."""
    events = dict(TASKS_CONTRACT.events or {})
    events["task.attempt-started"] = EventDefinition(
        description="an attempt started",
        payload_schema=StartedV2,
        version=2,
        upcasters={1: lambda p: {**p, "worker": "before-workers"}} if upcasters else {},
    )
    events["task.succeeded"] = EventDefinition(
        description="the task succeeded",
        payload_schema=SucceededV2,
        version=2,
        upcasters={1: _renamed_result} if upcasters else {},
    )
    contract: ProcessorContract[TasksState] = ProcessorContract(
        slug=TASKS_CONTRACT.slug,
        version=TASKS_CONTRACT.version,
        description=TASKS_CONTRACT.description,
        initial=TasksState,
        state_schema=TasksState,
        events=events,
        processor_deps=TASKS_CONTRACT.processor_deps,
        consumes=TASKS_CONTRACT.consumes,
        emits=TASKS_CONTRACT.emits,
        compact_state=True,
        on_malformed=on_malformed,  # type: ignore[arg-type]
    )

    class NextTasks(TasksProcessor):
        outputs: ClassVar[list[Any]] = []

        def reduce(self, event: StreamEvent, state: TasksState) -> TasksState | None:
            if isinstance(event.payload, SucceededV2):
                self.outputs.append(event.payload.output)
            return super().reduce(event, state)

    NextTasks.contract = contract
    return NextTasks()


def history(*, shape: int) -> list[dict[str, Any]]:
    """20,000 tasks, each requested, started and succeeded, in the shapes of release ``shape``."""
    events: list[dict[str, Any]] = []
    for n in range(TASKS):
        request = 3 * n + 1
        run = {"task_id": f"t{n}", "request_offset": request, "attempt": 1}
        started: dict[str, Any] = {**run, "started_at": 1_000.0 + n}
        succeeded: dict[str, Any] = {**run, "result": {"n": n}}
        if shape == 2:
            started = {**started, "worker": "before-workers"}
            succeeded = {**run, "output": {"n": n}}
        events += [
            {"type": "task.requested", "payload": {"task_id": f"t{n}", "name": "job"}},
            {"type": "task.attempt-started", "payload": started, "payload_version": shape},
            {"type": "task.succeeded", "payload": succeeded, "payload_version": shape},
        ]
    return events


def test_sixty_thousand_events_of_today_fold_under_the_next_release() -> None:
    today = history(shape=1)
    assert len(today) == 60_000
    processor = next_release(upcasters=True)
    lifted = reduce_processor(processor, today)
    assert processor.outputs[:2] == [{"n": 0}, {"n": 1}]  # what was `result`, renamed
    assert lifted.counts.succeeded == TASKS
    assert lifted.counts.attempts == TASKS
    assert len(lifted.tasks) == 0  # every task is done, none looks owed again
    # The same state as the same history written in the new shapes.
    assert lifted == reduce_processor(next_release(upcasters=True), history(shape=2))
    # And as today's processor folds today's history.
    assert lifted == reduce_processor(TasksProcessor(), today)


async def test_without_the_upcasters_the_skips_are_counted_per_type_and_version(
    tmp_path: Any,
) -> None:
    today = history(shape=1)[:3_000]
    async with open_log(tmp_path / "tasks.db") as log:
        placed = await log.stream("/").append(*today)
        engine = ProcessorEngine(
            next_release(upcasters=False),
            stream=log.stream("/").for_processor("tasks"),
            storage=memory_storage(),
        )
        await engine.catch_up_from_log()
        statistics = engine.statistics()
        await engine.aclose()
    assert statistics.malformed_payloads == 2_000
    assert statistics.malformed_by_type == (
        {
            "type": "task.attempt-started",
            "version": 1,
            "count": 1_000,
            "first_offsets": [placed[i].offset for i in (1, 4, 7, 10, 13)],
        },
        {
            "type": "task.succeeded",
            "version": 1,
            "count": 1_000,
            "first_offsets": [placed[i].offset for i in (2, 5, 8, 11, 14)],
        },
    )
    with pytest.raises(PayloadMalformed) as caught:
        reduce_processor(next_release(upcasters=False, on_malformed="stall"), today)
    assert caught.value.details["offset"] == 2
    assert caught.value.details["type"] == "task.attempt-started"

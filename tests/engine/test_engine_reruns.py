"""An effect that runs again after a failed batch meets its first run's event: that event stands."""

from __future__ import annotations

import time

import pytest
from pydantic import BaseModel
from streamkit.testing import memory_storage, memory_stream, settle

from streamkit import (
    IdempotencyConflict,
    ProcessorEngine,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
)
from streamkit.processor import ProcessEventArgs


class Seen(BaseModel):
    count: int = 0


class Stamper(StreamProcessor[Seen]):
    """For each ``job``: append ``stamped`` with a clock reading (not deterministic), keyed per job.

    The first batch fails after the append (``fail_first``), so the effect runs again.
    """

    contract = define_processor_contract(
        slug="stamper",
        version="1",
        description="stamps jobs",
        state_schema=Seen,
        consumes=["job"],
        emits=["stamped"],
    )

    def __init__(self, *, key: str | None = None) -> None:
        self.failures_left = 1
        self.key = key
        self.appended: list[list[StreamEvent]] = []

    def reduce(self, event: StreamEvent, state: Seen) -> Seen | None:
        return Seen(count=state.count + 1)

    def process_event(self, args: ProcessEventArgs[Seen]) -> None:
        event = args.event
        if event is None:
            return
        key = self.key or self.idempotency_key("stamped", event)

        async def stamp() -> None:
            self.appended.append(
                await args.append(
                    {"type": "stamped", "payload": {"at": time.time_ns()}, "idempotency_key": key}
                )
            )

        async def then_fail_once() -> None:
            if self.failures_left:
                self.failures_left -= 1
                raise RuntimeError("the batch fails after its effect, as a crash would")

        args.block_processor_while(stamp)
        args.block_processor_while(then_fail_once)


async def test_a_rerun_effect_with_another_body_returns_the_first_runs_event() -> None:
    """The retried batch's append (a new timestamp) returns the event the first run wrote."""
    memory = memory_stream()
    processor = Stamper()
    engine = ProcessorEngine(processor, stream=memory.stream, storage=memory_storage())
    await memory.stream.append({"type": "job"})
    with pytest.raises(RuntimeError):
        await engine.catch_up_from_log()
    await engine.catch_up_from_log()  # the retry: no IDEMPOTENCY_CONFLICT wedge
    stamped = [e for e in memory.events if e.type == "stamped"]
    assert len(stamped) == 1
    first, again = processor.appended
    assert first[0].offset == again[0].offset == stamped[0].offset
    assert again[0].payload == first[0].payload
    assert (await engine.snapshot()).state == Seen(count=1)
    await settle()


async def test_a_conflict_with_another_processors_event_is_still_refused() -> None:
    """A key that names an event this processor did not write for this event stays a conflict."""
    memory = memory_stream()
    await memory.stream.append(
        {"type": "stamped", "payload": {"at": 0}, "idempotency_key": "shared-key"}
    )
    processor = Stamper(key="shared-key")
    processor.failures_left = 0
    engine = ProcessorEngine(processor, stream=memory.stream, storage=memory_storage())
    await memory.stream.append({"type": "job"})
    with pytest.raises(IdempotencyConflict):
        await engine.catch_up_from_log()
    assert [e.payload for e in memory.events if e.type == "stamped"] == [{"at": 0}]

"""A processor's status summary: what status shows beside its row, from the reduced state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from pydantic import BaseModel
from streamkit.testing import memory_storage, memory_stream, settle

from streamkit import ProcessorEngine, StreamEvent, StreamProcessor, define_processor_contract


class Count(BaseModel):
    n: int = 0


class Counter(StreamProcessor[Count]):
    contract = define_processor_contract(
        slug="counter", version="1", state_schema=Count, consumes=["tick"]
    )

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def reduce(self, event: StreamEvent, state: Count) -> Count | None:
        return Count(n=state.n + 1)

    def status_summary(self, state: Count) -> Mapping[str, Any] | None:
        if self.fail:
            raise RuntimeError("the summary broke")
        return {"ticks": state.n}


class Plain(Counter):
    def status_summary(self, state: Count) -> Mapping[str, Any] | None:
        return super(Counter, self).status_summary(state)


async def test_the_summary_is_the_processors_view_of_the_state_now() -> None:
    memory = memory_stream()
    engine = ProcessorEngine(Counter(), stream=memory.stream, storage=memory_storage())
    assert engine.status_summary() is None  # nothing loaded yet
    memory.engines.append(engine)
    await memory.stream.append({"type": "tick"}, {"type": "tick"})
    await settle()
    assert engine.status_summary() == {"ticks": 2}
    plain = ProcessorEngine(Plain(), stream=memory.stream, storage=memory_storage())
    await plain.catch_up_from_log()
    assert plain.status_summary() is None  # the default: none


async def test_a_summary_that_raises_is_reported_and_shown_as_missing() -> None:
    memory = memory_stream()
    engine = ProcessorEngine(Counter(fail=True), stream=memory.stream, storage=memory_storage())
    await memory.stream.append({"type": "tick"})
    await engine.catch_up_from_log()
    with structlog.testing.capture_logs() as logs:
        assert engine.status_summary() is None
    (entry,) = [e for e in logs if e["event"] == "processor.status_summary_failed"]
    assert entry["slug"] == "counter"
    assert engine.statistics().events_reduced == 1  # the processor itself goes on

"""Property: any schedule of appends, dropped pushes and restarts reduces like the pure fold.

Run twice: as the engine writes a small state (every batch), and with every
state's write deferred for a few events (``deferring``), so restarts after a
crash replay the events since the state's offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from streamkit.testing import ManualClock, memory_storage, memory_stream, reduce_processor
from support.engine import SkippingRecorder, Tally, item, note, ping

from streamkit import ProcessorEngine, ScannedRange, StreamEvent
from streamkit.engine import _checkpointer

DURABLE = st.sampled_from(
    [item(1), item(2), item(5), {"type": "item.added", "payload": {"n": "bad"}}, note()]
)
STEP = st.one_of(
    st.tuples(st.just("durable"), st.lists(DURABLE, min_size=1, max_size=4)),
    # A catch-up queued before an append reads it too, so the append's push arrives stale.
    st.tuples(st.just("race"), st.lists(DURABLE, min_size=1, max_size=4)),
    st.tuples(st.just("ephemeral"), st.sampled_from([ping(), {"type": "x", "ephemeral": True}])),
    st.tuples(st.just("drop"), st.booleans()),
    st.tuples(st.just("restart"), st.none()),
    # A host that died: no clean close, so a deferred state stays deferred.
    st.tuples(st.just("crash"), st.none()),
    st.tuples(st.just("yield"), st.none()),
    st.tuples(st.just("catch_up"), st.none()),
)


class Tracked:
    """Forwards pushes to one engine and keeps their tasks, so a restart can let them finish."""

    def __init__(self, engine: ProcessorEngine[Any]) -> None:
        self.engine = engine
        self.tasks: list[asyncio.Task[None]] = []

    def process_event_batch(
        self, events: Sequence[StreamEvent], range: ScannedRange
    ) -> Awaitable[None]:
        task = self.engine.process_event_batch(events, range)
        self.tasks.append(task)
        return task

    async def finish(self) -> None:
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.engine.aclose()


class Witness(SkippingRecorder):
    """Records the (offset, type) of every delivery of this incarnation."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, str]] = []
        self.on_event = lambda args: (
            self.seen.append(  # type: ignore[assignment]
                (args.event.offset, args.event.type)
            )
            if args.event is not None
            else None
        )


@contextmanager
def deferring() -> Iterator[None]:
    """Every state's write waits for a few events (a Tally of 25-60 bytes: 4 to 10)."""
    with (
        mock.patch.object(_checkpointer, "DEFER_STATE_FROM", 0),
        mock.patch.object(_checkpointer, "BYTES_PER_DEFERRED_EVENT", 6),
    ):
        yield


async def run_schedule(steps: list[tuple[str, Any]]) -> None:
    stream = memory_stream()
    with memory_storage() as storage:
        clock = ManualClock()
        incarnations: list[Witness] = []

        def start() -> Tracked:
            witness = Witness()
            incarnations.append(witness)
            target = Tracked(ProcessorEngine(witness, stream=stream, storage=storage, clock=clock))
            stream.engines.append(target)
            return target

        current = start()
        for kind, arg in steps:
            if kind == "durable":
                await stream.append(*arg)
            elif kind == "race":
                catching_up = current.engine.catch_up_from_log()
                await stream.append(*arg)
                await catching_up
            elif kind == "ephemeral":
                await stream.append(arg)
            elif kind == "drop":
                stream.drop_pushes = arg
            elif kind == "restart":
                stream.engines.remove(current)
                await current.finish()
                current = start()
            elif kind == "crash":
                stream.engines.remove(current)
                await asyncio.gather(*current.tasks, return_exceptions=True)
                current = start()
            elif kind == "yield":
                await asyncio.sleep(0)
            else:
                await current.engine.catch_up_from_log()
        stream.drop_pushes = False
        await asyncio.gather(*current.tasks)
        await current.engine.catch_up_from_log()
        snapshot = await current.engine.snapshot()
        await current.finish()

        # The final state is the pure fold of the durable log.
        assert snapshot.state == reduce_processor(SkippingRecorder(), stream.events)
        assert snapshot.offset >= stream.head
        # The checkpoint's state is the fold of the durable prefix it claims to cover.
        checkpoint = storage.read("recorder")
        if checkpoint is not None:
            prefix = [e for e in stream.events if e.offset <= checkpoint.state_through_offset]
            stored = (
                Tally()
                if checkpoint.state_json is None
                else Tally.model_validate_json(checkpoint.state_json)
            )
            assert stored == reduce_processor(SkippingRecorder(), prefix)
        # Within one incarnation no durable event is delivered twice or out of order.
        for witness in incarnations:
            durable = [offset for offset, etype in witness.seen if etype != "ping"]
            assert durable == sorted(set(durable))


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(STEP, max_size=25))
# Schedules worth pinning: a gap healed by the next push, a stale push after a racing
# catch-up, and a restart over pushes that were lost.
@example([("drop", True), ("durable", [item(1)]), ("drop", False), ("durable", [item(2)])])
@example([("durable", [item(1)]), ("race", [item(2), note()]), ("durable", [item(5)])])
@example(
    [
        ("drop", True),
        ("durable", [item(1)]),
        ("restart", None),
        ("drop", False),
        ("ephemeral", ping()),
    ]
)
def test_any_schedule_reduces_each_durable_event_like_the_pure_fold(
    steps: list[tuple[str, Any]],
) -> None:
    """Appends, ephemerals, dropped pushes and restarts end in reduce_processor's state."""
    asyncio.run(run_schedule(steps))


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(STEP, max_size=25))
@example(
    [
        ("durable", [item(1)]),
        ("durable", [item(2)]),
        ("crash", None),
        ("durable", [item(5)]),
        ("crash", None),
    ]
)
def test_any_schedule_with_deferred_states_reduces_like_the_pure_fold(
    steps: list[tuple[str, Any]],
) -> None:
    """With state writes deferred, crashes replay the events since the state's offset, exactly."""
    with deferring():
        asyncio.run(run_schedule(steps))

"""A large state's checkpoint write waits for later batches; a restart replays the events between.

The engines here publish no live state, so the log's offsets are the events' alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel, Field
from streamkit.testing import settle
from support.engine import Rig

from streamkit import (
    EventDefinition,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
)
from streamkit.engine._checkpointer import BYTES_PER_DEFERRED_EVENT, DEFER_STATE_FROM
from streamkit.processor import ProcessEventArgs

PAD = "x" * (DEFER_STATE_FROM + 1000)
BUDGET = (len(PAD) + 100) // BYTES_PER_DEFERRED_EVENT  # events a deferred write waits for, about


class Added(BaseModel):
    n: int


class Empty(BaseModel):
    pass


class Ledger(BaseModel):
    pad: str = ""
    total: int = 0
    pings: int = 0
    offsets: list[int] = Field(default_factory=list)


class Big(StreamProcessor[Ledger]):
    """A state past DEFER_STATE_FROM once padded; records every delivery."""

    contract = define_processor_contract(
        slug="big",
        version="1",
        state_schema=Ledger,
        events={
            "padded": EventDefinition(description="makes the state large", payload_schema=Empty),
            "added": EventDefinition(description="adds n", payload_schema=Added),
            "pinged": EventDefinition(
                description="a live poke", payload_schema=Empty, ephemeral=True
            ),
        },
        consumes=["padded", "added", "pinged"],
    )

    def __init__(self) -> None:
        self.delivered: list[int] = []

    def reduce(self, event: StreamEvent, state: Ledger) -> Ledger:
        if event.type == "padded":
            return state.model_copy(update={"pad": PAD})
        if event.type == "pinged":
            return state.model_copy(update={"pings": state.pings + 1})
        payload = event.payload
        assert isinstance(payload, Added)
        return state.model_copy(
            update={"total": state.total + payload.n, "offsets": [*state.offsets, event.offset]}
        )

    def process_event(self, args: ProcessEventArgs[Ledger]) -> None:
        if args.event is not None:
            self.delivered.append(args.event.offset)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    made = Rig()
    yield made
    await made.close()


async def padded(rig: Rig, processor: Big) -> None:
    """The engine's first batch: the state grows past the threshold and is written whole."""
    rig.engine(processor, publish_live=False)
    await rig.stream.append({"type": "padded"})
    await settle()
    stored = rig.checkpoint("big")
    assert (stored.reduced_through_offset, stored.state_offset) == (1, None)


async def add(rig: Rig, count: int, start: int = 1) -> None:
    for n in range(start, start + count):
        await rig.stream.append({"type": "added", "payload": {"n": n}})
        await settle()


async def test_a_large_state_is_not_rewritten_every_batch(rig: Rig) -> None:
    """Each batch moves the cursor; the large state stays as written, its own offset behind."""
    await padded(rig, Big())
    await add(rig, 10)
    stored = rig.checkpoint("big")
    assert stored.reduced_through_offset == 11
    assert stored.state_offset == 1  # the state written with the padding, not since
    assert '"total":0' in stored.state_json


async def test_a_small_state_is_written_every_batch(rig: Rig) -> None:
    """Below the threshold every batch writes its state: the row is always current."""
    rig.engine(Big(), publish_live=False)
    await add(rig, 5)
    stored = rig.checkpoint("big")
    assert (stored.reduced_through_offset, stored.state_offset) == (5, None)
    assert '"total":15' in stored.state_json


async def test_a_deferred_state_is_written_once_enough_events_were_reduced(rig: Rig) -> None:
    """After about one event per BYTES_PER_DEFERRED_EVENT bytes of state, the state is written."""
    await padded(rig, Big())
    await add(rig, BUDGET + 5)
    stored = rig.checkpoint("big")
    assert stored.reduced_through_offset == BUDGET + 6
    assert stored.state_offset is None or stored.state_offset > 1
    assert '"total":0' not in stored.state_json


async def test_a_restart_replays_the_deferred_events_and_runs_no_effects(rig: Rig) -> None:
    """A new engine reduces the events after the state's offset again, delivering none of them."""
    first = Big()
    await padded(rig, first)
    await add(rig, 10)
    assert rig.checkpoint("big").state_offset == 1
    engine = rig.built[-1]
    before = (await engine.snapshot()).state
    rig.stream.engines.remove(engine)  # a crash: no clean close, the state stays deferred

    second = Big()
    restarted = rig.engine(second, publish_live=False)
    snapshot = await restarted.snapshot()
    assert snapshot.offset == 11
    assert snapshot.state == before
    assert snapshot.state.offsets == list(range(2, 12))
    assert second.delivered == []
    await rig.stream.append({"type": "added", "payload": {"n": 100}})
    await settle()
    assert second.delivered == [12]
    assert (await restarted.snapshot()).state.total == sum(range(1, 11)) + 100


async def test_a_batch_that_reduced_an_ephemeral_writes_the_state(rig: Rig) -> None:
    """An ephemeral cannot be replayed from the log, so the state it changed is written."""
    await padded(rig, Big())
    await add(rig, 3)
    assert rig.checkpoint("big").state_offset == 1
    await rig.stream.append({"type": "pinged", "ephemeral": True})
    await settle()
    await add(rig, 1, start=50)
    stored = rig.checkpoint("big")
    assert stored.state_offset is None
    assert '"pings":1' in stored.state_json


async def test_an_ephemeral_then_a_restart_keeps_what_it_reduced(rig: Rig) -> None:
    """The ephemeral's change survives a crash after the next durable batch."""
    await padded(rig, Big())
    await rig.stream.append({"type": "pinged", "ephemeral": True})
    await settle()
    await add(rig, 2)
    engine = rig.built[-1]
    rig.stream.engines.remove(engine)
    restarted = rig.engine(Big(), publish_live=False)
    assert (await restarted.snapshot()).state.pings == 1


async def test_a_clean_close_writes_the_deferred_state(rig: Rig) -> None:
    """Closing an engine writes the state it deferred: the next start replays nothing."""
    await padded(rig, Big())
    await add(rig, 4)
    engine = rig.built[-1]
    assert rig.checkpoint("big").state_offset == 1
    await engine.aclose()
    stored = rig.checkpoint("big")
    assert (stored.reduced_through_offset, stored.state_offset) == (5, None)
    assert '"total":10' in stored.state_json


async def test_a_version_bump_rereduce_writes_the_state_at_the_old_cursor(rig: Rig) -> None:
    """A re-reduce for a new version writes its state whole, whatever the old row deferred."""
    await padded(rig, Big())
    await add(rig, 4)
    engine = rig.built[-1]
    rig.stream.engines.remove(engine)

    class Bumped(Big):
        contract = define_processor_contract(
            slug="big",
            version="2",
            state_schema=Ledger,
            events=Big.contract.events,
            consumes=["padded", "added", "pinged"],
        )

    restarted = rig.engine(Bumped(), publish_live=False)
    assert (await restarted.snapshot()).state.total == 10
    stored = rig.checkpoint("big")
    assert (stored.reducer_version, stored.reduced_through_offset, stored.state_offset) == (
        "2",
        5,
        None,
    )

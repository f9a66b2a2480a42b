"""A lease this host stopped trusting for a moment: an effect refused then is never lost.

A host trusts its lease for a ttl of its own monotonic time after the last
renewal. When the process is starved (a frozen or overloaded machine, a
keeper thread that did not get the GIL), that trust lapses and every fenced
write is refused locally with ``LeaseLost``; the keeper's next renewal, if
no one took the lease meanwhile, restores it. An effect appended in that
window did not land, while the batch's checkpoint, written a moment later,
passes the fence again. The checkpoint must not pass the lost effect: the
batch fails, the cursor stays, and the engine built under the lease next
runs the effect.

This was found by the SIGSTOP cutover drill on PostgreSQL in CI (77 items
without an effect): these tests make the same window happen on purpose, on
every backend, with the host's own lease, stream and checkpoint parts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel
from support.backends import BACKENDS, Target

from streamkit import LeaseLost, ProcessorEngine, StreamEvent, StreamProcessor
from streamkit import define_processor_contract as contract_of
from streamkit.backends import host_store
from streamkit.host._engine_stream import EngineStream
from streamkit.host._lease_keeper import HeldLease
from streamkit.log import Log
from streamkit.processor import ProcessEventArgs
from streamkit.protocols import LeaseAsk

TTL = 30.0


class Count(BaseModel):
    items: int = 0


class Lapsing(StreamProcessor[Count]):
    """One keyed ``effect`` per ``item``, not awaited; the last one's write meets a lapsed trust.

    Delivering the item at ``lapse_at`` starts its append (trusted: the
    engine's guard lets it start), then the host's monotonic clock moves past
    its trust in the lease before the append's transaction runs its fence,
    and the keeper's renewal lands once that append was refused: a process
    starved between starting a write and committing it, and its keeper's late
    renewal.
    """

    contract = contract_of(
        slug="lapsing",
        version="1",
        description="one effect per item",
        state_schema=Count,
        consumes=["item"],
        emits=["effect"],
    )

    def __init__(self, held: HeldLease, clock: list[float], lapse_at: int) -> None:
        self.held = held
        self.clock = clock
        self.lapse_at = lapse_at

    def reduce(self, event: StreamEvent, state: Count) -> Count | None:
        return Count(items=state.items + 1)

    def process_event(self, args: ProcessEventArgs[Count]) -> None:
        event = args.event
        if event is None:
            return
        effect = args.append(
            {
                "type": "effect",
                "payload": {"source": event.offset},
                "idempotency_key": self.idempotency_key("effect", event),
            }
        )
        if event.offset == self.lapse_at:
            self.lapse_at = 0
            held, clock = self.held, self.clock
            clock[0] = held.trusted_until + 1.0  # starved past the ttl
            # No one took the lease meanwhile: the renewal succeeds.
            effect.add_done_callback(lambda _: held.renewed(held.lease, clock[0]))


@pytest.fixture(params=sorted(BACKENDS))
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    made = BACKENDS[request.param].fresh()
    try:
        yield made
    finally:
        made.remove()


async def _held(log: Log, clock: list[float]) -> HeldLease:
    store = host_store(log)
    await store.prepare()
    lease = await store.try_acquire(LeaseAsk("/", "lapsing", "host-a", time.time(), TTL))
    assert lease is not None
    return HeldLease(
        lease,
        store.check_fence,
        ttl=TTL,
        renewal_started=clock[0],
        clock=time.time,
        monotonic=lambda: clock[0],
    )


def _engine(log: Log, processor: Lapsing) -> ProcessorEngine[Count]:
    held = processor.held
    stream = EngineStream(log.stream("/").for_processor("lapsing"), held, set(), _no_claim)
    return ProcessorEngine(
        processor,
        stream=stream,
        storage=host_store(log).checkpoints(held, "/", None),
        guard=held.check,
    )


def _no_claim(at: float | None) -> None:
    pass


async def _effects(log: Log) -> list[Any]:
    page = await log.stream("/").read(0, 100)
    return [e.payload["source"] for e in page.events if e.type == "effect"]


async def test_an_effect_refused_while_trust_lapsed_fails_its_batch_and_runs_again(
    target: Target,
) -> None:
    async with target.open() as log:
        await log.stream("/").append(*({"type": "item", "payload": {}} for _ in range(3)))
        clock = [1000.0]
        processor = Lapsing(await _held(log, clock), clock, lapse_at=3)
        engine = _engine(log, processor)
        with pytest.raises(LeaseLost, match="last renewed more than its ttl"):
            await engine.catch_up_from_log()
        assert engine.cursor == 0
        stored = await host_store(log).checkpoints(processor.held, "/", None).load("lapsing")
        assert stored is None  # nothing checkpointed past the lost effect
        assert 3 not in await _effects(log)
        # The host builds the next engine under the lease (trusted again): it runs them all.
        retry = _engine(log, processor)
        await retry.catch_up_from_log()
        await asyncio.sleep(0)
        assert retry.cursor == 3
        assert sorted(await _effects(log)) == [1, 2, 3]

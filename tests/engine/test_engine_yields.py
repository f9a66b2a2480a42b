"""A batch never holds the event loop for long: a slow reduce or blocker lets the host run.

A catch-up page grows to 4,000 events; folded in one go with a reduce that
costs 10 ms, it would hold the loop for 40 s, and the host's status,
/healthz and every other processor with it. The fold and the delivery loop
yield between slices of about ``SLICE_SECONDS``. These tests count the turns
another task gets while one batch runs (behaviour, not timing: the bound
itself is measured in docs/host.md).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel
from support.engine import Rig

from streamkit import ProcessEventArgs, StreamEvent, StreamProcessor, define_processor_contract


class Count(BaseModel):
    n: int = 0


def burn(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:  # no await: the loop is held meanwhile
        pass


class SlowReduce(StreamProcessor[Count]):
    contract = define_processor_contract(
        slug="slow", version="1", state_schema=Count, consumes=["work"]
    )

    def reduce(self, event: StreamEvent, state: Count) -> Count | None:
        burn(0.005)
        return Count(n=state.n + 1)


class SlowEffects(SlowReduce):
    def process_event(self, args: ProcessEventArgs[Count]) -> None:
        if args.event is not None:
            args.block_processor_while(_burn_and_return)


async def _burn_and_return() -> None:
    burn(0.005)  # never awaits anything: a blocker that does not yield


async def turns_during(work: Any) -> int:
    """How many times another task ran while ``work`` (a coroutine) was awaited."""
    turns = 0
    running = True

    async def ticker() -> None:
        nonlocal turns
        while running:
            await asyncio.sleep(0)
            turns += 1

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    start = turns
    try:
        await work
    finally:
        running = False
        await tick
    return turns - start


async def test_a_page_of_slow_reduces_yields_to_the_loop(rig: Rig) -> None:
    """200 reduces of 5 ms (1 s) in one catch-up page: the loop turns many times meanwhile."""
    rig.stream.drop_pushes = True
    await rig.stream.append(*({"type": "work"} for _ in range(200)))
    engine = rig.engine(SlowReduce(), pushed=False)
    turns = await turns_during(engine.catch_up_from_log())
    assert engine.cursor == 200
    assert turns >= 10, turns


async def test_a_page_of_blockers_that_never_wait_yields_to_the_loop(rig: Rig) -> None:
    """200 deliveries whose reduce and blocker each hold the loop 5 ms: the loop still turns."""
    rig.stream.drop_pushes = True
    await rig.stream.append(*({"type": "work"} for _ in range(200)))
    engine = rig.engine(SlowEffects(), pushed=False)
    turns = await turns_during(engine.catch_up_from_log())
    assert engine.cursor == 200
    assert turns >= 10, turns

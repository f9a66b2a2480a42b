"""How many events' effects a crash, a stop or a hand-off can make a processor run again.

A checkpoint records which events' effects ran. A processor with effects
checkpoints every ``EFFECTS_PER_CHECKPOINT`` events of a catch-up page, so a
crash re-runs at most that many; a stop or a hand-off (``yield_catch_up``)
ends the page at the event in flight, checkpointed, so it re-runs none.
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.engine import Recorder, Rig, item

from streamkit.engine._batch import EFFECTS_PER_CHECKPOINT
from streamkit.processor import ProcessEventArgs


def gated_at(offset: int, reached: asyncio.Event, gate: asyncio.Event) -> Any:
    """A hook whose blocker at ``offset`` waits for ``gate`` (and says it got there)."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None and args.event.offset == offset:

            async def hold() -> None:
                reached.set()
                await gate.wait()

            args.block_processor_while(hold)

    return on_event


async def backlog(rig: Rig, count: int) -> None:
    rig.stream.drop_pushes = True
    await rig.stream.append(*(item(1) for _ in range(count)))


async def test_a_long_page_with_effects_is_checkpointed_every_hundred_events(rig: Rig) -> None:
    """Mid-page (event 250 of a page of 500), the checkpoint already covers 200."""
    await backlog(rig, 500)
    reached, gate = asyncio.Event(), asyncio.Event()
    processor = Recorder(gated_at(250, reached, gate))
    engine = rig.engine(processor, pushed=False)
    catch_up = engine.catch_up_from_log()
    await asyncio.wait_for(reached.wait(), 10)
    # A crash now would re-run the effects of events 201 to 250, no more.
    assert rig.checkpoint().reduced_through_offset == 2 * EFFECTS_PER_CHECKPOINT
    assert engine.cursor == 200
    gate.set()
    await catch_up
    assert rig.checkpoint().reduced_through_offset == engine.cursor == 500
    assert processor.delivered == list(range(1, 501))


async def test_a_yield_ends_the_page_at_the_event_in_flight_checkpointed(rig: Rig) -> None:
    """A stop or hand-off mid-page: the batch ends after event 250, checkpointed through it."""
    await backlog(rig, 500)
    reached, gate = asyncio.Event(), asyncio.Event()
    processor = Recorder(gated_at(250, reached, gate))
    engine = rig.engine(processor, pushed=False)
    catch_up = engine.catch_up_from_log()
    await asyncio.wait_for(reached.wait(), 10)
    engine.yield_catch_up()
    gate.set()
    await catch_up
    assert processor.delivered == list(range(1, 251))
    assert rig.checkpoint().reduced_through_offset == engine.cursor == 250
    # The next holder starts after it: no event's effects run twice.
    rig.stream.engines.clear()
    after = Recorder()
    nxt = rig.engine(after, pushed=False)
    await nxt.catch_up_from_log()
    assert after.delivered == list(range(251, 501))

"""Serving work first: a rebuild in the shadow gives way to the host's serving processors.

The parts on their own: :class:`~streamkit.host._foreground.Foreground`
(a rebuild waits while a serving range is in hand, never longer than its
share allows, and counts what it waited) and
:class:`~streamkit.engine._turns.Turns` (reads and fold slices sized to
short turns). Then a real host: a processor that serves beside a rebuild
of 40,000 events sees an event appended mid-rebuild long before the rebuild
ends; before the rebuild gave way, a SQLite rebuild held the loop from its
first page to its last, and the event waited for all of it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from streamkit import (
    ProcessEventArgs,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
    open_log,
)
from streamkit.config import HostConfig
from streamkit.engine import _turns
from streamkit.engine._turns import LEAST, Turns
from streamkit.host import ProcessorHost
from streamkit.host._foreground import Foreground


async def test_a_rebuild_does_not_wait_while_nothing_serves() -> None:
    foreground = Foreground(0.25)
    assert await foreground.give_way(1.0) == 0.0
    assert foreground.statistics().waits == 0


async def test_a_rebuild_waits_for_a_serving_range_to_end() -> None:
    foreground = Foreground(0.25)
    ended = asyncio.Event()

    async def serve() -> None:
        with foreground.serving():
            assert foreground.busy()
            await asyncio.sleep(0.05)
            ended.set()

    serving = asyncio.ensure_future(serve())
    await asyncio.sleep(0)  # the range is in hand
    # A page of 10 s at a quarter share could wait 30 s; the range ends long before.
    waited = await foreground.give_way(10.0)
    assert ended.is_set()
    assert not foreground.busy()
    assert 0 < waited < 10.0
    await serving
    stats = foreground.statistics()
    assert (stats.waits, stats.waited_seconds) == (1, waited)


async def test_a_rebuild_waits_no_longer_than_its_share_allows() -> None:
    """Serving work that never ends does not starve the rebuild: it gets its share and goes on."""
    foreground = Foreground(0.5)
    with foreground.serving():
        waited = await foreground.give_way(0.02)  # owes at most 0.02 * (1 - 0.5) / 0.5
        assert foreground.busy()  # it went on while the range was still in hand
    assert waited >= 0.02 * 0.9
    assert foreground.statistics().waits == 1


async def test_at_a_full_share_a_rebuild_never_waits() -> None:
    foreground = Foreground(1.0)
    with foreground.serving():
        assert await foreground.give_way(5.0) == 0.0
    assert foreground.statistics().waits == 0


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_0_to_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="share"):
        Foreground(share)


def test_the_config_refuses_a_share_outside_0_to_1() -> None:
    with pytest.raises(ValueError, match="rebuild_share"):
        HostConfig.model_validate({"db": "x.db", "rebuild_share": 0})
    assert HostConfig.model_validate({"db": "x.db", "rebuild_share": 1}).rebuild_share == 1


def test_reads_are_sized_to_what_they_hold_the_loop_for() -> None:
    turns = Turns(most=4000)
    assert turns.read_events() == _turns.FIRST_READ
    # 100 events held the loop for 3 ms: a turn of 0.3 ms fits 10.
    turns.read(100, held=0.003, took=0.003)
    assert turns.read_events() == 10
    # Cheap reads grow, but never more than twice the last at once.
    turns.read(10, held=0.000001, took=0.000001)
    assert turns.read_events() == 20
    for _ in range(20):
        turns.read(turns.read_events(), held=0.0, took=0.0)
    assert turns.read_events() == 4000  # up to the most a page takes


def test_a_read_that_waits_on_the_network_is_sized_to_its_whole_time() -> None:
    """A read on another thread holds the loop little but the interpreter long: both bound it."""
    turns = Turns(most=4000)
    turns.read(100, held=0.00001, took=0.002)  # 2 ms in all for 100 events
    assert turns.read_events() == int(_turns.READ_SECONDS * 100 / 0.002)


def test_fold_slices_are_sized_to_a_turn_and_never_below_the_least() -> None:
    turns = Turns(most=4000)
    assert turns.slice_events() == _turns.FIRST_SLICE
    turns.folded(100, 0.0003)
    assert turns.slice_events() == 100
    turns.folded(100, 1.0)  # a very slow reduce
    assert turns.slice_events() == LEAST
    turns.folded(100, 0.0)
    assert turns.slice_events() == 4000


async def test_turns_count_what_the_host_made_them_wait() -> None:
    asked: list[float] = []

    async def give_way(took: float) -> float:
        asked.append(took)
        return 0.25

    turns = Turns(give_way, most=100)
    await turns.turn()
    await turns.turn()
    assert len(asked) == 2
    assert all(took >= 0 for took in asked)
    assert turns.waited == 0.5


class Count(BaseModel):
    n: int = 0


def burn(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:  # holds the loop, as a real reduce's work does
        pass


class Slow(StreamProcessor[Count]):
    """A reduce of about 25 µs an event, which the rebuild of version 2 runs 40,000 times."""

    reduced = 0

    def __init__(self, version: str) -> None:
        self.contract = define_processor_contract(
            slug="slow", version=version, state_schema=Count, consumes=["tick"]
        )

    def reduce(self, event: StreamEvent, state: Count) -> Count:
        if self.contract.version == "2":
            Slow.reduced += 1
            burn(0.000025)
        return Count(n=state.n + 1)


class Seen(StreamProcessor[Count]):
    """Serving beside the rebuild: notes how far the rebuild had come when each probe arrived."""

    contract = define_processor_contract(
        slug="seen", version="1", state_schema=Count, consumes=["probe"]
    )

    def __init__(self) -> None:
        self.rebuilt_at: dict[int, int] = {}

    def process_event(self, args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            self.rebuilt_at[args.event.offset] = Slow.reduced

    def reduce(self, event: StreamEvent, state: Count) -> Count:
        return Count(n=state.n + 1)


async def test_a_processor_serving_beside_a_rebuild_is_not_held_until_it_ends(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    ticks = 40_000
    async with open_log(db) as log:
        stream = log.stream("/")
        for _ in range(ticks // 5000):
            await stream.append(*({"type": "tick"} for _ in range(5000)))
    first = ProcessorHost(HostConfig(db=db), processors=[Slow("1")], serve_control=False)
    await first.start()
    await first.wait_until_processed("slow", ticks, timeout=60)
    await first.stop()

    Slow.reduced = 0
    seen = Seen()
    host = ProcessorHost(HostConfig(db=db), processors=[seen, Slow("2")], serve_control=False)
    await host.start()
    try:
        deadline = time.monotonic() + 60
        while Slow.reduced < 2000:  # the rebuild is under way (this loop is the host's loop)
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        async with open_log(db) as log:
            (probe,) = await log.stream("/").append({"type": "probe"})
        await host.wait_until_processed("seen", probe.offset, timeout=60)
        # Seen while the rebuild had most of its work ahead; held, it would have seen all 40,000.
        assert seen.rebuilt_at[probe.offset] < ticks // 2
        shadow = (await host.status())["processors"]
        rebuilding = next(p for p in shadow if p["slug"] == "slow")
        assert rebuilding["phase"] == "rebuilding"
    finally:
        await host.stop()

"""Clients first: while clients append, a host paces its processors' ranges (``processor_share``).

The pacer's arithmetic runs on a fake clock (:class:`~streamkit.host._pacer.Pacer`);
the host test runs a real host whose processor's ranges take measurable time
and checks the pause each range earns before the next one starts, and that
the events which arrived meanwhile were taken as one range. The window in
which clients count as appending is widened so no outcome depends on how
fast this machine runs.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from support.host import Offsets, Tally

from streamkit import ProcessEventArgs, StreamEvent
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
from streamkit.host import _runner as runner_module
from streamkit.host._pacer import MAX_PAUSE_SECONDS, Pacer
from streamkit.log import _grouping as log_module


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _pacer(share: float, clients: list[bool]) -> tuple[Pacer, _Clock]:
    clock = _Clock()
    return Pacer(share, lambda: clients[0], clock=clock, sleep=clock.sleep), clock


async def test_a_range_earns_a_pause_in_proportion_to_the_share() -> None:
    pacer, clock = _pacer(0.2, [True])
    await pacer.turn()
    assert clock.slept == []  # nothing ran yet
    pacer.ran(0.010)
    await pacer.turn()
    assert clock.slept == [pytest.approx(0.040)]  # 10 ms of work, 80/20: 40 ms of pause
    await pacer.turn()
    assert len(clock.slept) == 1  # the pause is had once


async def test_ranges_of_several_runners_queue_their_pauses() -> None:
    pacer, clock = _pacer(0.5, [True])
    pacer.ran(0.010)
    pacer.ran(0.020)  # another runner's range, ended at the same moment
    await pacer.turn()
    assert clock.slept == [pytest.approx(0.030)]


async def test_no_pause_while_no_client_appends_nor_at_a_share_of_one() -> None:
    clients = [False]
    pacer, clock = _pacer(0.2, clients)
    pacer.ran(0.010)
    await pacer.turn()
    assert clock.slept == []
    whole, whole_clock = _pacer(1.0, [True])
    whole.ran(5.0)
    await whole.turn()
    assert whole_clock.slept == []


def test_pacing_is_on_only_while_clients_append_at_a_share_below_one() -> None:
    """What processors are told (args.yield_to_clients): clients append and ranges are paced."""
    clients = [False]
    pacer, _ = _pacer(0.2, clients)
    assert not pacer.pacing()
    clients[0] = True
    assert pacer.pacing()
    whole, _ = _pacer(1.0, [True])
    assert not whole.pacing()


async def test_a_host_tells_its_processors_to_yield_while_clients_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """args.yield_to_clients() is True in a host while a client appends, False once they stop."""
    monkeypatch.setattr(log_module, "CLIENT_ACTIVE_SECONDS", 60.0)
    seen: list[ProcessEventArgs[Any]] = []

    class Asking(Tally):
        def process_event(self, args: ProcessEventArgs[Any]) -> None:
            seen.append(args)

    config = HostConfig.model_validate({"db": str(tmp_path / "y.db"), "shutdown_grace": 1.0})
    host = ProcessorHost(config, processors=[Asking()], serve_control=False)
    await host.start()
    try:
        await host.append("/", [{"type": "item", "payload": {"n": 1}}])
        await host.wait_until_processed("tally", 1, timeout=10)
        assert seen[-1].yield_to_clients()  # a client appended within the window
        monkeypatch.setattr(log_module, "CLIENT_ACTIVE_SECONDS", 0.0)
        assert not seen[-1].yield_to_clients()  # asked again later: no client within it
    finally:
        await host.stop(grace=1.0)


async def test_one_pause_is_bounded() -> None:
    pacer, clock = _pacer(0.01, [True])
    pacer.ran(10.0)
    await pacer.turn()
    assert clock.slept == [pytest.approx(MAX_PAUSE_SECONDS)]


def test_a_pacer_refuses_a_share_outside_zero_to_one() -> None:
    # (streamkit.toml refuses it first, by name: tests/core/test_config.py)
    for share in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="share must be in"):
            Pacer(share, lambda: True)


class _Slow(Tally):
    """Takes 20 ms per event: its pause outlasts several appends even on a loaded machine."""

    def reduce(self, event: StreamEvent, state: Offsets) -> Offsets | None:
        time.sleep(0.02)
        return super().reduce(event, state)


async def test_while_clients_append_a_host_pauses_between_ranges_and_takes_bigger_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "CLIENT_ACTIVE_SECONDS", 60.0)
    ranges: list[tuple[float, float, int]] = []
    until_done = runner_module.ProcessorRunner._until_done

    async def timed(self: runner_module.ProcessorRunner, item: Any) -> None:
        started = time.monotonic()
        await until_done(self, item)
        if isinstance(item, tuple):  # a range of a push (not a revive)
            ranges.append((started, time.monotonic(), len(item[0])))

    monkeypatch.setattr(runner_module.ProcessorRunner, "_until_done", timed)
    config = HostConfig.model_validate(
        {"db": str(tmp_path / "p.db"), "processor_share": 0.5, "shutdown_grace": 1.0}
    )
    host = ProcessorHost(config, processors=[_Slow()], serve_control=False)
    await host.start()
    try:
        for n in range(40):
            await host.append("/", [{"type": "item", "payload": {"n": n}}])
            await asyncio.sleep(0.001)
        await host.wait_until_processed("tally", 40, timeout=30)
    finally:
        await host.stop(grace=1.0)
    # (the first event may be caught up before the first push)
    assert sum(count for _, _, count in ranges) >= 39
    assert len(ranges) < 39  # events that arrived during a pause were taken together
    assert max(count for _, _, count in ranges) > 1
    for (start, end, _), (next_start, _, _) in itertools.pairwise(ranges):
        # At a share of 0.5 a range earns a pause as long as itself (up to the bound).
        assert next_start - end >= min(end - start, MAX_PAUSE_SECONDS) * 0.999

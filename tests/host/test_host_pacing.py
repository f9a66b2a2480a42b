"""Clients first: a host pauses its processors' ranges only while clients contend (``processor_share``).

The pacer's arithmetic runs on a fake clock (:class:`~streamkit.host._pacer.Pacer`).
The host tests run a real host: one floods it with concurrent client appends
and checks that its ranges were paused and taken together; the others pin the
property that once broke (a client that appends and then waits until its event
is processed is never held back on its own behalf), with pauses made so long
that a single one would time the client out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from support.host import Offsets, Tally
from support.postgres import dropped_after, fresh_schema_name, postgres_url

from streamkit import ProcessEventArgs, StreamEvent
from streamkit.config import HostConfig
from streamkit.engine import _waiters
from streamkit.host import ProcessorHost
from streamkit.host import _pacer as pacer_module
from streamkit.host import _runner as runner_module
from streamkit.host._pacer import MAX_PAUSE_SECONDS, PAUSE_CHECK_SECONDS, Pacer
from streamkit.log import _grouping


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class _Clients:
    """The log's side of the pacer: whether an append is in flight, and the hand-overs so far.

    While ``busy[0]``, each look the pacer takes finds one more hand-over (a
    steady stream of clients' appends); once not, nothing moves.
    """

    def __init__(self, busy: list[bool]) -> None:
        self.busy = busy
        self.handed = 0

    def clients_contend(self) -> bool:
        return self.busy[0]

    @property
    def client_handovers(self) -> int:
        if self.busy[0]:
            self.handed += 1
        return self.handed


def _pacer(share: float, clients: list[bool]) -> tuple[Pacer, _Clock]:
    clock = _Clock()
    return Pacer(share, _Clients(clients), clock=clock, sleep=clock.sleep), clock


def _nobody() -> bool:
    return False


async def test_a_range_earns_a_pause_in_proportion_to_the_share() -> None:
    """10 ms of work at a share of 0.2 earns 40 ms of pause, had once, and counted."""
    pacer, clock = _pacer(0.2, [True])
    await pacer.turn(awaited=_nobody)
    assert clock.slept == []  # nothing ran yet
    pacer.ran(0.010)
    await pacer.turn(awaited=_nobody)
    assert sum(clock.slept) == pytest.approx(0.040)
    assert max(clock.slept) == pytest.approx(PAUSE_CHECK_SECONDS)  # looked at on the way
    looks = len(clock.slept)
    await pacer.turn(awaited=_nobody)
    assert len(clock.slept) == looks  # the pause is had once
    stats = pacer.statistics()
    assert (stats.pauses, stats.paused_seconds) == (1, pytest.approx(0.040))


async def test_ranges_run_without_a_pause_build_up_no_debt() -> None:
    """The pause owed is the longest a recent range earned, never the sum of many."""
    pacer, clock = _pacer(0.5, [True])
    for _ in range(10):
        pacer.ran(0.010)  # ten ranges back to back, nobody pausing them
    pacer.ran(0.020)
    await pacer.turn(awaited=_nobody)
    assert sum(clock.slept) == pytest.approx(0.020)


async def test_no_pause_while_no_client_contends_nor_at_a_share_of_one() -> None:
    clients = [False]
    pacer, clock = _pacer(0.2, clients)
    pacer.ran(0.010)
    await pacer.turn(awaited=_nobody)
    assert clock.slept == []
    assert pacer.statistics().pauses == 0
    whole, whole_clock = _pacer(1.0, [True])
    whole.ran(5.0)
    await whole.turn(awaited=_nobody)
    assert whole_clock.slept == []


async def test_no_pause_while_a_caller_waits_for_the_processor() -> None:
    """A client waiting *for* the processor is served first: no pause, though clients contend."""
    pacer, clock = _pacer(0.2, [True])
    pacer.ran(0.010)
    await pacer.turn(awaited=lambda: True)
    assert clock.slept == []
    # One that starts to wait during the loop turn the pacer gives first: no pause either.
    asked: list[bool] = []

    def awaited() -> bool:
        asked.append(True)
        return len(asked) > 1

    await pacer.turn(awaited=awaited)
    assert clock.slept == []
    assert pacer.statistics().pauses == 0


async def test_a_pause_ends_when_a_caller_starts_to_wait() -> None:
    """The pause waits on ``wait_awaited``, which returns when a caller begins to wait."""
    pacer, clock = _pacer(0.2, [True])
    pacer.ran(0.010)
    waiting: list[float] = []

    async def wait_awaited(seconds: float) -> None:
        waiting.append(seconds)  # a caller arrives at once: no time passes

    await pacer.turn(awaited=lambda: bool(waiting), wait_awaited=wait_awaited)
    assert waiting == [pytest.approx(PAUSE_CHECK_SECONDS)]
    assert clock.slept == []
    assert pacer.statistics().paused_seconds == 0.0


def test_pacing_is_on_only_while_clients_contend_at_a_share_below_one() -> None:
    """What processors are told (args.yield_to_clients): clients contend and ranges are paced."""
    clients = [False]
    pacer, _ = _pacer(0.2, clients)
    assert not pacer.pacing()
    clients[0] = True
    assert pacer.pacing()
    whole, _ = _pacer(1.0, [True])
    assert not whole.pacing()


async def test_one_pause_is_bounded() -> None:
    pacer, clock = _pacer(0.01, [True])
    pacer.ran(10.0)
    await pacer.turn(awaited=_nobody)
    assert sum(clock.slept) == pytest.approx(MAX_PAUSE_SECONDS)


async def test_a_pause_ends_once_the_clients_go_quiet() -> None:
    """A pause is for clients that contend: the first look that finds them quiet ends it."""
    busy = [True]
    pacer, clock = _pacer(0.01, busy)
    pacer.ran(1.0)  # earns the longest pause

    async def sleep(seconds: float) -> None:
        await clock.sleep(seconds)
        if len(clock.slept) == 3:
            busy[0] = False  # the clients stop appending during the third look

    pacer._sleep = sleep
    await pacer.turn(awaited=_nobody)
    assert len(clock.slept) == 3  # the look after they went quiet ended it
    assert sum(clock.slept) == pytest.approx(3 * PAUSE_CHECK_SECONDS)
    assert pacer.statistics().pauses == 1


def test_a_pacer_refuses_a_share_outside_zero_to_one() -> None:
    # (streamkit.toml refuses it first, by name: tests/core/test_config.py)
    for share in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="share must be in"):
            Pacer(share, _Clients([True]))


class _Slow(Tally):
    """Takes 5 ms per event: the clients' appends come in while it works."""

    def reduce(self, event: StreamEvent, state: Offsets) -> Offsets | None:
        time.sleep(0.005)
        return super().reduce(event, state)


async def test_while_clients_flood_a_host_its_ranges_are_paused_and_taken_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixteen clients appending at once keep commits in flight: ranges pause and grow."""
    ranges: list[int] = []
    until_done = runner_module.ProcessorRunner._until_done

    async def counted(self: runner_module.ProcessorRunner, item: Any) -> None:
        await until_done(self, item)
        if isinstance(item, tuple):  # a range of a push (not a revive)
            ranges.append(len(item[0]))

    monkeypatch.setattr(runner_module.ProcessorRunner, "_until_done", counted)
    config = HostConfig.model_validate(
        {"db": str(tmp_path / "p.db"), "processor_share": 0.5, "shutdown_grace": 1.0}
    )
    host = ProcessorHost(config, processors=[_Slow()], serve_control=False)
    await host.start()
    try:

        async def client(k: int) -> None:
            for n in range(20):
                await host.append("/", [{"type": "item", "payload": {"n": n, "k": k}}])

        await asyncio.gather(*(client(k) for k in range(16)))
        await host.wait_until_processed("tally", 320, timeout=60)
        first = (await host.status())["host"]["clients_first"]
    finally:
        await host.stop(grace=1.0)
    assert first["pauses"] > 0
    assert first["paused_seconds"] > 0
    assert sum(ranges) >= 300  # (the first events may be caught up before the first push)
    assert len(ranges) < sum(ranges) / 2  # the events that came during pauses went together


class _Asking(Tally):
    """Records each event's args and what ``yield_to_clients()`` said while it was processed.

    (Not the at-head pass's: at start it may run while the test's first append is in flight.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[ProcessEventArgs[Any]] = []
        self.asked: list[bool] = []

    def process_event(self, args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            self.seen.append(args)
            self.asked.append(args.yield_to_clients())


async def test_a_host_tells_its_processors_to_yield_only_while_clients_contend(
    tmp_path: Path,
) -> None:
    """args.yield_to_clients(): False once a client's append landed; True while one is in flight.

    Asked *while* the event is processed, the answer depends on the loop: an
    append made while other work was ready goes to the writer's thread, and
    the processor may take its push before the client heard back (its
    append is then in flight, so True is right). Once it landed, no.
    """
    asking = _Asking()
    config = HostConfig.model_validate({"db": str(tmp_path / "y.db"), "shutdown_grace": 1.0})
    host = ProcessorHost(config, processors=[asking], serve_control=False)
    await host.start()
    try:
        await host.append("/", [{"type": "item", "payload": {"n": 1}}])
        await host.wait_until_processed("tally", 1, timeout=10)
        assert not asking.seen[-1].yield_to_clients()  # the client waits for the processor
        assert host.log is not None
        # A client's append in flight: made while this coroutine's wake-up is ready on the
        # loop, it is grouped at the end of the turn instead of committed at once.
        in_flight = asyncio.ensure_future(host.log.stream("/").append({"type": "item"}))
        await asyncio.sleep(0)
        assert not in_flight.done()
        assert asking.seen[-1].yield_to_clients()
        await in_flight
        assert not asking.seen[-1].yield_to_clients()  # asked again once it landed
    finally:
        await host.stop(grace=1.0)


# -- the property that broke: a client waiting for the processor is never held back ---------


def _endless_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any pause would outlast the client's wait: one pause may last an hour, one hold a minute,
    and a waiter never reads the log itself (it relies on the runner's push alone)."""
    monkeypatch.setattr(pacer_module, "MAX_PAUSE_SECONDS", 3600.0)
    monkeypatch.setattr(_grouping, "HOLD_SECONDS", 60.0)
    monkeypatch.setattr(_waiters, "PUSH_GRACE", 3600.0)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_client_that_appends_then_waits_is_never_held_back_on_its_behalf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Append, then wait until processed, 20 times: no pause or hold ever delays the client.

    The processors' share is 0.00001 and a pause may last an hour, so a
    single pause (a range of 0.1 ms earns 10 s) or hold (a minute) applied in
    this flow would time a wait out. On SQLite none
    is even begun; on PostgreSQL, whose follower may hear of a commit before
    its append is settled, a pause may begin but ends when the client starts
    to wait.
    """
    _endless_pauses(monkeypatch)
    if backend == "postgres":
        url, schema = postgres_url(), fresh_schema_name()
        db = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    else:
        url, schema, db = "", "", str(tmp_path / "w.db")
    config = HostConfig.model_validate(
        {"db": db, "processor_share": 0.00001, "shutdown_grace": 1.0}
    )
    host = ProcessorHost(config, processors=[Tally()], serve_control=False)
    with dropped_after(url, schema) if backend == "postgres" else contextlib.nullcontext():
        await host.start()
        try:
            for n in range(20):
                (event,) = await host.append("/", [{"type": "item", "payload": {"n": n}}])
                await host.wait_until_processed("tally", event.offset, timeout=10)
            first = (await host.status())["host"]["clients_first"]
        finally:
            await host.stop(grace=1.0)
    assert first["held_writes"] == 0
    if backend == "sqlite":
        assert first["pauses"] == 0

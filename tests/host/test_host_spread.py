"""Several hosts on one log share its processors: placement, joining, leaving, clean hand-offs.

The placement rule is tested alone (``assign``), then with real hosts over
every backend: each takes about its share, a host that joins gets some, a
host that leaves has its processors taken over, and across every move each
processor reduces every event exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.backends import Target
from support.host import Offsets
from support.waits import until

from streamkit import StreamEvent, StreamProcessor, define_processor_contract, open_log
from streamkit.backends import host_store
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
from streamkit.host._spread import assign, key_of

SLUGS = ("t1", "t2", "t3", "t4")


def test_every_processor_goes_to_one_host_and_shares_are_even() -> None:
    """Four processors over two hosts: two each; over three: two, one, one."""
    keys = [key_of(s, "/") for s in SLUGS]
    two = assign({"a": keys, "b": keys}, {})
    assert sorted(two) == sorted(keys)
    assert sorted([list(two.values()).count(h) for h in "ab"]) == [2, 2]
    three = assign({"a": keys, "b": keys, "c": keys}, {})
    assert sorted([list(three.values()).count(h) for h in "abc"]) == [1, 1, 2]


def test_a_placement_is_sticky_and_the_same_for_every_host() -> None:
    """Holders within their share keep what they hold; the input order changes nothing."""
    keys = [key_of(s, "/") for s in SLUGS]
    held = dict.fromkeys(keys, "a")  # a ran everything alone; b joins
    placed = assign({"a": keys, "b": keys}, held)
    assert [placed[k] for k in keys] == ["a", "a", "b", "b"]
    # Two hosts with two each, a third joins: one of them gives it one, nothing else moves.
    held = {keys[0]: "a", keys[1]: "a", keys[2]: "b", keys[3]: "b"}
    joined = assign({"a": keys, "b": keys, "c": keys}, held)
    assert sorted([list(joined.values()).count(h) for h in "abc"]) == [1, 1, 2]
    assert sum(joined[k] != held[k] for k in keys) == 1
    assert assign({"b": keys, "a": keys}, dict(reversed(held.items()))) == placed
    # One processor, two hosts: it stays where it runs, nothing moves.
    assert assign({"a": keys[:1], "b": keys[:1]}, {keys[0]: "b"}) == {keys[0]: "b"}
    # A holder that is not alive counts for nothing.
    assert set(assign({"b": keys}, held).values()) == {"b"}


def test_a_processor_goes_only_to_a_host_that_runs_it() -> None:
    """A host configured with fewer processors is given only those."""
    keys = [key_of(s, "/") for s in SLUGS]
    placed = assign({"a": keys, "b": keys[:1]}, {})
    assert {k for k, h in placed.items() if h == "b"} <= {keys[0]}
    assert assign({}, {}) == {}


def tallies() -> list[StreamProcessor[Any]]:
    """Four processors with slugs of their own, each recording the offsets it reduces."""
    made: list[StreamProcessor[Any]] = []
    for slug in SLUGS:

        class Counted(StreamProcessor[Offsets]):
            contract = define_processor_contract(
                slug=slug,
                version="1",
                description="records reduced item offsets",
                state_schema=Offsets,
                consumes=["item"],
                emits=[],
            )

            def reduce(self, event: StreamEvent, state: Offsets) -> Offsets | None:
                return state.model_copy(update={"offsets": [*state.offsets, event.offset]})

        made.append(Counted())
    return made


@pytest.fixture
async def hosts(target: Target) -> AsyncIterator[list[ProcessorHost]]:
    started: list[ProcessorHost] = []
    try:
        yield started
    finally:
        for host in started:
            await host.stop(grace=0.0)


async def start_host(target: Target, hosts: list[ProcessorHost], name: str) -> ProcessorHost:
    config = HostConfig.model_validate(
        {
            "db": target.target,
            "lease": {"ttl": 1.0, "heartbeat": 0.1},
            "shutdown_grace": 1.0,
        }
    )
    host = ProcessorHost(config, processors=tallies(), serve_control=False, owner=name)
    hosts.append(host)
    await host.start()
    return host


def running(host: ProcessorHost) -> set[str]:
    return {r.slug for r in host.runners if r.engine is not None}


async def append_items(target: Target, count: int) -> list[int]:
    async with target.open() as log:
        done = await log.stream("/").append(*({"type": "item"} for _ in range(count)))
    return [e.offset for e in done]


async def reduced(target: Target, slug: str) -> list[int]:
    async with open_log(target.target) as log:
        offsets: list[int] = (await host_store(log).stored_snapshot(slug))["state"]["offsets"]
    return offsets


async def test_hosts_share_the_work_and_hand_it_over_cleanly(
    target: Target, hosts: list[ProcessorHost]
) -> None:
    """Two hosts split four processors; a third joins and gets one; one leaves, the rest take
    its share; through every move each processor reduces every item exactly once."""
    a = await start_host(target, hosts, "host-a")
    await until(lambda: running(a) == set(SLUGS))  # alone, it runs everything
    first = await append_items(target, 30)
    b = await start_host(target, hosts, "host-b")
    await until(lambda: len(running(a)) == 2 and len(running(b)) == 2)
    assert running(a) | running(b) == set(SLUGS)
    second = await append_items(target, 30)
    c = await start_host(target, hosts, "host-c")
    await until(lambda: sorted(len(running(h)) for h in (a, b, c)) == [1, 1, 2])
    assert running(a) | running(b) | running(c) == set(SLUGS)
    third = await append_items(target, 30)
    await a.stop()
    await until(lambda: sorted(len(running(h)) for h in (b, c)) == [2, 2])
    fourth = await append_items(target, 30)
    everything = first + second + third + fourth
    for host in (b, c):
        for runner in host.runners:
            if runner.engine is not None:
                await host.wait_until_processed(runner.slug, everything[-1], timeout=30)
    for slug in SLUGS:
        assert await reduced(target, slug) == everything, slug


async def test_a_rolling_deploy_hands_a_processor_to_the_host_that_reads_the_new_version(
    target: Target,
) -> None:
    """The old code stalls before a version it does not know and stops offering the processor;
    the host with newer code takes it from the checkpoint: every event reduced once, none skipped."""
    from support.upcasting import NextTaskBoard, TaskBoard, stored_at, stored_at_v4

    config = HostConfig.model_validate(
        {
            "db": target.target,
            "lease": {"ttl": 1.0, "heartbeat": 0.1},
            "retry": {"initial_delay": 0.01, "max_delay": 0.05, "stall_after": 2},
            "shutdown_grace": 1.0,
        }
    )
    old = ProcessorHost(config, processors=[TaskBoard()], serve_control=False, owner="old")
    new = ProcessorHost(config, processors=[NextTaskBoard()], serve_control=False, owner="new")
    try:
        await old.start()
        async with open_log(target.target) as log:
            stream = log.stream("/")
            before = await stream.append(stored_at(1, "a", 0, "ana"), stored_at(3, "b", 2, "bo"))
            await old.wait_until_processed("task-board", before[-1].offset)
            await new.start()
            assert new.runner("task-board").engine is None  # the old host keeps it
            after = await stream.append(
                stored_at_v4("c", 1, "cy", "mon"), stored_at(3, "d", 1, "di")
            )
        await wait_until(lambda: new.runner("task-board").engine is not None, 15.0)
        await new.wait_until_processed("task-board", after[-1].offset)
        snapshot = await new.snapshot("task-board")
        assert snapshot["state"]["titles"] == ["a", "b", "c", "d"]
        (row,) = (await old.status())["processors"]
        assert row["ahead_of_code"]["offset"] == after[0].offset
        assert row["ahead_of_code"]["stored"] == 4
        assert row["lease_held_here"] is False
        (moved,) = (await new.status())["processors"]
        assert (moved["malformed_payloads"], moved["stopped_at"]) == (0, None)
    finally:
        await new.stop(grace=0.0)
        await old.stop(grace=0.0)


async def wait_until(predicate: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)

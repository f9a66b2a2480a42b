"""Following a stream: history then live pushes, contiguous ranges, exactly-once durables."""

from __future__ import annotations

import asyncio
import gc
import random
from pathlib import Path

import pytest
from support.log import check_contiguous, collect_until, durable, durables, next_push, tick

from streamkit import ScannedRange, StreamEvent, open_log
from streamkit.backends.sqlite import _writer as writer_internals
from streamkit.log import Log
from streamkit.log import _follow as follow_internals


async def test_other_connections_commits_are_picked_up(log_file: Path) -> None:
    """Commits by another log on the same file (another process's) reach a follower by polling."""
    async with open_log(log_file) as ours, open_log(log_file) as theirs:
        it = ours.stream("/x").follow()
        await theirs.stream("/x").append(durable(1), durable(2))
        await theirs.stream("/x").append(tick(), durable(3))  # their ephemeral stays theirs
        (mine,) = await ours.stream("/x").append(durable(4))
        assert mine.offset > 4  # above the rest of their ephemeral block: a hole
        pushes = await collect_until(it, mine.offset)
        check_contiguous(pushes, 0)
        assert durables(pushes) == [1, 2, 4, mine.offset]
        assert not any(e.ephemeral for p in pushes for e in p[0])


async def test_a_quiet_log_is_looked_at_less_often_and_still_hears_other_commits(
    log_file: Path,
) -> None:
    """Half a second without events: the follow poll slows from 2 ms to 50 ms; nothing is missed."""
    async with open_log(log_file) as ours, open_log(log_file) as theirs:
        it = ours.stream("/q").follow()
        await asyncio.sleep(writer_internals.POLL_QUIET_SECONDS + 0.2)
        ages = []
        for _ in range(100):
            ages.append(ours.follow_age() or 0.0)
            await asyncio.sleep(0.003)
        # 2 ms polling never lets the last look grow past a few ms; 50 ms polling does.
        assert max(ages) > 0.02, max(ages)
        await theirs.stream("/q").append(durable(1))
        pushes = await collect_until(it, 1)
        assert durables(pushes) == [1]


async def test_mixed_writers_give_contiguous_exactly_once_delivery(log_file: Path) -> None:
    """Random appends from two logs and late followers: ranges stay contiguous, durables come once."""
    rng = random.Random(7)
    async with (
        open_log(log_file, synchronous="NORMAL") as ours,
        open_log(log_file, synchronous="NORMAL") as theirs,
    ):
        followers = [ours.stream().follow()]
        starts = [0]
        for step in range(120):
            writer = ours if rng.random() < 0.6 else theirs
            batch = [
                tick(step) if rng.random() < 0.3 else durable(step)
                for _ in range(rng.randint(1, 4))
            ]
            await writer.stream().append(*batch)
            if step in (30, 70):
                start = rng.randint(0, await ours.stream().head())
                followers.append(ours.stream().follow(start))
                starts.append(start)
        head = await ours.stream().head()
        truth = [e.offset for e in (await ours.stream().read(0, 10_000)).events]
        for it, start in zip(followers, starts, strict=True):
            pushes = await collect_until(it, head)
            check_contiguous(pushes, start)
            assert durables(pushes) == [o for o in truth if o > start]


async def test_a_slow_follower_resyncs_from_the_log(
    log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower whose buffer overflows is re-fed from the log: every durable event, once, in order."""
    monkeypatch.setattr(follow_internals, "MAX_BUFFERED_PUSHES", 4)
    async with open_log(log_file, synchronous="NORMAL") as log:
        stream = log.stream()
        it = stream.follow()
        for n in range(30):
            await stream.append(durable(n), tick(n))
        overflowed = [s.overflows for subs in log._feed._subs.values() for s in subs]
        assert overflowed
        assert overflowed[0] > 0
        pushes = await collect_until(it, 59)
        check_contiguous(pushes, 0)
        assert durables(pushes) == list(range(1, 60, 2))
        # Later pushes arrive live again.
        (e,) = await stream.append(durable(99))
        events, _ = await next_push(it)
        assert events == [e]


async def test_closing_the_log_ends_every_follower(log_file: Path) -> None:
    """Closing the log ends pending and later iterations with StopAsyncIteration."""
    log = open_log(log_file)
    stream = log.stream()
    await stream.append(durable(1))
    seen: list[int] = []
    started = asyncio.Event()

    async def consume() -> None:
        async for events, _ in stream.follow():
            seen.extend(e.offset for e in events)
            started.set()

    task = asyncio.create_task(consume())
    waiting = stream.follow(1)
    pending = asyncio.create_task(anext(waiting))
    await asyncio.wait_for(started.wait(), 10)
    await log.aclose()
    await asyncio.wait_for(task, 10)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 10)
    assert seen == [1]


async def test_breaking_out_unregisters(log: Log) -> None:
    """Leaving an async for (or aclose) removes the subscription."""
    stream = log.stream()
    await stream.append(durable(1))
    async for _events, _range in stream.follow():
        break
    gc.collect()
    assert not log._feed.has_subscribers()
    it = stream.follow()
    assert log._feed.has_subscribers()
    await it.aclose()  # type: ignore[attr-defined]
    assert not log._feed.has_subscribers()
    with pytest.raises(StopAsyncIteration):
        await anext(it)


async def test_an_in_memory_log_follows_too() -> None:
    """An in-memory log's followers get history and live pushes."""
    async with open_log(":memory:") as log:
        stream = log.stream()
        await stream.append(durable(1))
        it = stream.follow()
        assert (await next_push(it))[1] == ScannedRange(0, 1)
        await stream.append(tick(), durable(2))
        events, scanned = await next_push(it)
        assert ([e.offset for e in events], scanned) == ([2, 3], ScannedRange(1, 3))


async def test_at_head_tells_a_backlog_page_from_its_end(log_file: Path) -> None:
    """A catch-up page short of the head is not at the head; the last page and a lone push are."""
    async with open_log(log_file) as log:
        stream = log.stream()
        await stream.append(*(durable(n) for n in range(follow_internals.PAGE_LIMIT + 5)))
        it = stream.follow()
        _, scanned = await next_push(it)
        assert scanned.through == follow_internals.PAGE_LIMIT
        assert not it.at_head
        _, scanned = await next_push(it)
        assert scanned.through == follow_internals.PAGE_LIMIT + 5
        assert it.at_head
        await stream.append(durable(1))
        await next_push(it)
        assert it.at_head
        await it.aclose()


async def test_at_head_is_false_while_pushes_wait_behind(log: Log) -> None:
    """A push with another one buffered after it is not the head; the last of them is."""
    stream = log.stream()
    it = stream.follow()
    await log.write_transaction(lambda conn: None)  # the follower's start is published
    await stream.append(durable(1))
    await stream.append(durable(2))
    await stream.append(durable(3))
    heads: list[bool] = []
    pushes: list[tuple[list[StreamEvent], ScannedRange]] = []
    while not pushes or pushes[-1][1].through < 3:
        pushes.append(await next_push(it))
        heads.append(it.at_head)
    assert heads[-1] is True
    assert heads[:-1] == [False] * (len(heads) - 1)
    await it.aclose()


async def test_pushes_that_wait_end_to_end_are_one_yield(log: Log) -> None:
    """A backlog of pushes joining end to end comes as one yield: one batch for the consumer."""
    stream = log.stream()
    it = stream.follow()
    await log.write_transaction(lambda conn: None)  # the follower's start is published
    for n in range(3):
        await stream.append(durable(n))  # three commits: three pushes waiting
    events, scanned = await next_push(it)
    assert [e.offset for e in events] == [1, 2, 3]
    assert scanned == ScannedRange(0, 3)
    assert it.at_head
    await it.aclose()


async def test_a_joined_yield_stops_at_a_page(log: Log) -> None:
    """Joined pushes stop at a page of events, so a batch stays the size a catch-up's is."""
    stream = log.stream()
    it = stream.follow()
    await log.write_transaction(lambda conn: None)
    for n in range(6):
        await stream.append(*(durable(n) for _ in range(100)))
    first, scanned = await next_push(it)
    assert len(first) == follow_internals.PAGE_LIMIT
    assert scanned == ScannedRange(0, follow_internals.PAGE_LIMIT)
    assert not it.at_head
    rest, scanned = await next_push(it)
    assert scanned == ScannedRange(follow_internals.PAGE_LIMIT, 600)
    assert len(rest) == 100
    assert it.at_head
    await it.aclose()


async def test_next_or_woken_returns_none_on_wake_and_loses_nothing(log: Log) -> None:
    """A wake ends the wait without a yield; what was appended around it comes next."""
    stream = log.stream()
    await stream.append(durable(1))
    it = stream.follow()
    assert (await asyncio.wait_for(it.next_or_woken(), 10)) is not None
    waiting = asyncio.ensure_future(it.next_or_woken())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    it.wake()
    assert await asyncio.wait_for(waiting, 10) is None
    await stream.append(durable(2))
    got = await asyncio.wait_for(it.next_or_woken(), 10)
    assert got is not None
    assert ([e.offset for e in got[0]], got[1]) == ([2], ScannedRange(1, 2))
    it.close()
    with pytest.raises(StopAsyncIteration):
        await it.next_or_woken()


async def test_skip_to_starts_the_next_yield_there(log: Log) -> None:
    """A consumer that read up to N itself moves the follower on: it yields from N, once each."""
    stream = log.stream()
    await stream.append(*(durable(n) for n in range(5)))
    it = stream.follow()
    it.skip_to(3)
    it.skip_to(2)  # never backwards
    await stream.append(durable(5))
    pushes = await collect_until(it, 6)
    check_contiguous(pushes, 3)
    assert durables(pushes) == [4, 5, 6]
    await it.aclose()


async def test_a_push_read_from_the_log_never_overtakes_a_commit_in_flight() -> None:
    """publish_read cuts a read's push at this process's commit in flight, so that commit's
    own push (with its ephemerals) is still taken whole; the feed's marks stay set."""
    feed = follow_internals.Feed()
    sub = feed.register("/")

    def event(offset: int, ephemeral: bool = False) -> StreamEvent:
        return StreamEvent(
            path="/",
            offset=offset,
            type="t",
            created_at="2026-12-01T00:00:00.000000Z",
            ephemeral=ephemeral,
        )

    feed.set_inflight({"/": 2})  # our commit of offsets 3 to 5 is in flight
    wakes: follow_internals.WakeList = {}
    published = feed.publish_read([("/", follow_internals.Push(1, 4, [event(2), event(4)]))], wakes)
    assert published == {"/": 2}
    assert [(p.after, p.through, [e.offset for e in p.events]) for p in sub.buffer] == [(1, 2, [2])]
    # A read entirely past the commit's start is not published at all.
    assert feed.publish_read([("/", follow_internals.Push(2, 4, [event(4)]))], wakes) == {}
    own = follow_internals.Push(2, 5, [event(3, True), event(4), event(5, True)])
    feed.publish([("/", own)], wakes)
    assert sub.buffer[-1] is own
    # Once the commit's own push is out, reads are published whole again.
    assert feed.publish_read([("/", follow_internals.Push(5, 6, [event(6)]))], wakes) == {"/": 6}

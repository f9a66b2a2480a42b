"""The follow contract every backend keeps: history then live, once each, in order, nothing lost.

Through the public Log API only; the ``log`` fixture opens each backend in turn.
"""

from __future__ import annotations

import asyncio

import pytest
from support.log import check_contiguous, collect_until, durable, durables, next_push, tick

from streamkit import InvalidRequest, ScannedRange
from streamkit.log import Log


async def test_history_then_live(log: Log) -> None:
    """follow() yields the existing events first, then each new append as it commits."""
    stream = log.stream()
    await stream.append(durable(1), durable(2), durable(3))
    it = stream.follow()
    events, scanned = await next_push(it)
    assert ([e.offset for e in events], scanned) == ([1, 2, 3], ScannedRange(0, 3))
    await stream.append(durable(4))
    events, scanned = await next_push(it)
    assert ([e.offset for e in events], scanned) == ([4], ScannedRange(3, 4))
    await it.aclose()  # type: ignore[attr-defined]


async def test_follow_from_an_offset(log: Log) -> None:
    """The first push starts at after_offset."""
    stream = log.stream()
    await stream.append(*(durable(n) for n in range(5)))
    it = stream.follow(2)
    events, scanned = await next_push(it)
    assert ([e.offset for e in events], scanned) == ([3, 4, 5], ScannedRange(2, 5))


async def test_own_ephemerals_are_pushed_at_once(log: Log) -> None:
    """This process's ephemerals reach its followers, with their offsets, in order."""
    stream = log.stream()
    await stream.append(durable(1))
    it = stream.follow()
    assert (await next_push(it))[1] == ScannedRange(0, 1)
    await stream.append(tick(1))
    events, scanned = await next_push(it)
    assert ([(e.offset, e.ephemeral) for e in events], scanned) == ([(2, True)], ScannedRange(1, 2))
    await stream.append(tick(2), durable(2), tick(3))
    events, scanned = await next_push(it)
    assert [(e.offset, e.ephemeral) for e in events] == [(3, True), (4, False), (5, True)]
    assert scanned == ScannedRange(2, 5)


async def test_a_follower_started_before_appends_misses_nothing(log: Log) -> None:
    """Everything appended after follow() returns reaches the follower, ephemerals included."""
    stream = log.stream()
    it = stream.follow()
    await stream.append(tick(1), durable(1))
    await stream.append(tick(2))
    pushes = await collect_until(it, 3)
    check_contiguous(pushes, 0)
    assert [(e.offset, e.ephemeral) for p in pushes for e in p[0]] == [
        (1, True),
        (2, False),
        (3, True),
    ]


async def test_an_idempotent_retry_is_not_pushed_again(log: Log) -> None:
    """A retried key returns the committed event but pushes only what the call added."""
    stream = log.stream()
    it = stream.follow()
    keyed = {"type": "order.placed", "payload": {"n": 1}, "idempotency_key": "k"}
    await stream.append(keyed)
    await stream.append(keyed, durable(2))
    pushes = await collect_until(it, 2)
    check_contiguous(pushes, 0)
    assert durables(pushes) == [1, 2]


async def test_cancelling_a_wait_loses_nothing(log: Log) -> None:
    """A cancelled __anext__ leaves the iterator where it was; the next call gets the events."""
    stream = log.stream()
    it = stream.follow()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(anext(it), 0.05)
    await stream.append(durable(1))
    events, scanned = await next_push(it)
    assert ([e.offset for e in events], scanned) == ([1], ScannedRange(0, 1))


async def test_follow_arguments_are_checked(log: Log) -> None:
    """A negative or non-integer after_offset is INVALID_REQUEST."""
    for bad in (-1, True, "0"):
        with pytest.raises(InvalidRequest):
            log.stream().follow(bad)  # type: ignore[arg-type]


async def test_a_path_followed_again_gets_what_came_between_at_once(log: Log) -> None:
    """A path followed, left, appended to unfollowed, then followed again: nothing waits.

    A regression: the writer kept the position it had published the path
    through while nobody followed it, so a new follower was told that the
    events appended meanwhile had been pushed, and it saw them only when
    the next commit's push made it repair the gap.
    """
    stream = log.stream()
    await stream.append(durable(1))
    first = stream.follow()
    assert (await next_push(first))[1] == ScannedRange(0, 1)
    await first.aclose()  # type: ignore[attr-defined]
    await stream.append(durable(2))
    await stream.append(durable(3))
    second = stream.follow()
    # Queued behind the new follower's start on the writer, so that start is published
    # before the follower's first read: the order in which the stall showed.
    await log.write_transaction(lambda conn: None)
    pushes = await collect_until(second, 3)
    check_contiguous(pushes, 0)
    assert [e.offset for events, _ in pushes for e in events] == [1, 2, 3]


async def test_the_follow_age_is_none_until_someone_follows_then_stays_fresh(log: Log) -> None:
    """follow_age: None with no follower; then seconds since the last look, kept small."""
    assert log.follow_age() is None
    follower = log.stream("/").follow(0)
    try:
        await log.stream("/").append({"type": "t"})
        async for _events, _ in follower:
            break
        await asyncio.sleep(1.2)  # past PostgreSQL's poll period: a look happened meanwhile
        age = log.follow_age()
        assert age is not None
        assert 0.0 <= age < 1.2
    finally:
        follower.close()

"""Full pages read once are handed to the next reader of the same range (log/_shared_pages.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from streamkit.testing import memory_storage

from streamkit import (
    EventDefinition,
    ProcessorEngine,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
    open_log,
)
from streamkit.log import _log, _shared_pages
from streamkit.log._log import Log


@pytest.fixture
async def log(tmp_path: Path) -> Any:
    async with open_log(tmp_path / "pages.db") as opened:
        await opened.stream("/").append(*({"type": "tick", "payload": {"n": i}} for i in range(30)))
        yield opened


async def shared(log: Log) -> None:
    """Make the path shared: two readers of its first page."""
    await log.stream("/").read(0, 5)
    await log.stream("/").read(0, 5)


async def test_a_lone_reader_keeps_no_page(log: Log) -> None:
    """One reader going through a path holds no page in memory beyond its own."""
    stream = log.stream("/")
    for after in (0, 10):
        await stream.read(after, 10)
    assert log.shared_pages.held_bytes == 0
    assert log.shared_pages.hits == 0


@pytest.mark.speed_trick
async def test_once_a_second_reader_shows_up_full_pages_are_read_once(log: Log) -> None:
    """A second reader of a page makes the path shared; its full pages then go to every reader."""
    stream = log.stream("/")
    await shared(log)
    first = await stream.read(10, 10)
    second = await stream.read(10, 10)
    assert not first.at_head
    assert second is first
    assert log.shared_pages.hits == 1
    assert [e.payload["n"] for e in second.events] == list(range(10, 20))


async def test_a_page_that_reaches_the_head_is_read_again(log: Log) -> None:
    """A page at the head may grow: it is never kept, so a later read sees what came after."""
    stream = log.stream("/")
    await shared(log)
    before = await stream.read(20, 50)
    assert before.at_head
    await stream.append({"type": "tick", "payload": {"n": 30}})
    after = await stream.read(20, 50)
    assert log.shared_pages.hits == 0
    assert len(after.events) == len(before.events) + 1


@pytest.mark.speed_trick
async def test_a_shared_path_is_read_in_pages_of_the_shared_size(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking a shared path for a larger page gives the shared-size page, cut short, and shares it."""
    monkeypatch.setattr(_log, "SHARED_PAGE_EVENTS", 4)
    stream = log.stream("/")
    alone = await stream.read(0, 10)
    assert len(alone.events) == 10  # a lone reader's pages are not capped
    await shared(log)
    first = await stream.read(10, 8)
    assert [e.offset for e in first.events] == [11, 12, 13, 14]
    assert (first.scanned_through_offset, first.at_head) == (14, False)
    second = await stream.read(10, 6)  # another reader, another limit: the same page
    assert second is first
    typed = await stream.read(10, 20, types={"tick": Tick})
    assert typed is first  # a typed reader of a shared path is handed the plain page
    assert log.shared_pages.hits == 2
    assert [e.offset for e in (await stream.read(10, 3)).events] == [11, 12, 13]  # below: as asked


@pytest.mark.speed_trick
async def test_kept_pages_stay_within_the_memory_budget(log: Log) -> None:
    """Past the budget the least recently used page is dropped (and read again when asked)."""
    stream = log.stream("/")
    await shared(log)
    one_page = log.shared_pages.held_bytes
    log.shared_pages.max_bytes = one_page * 3 // 2  # room for one such page, not two
    await stream.read(5, 5)
    assert log.shared_pages.held_bytes <= log.shared_pages.max_bytes
    await stream.read(0, 5)  # dropped: read again, not handed out
    assert log.shared_pages.hits == 0
    await stream.read(0, 5)
    assert log.shared_pages.hits == 1


@pytest.mark.speed_trick
async def test_pages_nobody_takes_are_dropped_after_a_while(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up's pages are given back soon after it ends."""
    monkeypatch.setattr(_shared_pages, "IDLE_SECONDS", 0.05)
    await shared(log)
    assert log.shared_pages.held_bytes > 0
    for _ in range(100):
        await asyncio.sleep(0.02)
        if log.shared_pages.held_bytes == 0:
            break
    assert log.shared_pages.held_bytes == 0


@pytest.mark.speed_trick
async def test_a_shared_page_cannot_be_changed_by_a_reader(log: Log) -> None:
    """A kept page holds its events in a tuple: no reader can alter what others are given."""
    await shared(log)
    page = await log.stream("/").read(0, 5)
    assert isinstance(page.events, tuple)


class Tick(BaseModel):
    n: int


class Total(BaseModel):
    total: int = 0


def summing(slug: str, *, typed: bool = False) -> StreamProcessor[Total]:
    """Sums ``tick`` payloads; ``typed``: the contract declares their model (read typed)."""
    events = {"tick": EventDefinition(description="a tick", payload_schema=Tick)}

    class Summing(StreamProcessor[Total]):
        contract = define_processor_contract(
            slug=slug,
            version="1",
            state_schema=Total,
            events=events if typed else None,
            consumes=["tick"],
        )

        def reduce(self, event: StreamEvent, state: Total) -> Total:
            n = event.payload.n if typed else event.payload["n"]
            return Total(total=state.total + n)

    return Summing()


@pytest.mark.speed_trick
@pytest.mark.parametrize("typed", [False, True], ids=["plain", "typed"])
async def test_processors_catching_up_together_decode_each_page_once(
    tmp_path: Path, typed: bool
) -> None:
    """Three engines over one log share the pages the first of them read, and all reduce right.

    Engines that read typed (their contracts declare the payload) share them too.
    """
    async with open_log(tmp_path / "fan.db") as log:
        stream = log.stream("/")
        for _ in range(6):
            await stream.append(*({"type": "tick", "payload": {"n": 1}} for _i in range(500)))
        engines = [
            ProcessorEngine(
                summing(f"s{i}", typed=typed),
                stream=stream.for_processor(f"s{i}"),
                storage=memory_storage(),
            )
            for i in range(3)
        ]
        await asyncio.gather(*(engine.catch_up_from_log() for engine in engines))
        for engine in engines:
            assert (await engine.snapshot()).state.total == 3000
            assert engine.statistics().incidents["malformed_payloads"] == 0
        assert log.shared_pages.hits >= 2
        for engine in engines:
            await engine.aclose()


async def test_a_page_of_large_events_is_never_kept(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages past MAX_PAGE_STORED of JSON are read again: large events would fill the budget."""
    monkeypatch.setattr(_shared_pages, "MAX_PAGE_STORED", 10)
    await shared(log)
    await log.stream("/").read(10, 10)
    await log.stream("/").read(10, 10)
    assert log.shared_pages.held_bytes == 0
    assert log.shared_pages.hits == 0


async def test_one_reader_going_over_the_same_pages_again_later_keeps_nothing(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only readers reading together share: a re-read long after the first holds no page."""
    monkeypatch.setattr(_shared_pages, "TOGETHER_SECONDS", 0.05)
    stream = log.stream("/")
    await stream.read(0, 5)
    await asyncio.sleep(0.1)
    await stream.read(0, 5)
    await stream.read(5, 5)
    assert log.shared_pages.held_bytes == 0


class OtherTick(BaseModel):
    n: int


@pytest.mark.speed_trick
async def test_readers_of_the_same_types_share_typed_pages(log: Log) -> None:
    """A typed page is kept for readers of the same types only, its events built once for all."""
    stream = log.stream("/")
    lone = await stream.read(0, 10, types={"tick": Tick})
    assert log.shared_pages.held_bytes == 0  # a lone reader's page is never kept
    again = await stream.read(0, 10, types={"tick": Tick})  # a second reader: kept
    assert again is not lone
    assert log.shared_pages.held_bytes > 0
    third = await stream.read(0, 10, types={"tick": Tick})
    assert third is again
    assert isinstance(third.events, tuple)
    assert [e.payload for e in third.events] == [Tick(n=n) for n in range(10)]
    # Other kinds of reader read their own: plain, or typed with other models.
    plain = await stream.read(0, 10)
    other = await stream.read(0, 10, types={"tick": OtherTick})
    assert [e.payload for e in plain.events] == [{"n": n} for n in range(10)]
    assert [type(e.payload) for e in other.events] == [OtherTick] * 10
    assert log.shared_pages.hits == 1


async def test_a_lone_typed_reader_on_a_path_plain_readers_share_keeps_nothing(log: Log) -> None:
    """Its pages would fill the budget for nobody: it reads them typed, and they are not kept."""
    stream = log.stream("/")
    await shared(log)
    held = log.shared_pages.held_bytes
    for after in (5, 10, 15):
        page = await stream.read(after, 5, types={"tick": Tick})
        assert [type(e.payload) for e in page.events] == [Tick] * 5
        assert not isinstance(page.events, tuple)
    assert log.shared_pages.held_bytes == held

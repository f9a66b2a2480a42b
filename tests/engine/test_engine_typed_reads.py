"""A catch-up over a stream that types its reads builds each event once (engine/_pages.py).

The engine reads with ``types`` (the one read's option of speed): the
payloads of the types a processor reduces come out of the log's page already
validated into their models, so the fold hands the events as the page
builds them to ``reduce`` instead of copying each one with its typed payload.
A stream that ignores ``types`` gives plain pages and the fold types the
payloads itself; so does the engine under ``STREAMKIT_PLAIN=1``: both give
the same states and the same reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from streamkit.testing import memory_storage

from streamkit import (
    EventDefinition,
    ProcessorEngine,
    ReadPage,
    StreamEvent,
    StreamProcessor,
    _speed,
    define_processor_contract,
    open_log,
)
from streamkit.engine import _fold


class Tick(BaseModel):
    n: int


class Total(BaseModel):
    total: int = 0


class Summing(StreamProcessor[Total]):
    contract = define_processor_contract(
        slug="summing",
        version="1",
        state_schema=Total,
        events={"tick": EventDefinition(description="a tick", payload_schema=Tick)},
        consumes=["tick"],
        on_malformed="skip",
    )

    def __init__(self) -> None:
        self.seen: list[StreamEvent] = []

    def reduce(self, event: StreamEvent, state: Total) -> Total:
        self.seen.append(event)
        return Total(total=state.total + event.payload.n)


class Recording:
    """A processor stream over a real view that keeps every page it returns."""

    def __init__(self, view: Any) -> None:
        self._view = view
        self.path = view.path
        self.plain: list[ReadPage] = []

    async def append(self, *events: Any) -> list[StreamEvent]:
        return list(await self._view.append(*events))

    async def read(self, after_offset: int = 0, limit: int = 500, **_: Any) -> ReadPage:
        """Plain pages, whatever ``types`` the engine asks for (a stream may ignore them)."""
        page: ReadPage = await self._view.read(after_offset, limit)
        self.plain.append(page)
        return page

    async def claim(self, at: float | None) -> None:
        await self._view.claim(at)


class RecordingTyped(Recording):
    """The same, reading typed when asked to."""

    def __init__(self, view: Any) -> None:
        super().__init__(view)
        self.typed: list[ReadPage] = []

    async def read(self, after_offset: int = 0, limit: int = 500, *, types: Any = None) -> ReadPage:
        if types is None:
            return await super().read(after_offset, limit)
        page: ReadPage = await self._view.read(after_offset, limit, types=types)
        self.typed.append(page)
        return page


def ticks(*values: Any) -> list[dict[str, Any]]:
    return [{"type": "tick", "payload": {"n": n}} for n in values]


@pytest.mark.skipif(not _speed.FAST, reason="STREAMKIT_PLAIN=1: the engine reads plain pages")
async def test_a_catch_up_folds_the_typed_pages_events_without_copying_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reduce gets each event as the typed page builds it, its payload already a model."""
    copies: list[StreamEvent] = []
    real_copy = _fold.with_payload

    def counted_copy(event: StreamEvent, payload: Any) -> StreamEvent:
        copies.append(event)
        return real_copy(event, payload)

    monkeypatch.setattr(_fold, "with_payload", counted_copy)
    async with open_log(tmp_path / "typed.db") as log:
        await log.stream("/").append(*ticks(*range(1200)))
        stream = RecordingTyped(log.stream("/").for_processor("summing"))
        processor = Summing()
        engine = ProcessorEngine(processor, stream=stream, storage=memory_storage())
        assert (await engine.snapshot()).state.total == sum(range(1200))
        await engine.aclose()
    assert stream.typed
    assert not stream.plain
    assert copies == []
    assert [event.offset for event in processor.seen] == list(range(1, 1201))
    assert all(type(event.payload) is Tick for event in processor.seen)


@pytest.mark.skipif(not _speed.FAST, reason="STREAMKIT_PLAIN=1: the engine reads plain pages")
async def test_a_malformed_payload_in_a_typed_page_is_reported_and_skipped(
    tmp_path: Path,
) -> None:
    """A payload the typed read could not type reaches the fold as read, and is reported there."""
    async with open_log(tmp_path / "typed.db") as log:
        await log.stream("/").append(*ticks(1, "one", 2))
        stream = RecordingTyped(log.stream("/").for_processor("summing"))
        engine = ProcessorEngine(Summing(), stream=stream, storage=memory_storage())
        assert (await engine.snapshot()).state.total == 3
        incidents = engine.statistics().incidents
        await engine.aclose()
    assert stream.typed[0].events[1].payload == {"n": "one"}
    assert incidents["malformed_payloads"] == 1
    assert incidents["last_malformed"]["offset"] == 2


async def test_a_stream_without_typed_reads_gives_the_same_state_and_reports(
    tmp_path: Path,
) -> None:
    """Over a stream that only reads plainly, the fold types the payloads: same outcome."""
    async with open_log(tmp_path / "plain.db") as log:
        await log.stream("/").append(*ticks(1, "one", 2, *range(600)))
        outcomes = []
        for stream in (
            Recording(log.stream("/").for_processor("summing")),
            RecordingTyped(log.stream("/").for_processor("summing")),
        ):
            processor = Summing()
            engine = ProcessorEngine(processor, stream=stream, storage=memory_storage())
            snapshot = await engine.snapshot()
            outcomes.append(
                (snapshot, engine.statistics().incidents["malformed_payloads"], processor.seen)
            )
            await engine.aclose()
    (plain_snapshot, plain_malformed, plain_seen), (typed_snapshot, typed_malformed, typed_seen) = (
        outcomes
    )
    assert plain_snapshot == typed_snapshot
    assert plain_snapshot.state.total == 3 + sum(range(600))
    assert plain_malformed == typed_malformed == 1
    assert plain_seen == typed_seen

"""Hiding skipped events from a processor's pages (skips.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from streamkit import ReadPage, StreamEvent
from streamkit.backends import _stored
from streamkit.log._log import Log
from streamkit.skips import filter_page


class Tick(BaseModel):
    n: int


async def typed_page(log: Log, monkeypatch: pytest.MonkeyPatch) -> tuple[ReadPage, list[int]]:
    """A typed page of offsets 1-10 from a real log, and the offsets of the events it builds."""
    await log.stream("/").append(*({"type": "tick", "payload": {"n": n}} for n in range(10)))
    page = await log.stream("/").read(0, 10, types={"tick": Tick})
    built: list[int] = []
    make = _stored.make_event

    def counted(path: str, offset: int, *rest: Any) -> StreamEvent:
        built.append(offset)
        return make(path, offset, *rest)

    monkeypatch.setattr(_stored, "make_event", counted)
    return page, built


async def test_a_page_with_no_skipped_offset_in_its_range_is_handed_on_untouched(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skips outside the page cost a look at its two ends, not a pass over its events."""
    page, built = await typed_page(log, monkeypatch)
    assert filter_page(page, {0, 11, 500}) is page
    assert built == [1, 10]
    assert filter_page(page, set()) is page


async def test_skipped_events_are_left_out_and_the_proof_is_kept(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each skipped offset inside the page is gone; the scanned range still proves through 10."""
    page, _ = await typed_page(log, monkeypatch)
    filtered = filter_page(page, {1, 5, 10, 99})
    assert [e.offset for e in filtered.events] == [2, 3, 4, 6, 7, 8, 9]
    assert (filtered.scanned_through_offset, filtered.at_head) == (10, True)


def test_an_empty_page_is_handed_on() -> None:
    page = ReadPage([], 7, True)
    assert filter_page(page, {7}) is page

"""Hiding skipped events from a processor's pages (skips.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from streamkit import ReadPage, StreamEvent
from streamkit.skips import filter_page


class Counted(Sequence[StreamEvent]):
    """A page's events that count how many are taken, as a typed page builds each one taken."""

    def __init__(self, offsets: range) -> None:
        self._events = [StreamEvent(path="/", offset=o, type="tick") for o in offsets]
        self.taken = 0

    def __len__(self) -> int:
        return len(self._events)

    @overload
    def __getitem__(self, index: int) -> StreamEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[StreamEvent]: ...

    def __getitem__(self, index: int | slice) -> StreamEvent | list[StreamEvent]:
        if isinstance(index, slice):
            self.taken += len(range(*index.indices(len(self._events))))
            return self._events[index]
        self.taken += 1
        return self._events[index]

    def __iter__(self) -> Iterator[StreamEvent]:
        for event in self._events:
            self.taken += 1
            yield event


def test_a_page_with_no_skipped_offset_in_its_range_is_handed_on_untouched() -> None:
    """Skips outside the page cost a look at its two ends, not a pass over its events."""
    events = Counted(range(11, 21))
    page = ReadPage(events, 20, False)
    assert filter_page(page, {3, 10, 21, 500}) is page
    assert events.taken == 2
    assert filter_page(page, set()) is page


def test_skipped_events_are_left_out_and_the_proof_is_kept() -> None:
    """Each skipped offset inside the page is gone; the scanned range still proves through 20."""
    page = ReadPage(Counted(range(11, 21)), 20, False)
    filtered = filter_page(page, {11, 15, 20, 99})
    assert [e.offset for e in filtered.events] == [12, 13, 14, 16, 17, 18, 19]
    assert (filtered.scanned_through_offset, filtered.at_head) == (20, False)


def test_an_empty_page_is_handed_on() -> None:
    page = ReadPage([], 7, True)
    assert filter_page(page, {7}) is page

"""Operator skips: what a skip record is, and how it hides one event from one processor.

A skip is the durable event :data:`SKIP_EVENT` (payload ``{slug, offset, by,
reason}``) on the processor's stream path, written only by the operator verb
(``ProcessorHost.skip``, ``streamkit skip``) together with its backend record
in one transaction; the backend's host store writes both, and hosts obey the record. A
skipped event is hidden from that one processor only: its reads and pushes
never contain it (:func:`filter_page`, :func:`without_skipped`), and its
cursor moves past it by the scanned range as usual, so the proof of a read is
never changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from streamkit.events import ReadPage, StreamEvent

__all__ = ["SKIP_EVENT", "filter_page", "without_skipped"]

SKIP_EVENT = "streamkit.event-skipped"


def without_skipped(events: Sequence[StreamEvent], skipped: Iterable[int]) -> list[StreamEvent]:
    """``events`` minus the durable ones at a skipped offset."""
    skip = set(skipped)
    return [e for e in events if e.ephemeral or e.offset not in skip]


def filter_page(page: ReadPage, skipped: set[int]) -> ReadPage:
    """A read page minus skipped events; the scanned range (the proof) is unchanged.

    A read page's events ascend, so a page with no skipped offset between its
    first and last is handed on as it is, without taking the events between
    (a typed page builds each event it is asked for).
    """
    events = page.events
    if not skipped or not events:
        return page
    first, last = events[0].offset, events[-1].offset
    if not any(first <= offset <= last for offset in skipped):
        return page
    return ReadPage(
        [e for e in events if e.offset not in skipped],
        page.scanned_through_offset,
        page.at_head,
    )

"""Full pages read lately, shared by every reader of the same range in this process.

Processors that catch up one path read the same pages, and each read costs a
query and the decoding of every row. A page that stops short of the head
holds every durable event of its range, and no later commit can change that
(an offset is never reused and a committed event never changes), so a reader
asking for the same ``(path, after, limit, bound)`` and the same kind of page
may be handed the page another reader got: it is the page it would read. A
page that reaches the head is never kept, since a later read of it may find
more. Events are immutable, so sharing them is what pushes already do.

Pages are kept only for readers reading at once: the first read of each page
is only noted, and once a second reader asks for a page read less than
:data:`TOGETHER_SECONDS` before, the path counts as shared for
:data:`IDLE_SECONDS` and its full pages are kept from then on. (A reader
that goes through the same pages again later, one after the other, gains
nothing from pages held meanwhile, and holding them costs every garbage
collection of the process.) A lone reader (one processor catching up) holds
no page in memory beyond its own.

- A read of a shared path takes at most :data:`SHARED_PAGE_EVENTS` events,
  so readers asking for larger pages meet on the same ones.
- Pages come in kinds: plain, or typed with one set of models
  (``read(..., types=...)``). A kind's pages are kept once two of its readers were
  seen together, so readers of the same types share their typed events, and
  a lone typed reader on a path plain readers share keeps nothing.
- What is kept is bounded by an estimate of its memory
  (:data:`MAX_SHARED_BYTES`, the least recently used page dropped first) and
  by time: a page no reader took for :data:`IDLE_SECONDS` is dropped, so the
  memory of a catch-up is given back soon after it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

from streamkit.events import ReadPage

__all__ = [
    "EVENT_OVERHEAD",
    "IDLE_SECONDS",
    "MAX_PAGE_STORED",
    "MAX_SHARED_BYTES",
    "SHARED_PAGE_EVENTS",
    "SharedPages",
]

MAX_SHARED_BYTES = 32 * 1024 * 1024
"""The estimated memory of the pages kept at most."""

EVENT_OVERHEAD = 512
"""Bytes a decoded event takes besides twice its stored JSON (the estimate of its objects)."""

MAX_PAGE_STORED = 1024 * 1024
"""A page of more stored JSON than this is never kept: its decoding costs little next to
its bytes, and a few of them would fill the budget (events of up to 1 MiB each)."""

SHARED_PAGE_EVENTS = 500
"""The most events a read of a shared path takes: its pages are kept, and shared, at this size.

A reader of such a path asking for more gets a page cut short at this many
(proving through its last event, as any page cut short by its limit), and
the page the other readers of the path share. Larger pages thrash the
budget: thirty processors sharing pages of 4,000 events caught up 200,000
events in 21 s against 6.2 s with pages of 500 (:data:`MAX_SHARED_BYTES`
held 16 pages of 4,000, and the readers drifted further apart than that).
A lone reader's pages are not capped: they are never kept.
"""

TOGETHER_SECONDS = 2.0
"""Two reads of one page this close in time are two readers reading together."""

_NOTED = 4096
"""Page keys remembered, to notice a second reader of the same page."""

IDLE_SECONDS = 10.0
"""A page no reader took for this long is dropped."""

Kind = frozenset[tuple[str, Any]] | None
"""A page's kind: None for a plain page, else the validators of a typed page's types."""

Key = tuple[str, int, int, int | None, Kind]
"""``(path, after, limit, bound, kind)``."""


class SharedPages:
    """Recently read full pages by ``(path, after, limit, bound, types)``, within a memory budget."""

    __slots__ = ("_bytes", "_kinds", "_noted", "_pages", "_shared", "_timer", "hits", "max_bytes")

    def __init__(self, *, max_bytes: int = MAX_SHARED_BYTES) -> None:
        self.max_bytes = max_bytes
        # key -> (page, stored bytes, estimated bytes, last use on the monotonic clock)
        self._pages: OrderedDict[Key, tuple[ReadPage, int, int, float]] = OrderedDict()
        self._bytes = 0
        # Keys read lately (no pages) and when, and paths a second reader was seen on, and when.
        self._noted: OrderedDict[Key, float] = OrderedDict()
        self._shared: dict[str, float] = {}
        # The same, per path and kind of page (None: plain; else a typed page's types):
        # pages are kept only for the kind two readers were seen reading together.
        self._kinds: dict[tuple[str, Kind], float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.hits = 0
        """Reads answered with a page another read got."""

    @property
    def held_bytes(self) -> int:
        """The estimated memory of the pages kept now."""
        return self._bytes

    def get(self, key: Key) -> tuple[ReadPage, int] | None:
        """The page kept for ``key`` and its stored bytes, or None."""
        found = self._pages.get(key)
        if found is None:
            noted = self._noted.get(key)
            now = time.monotonic()
            if noted is not None and now - noted < TOGETHER_SECONDS:
                # A second reader: keep this path's pages of this kind.
                self._shared[key[0]] = now
                self._kinds[key[0], key[4]] = now
            return None
        page, stored, cost, _ = found
        self._pages[key] = (page, stored, cost, time.monotonic())
        self._pages.move_to_end(key)
        self.hits += 1
        return page, stored

    def is_shared(self, path: str) -> bool:
        """Whether several readers read ``path`` together lately (of one kind of page or another)."""
        shared = self._shared.get(path)
        return shared is not None and shared > time.monotonic() - IDLE_SECONDS

    def note(self, key: Key) -> None:
        """Note a read of ``key`` that is not kept, so a second reader of it is still seen."""
        self._noted[key] = time.monotonic()
        self._noted.move_to_end(key)
        if len(self._noted) > _NOTED:
            self._noted.popitem(last=False)

    def keep(self, key: Key, page: ReadPage, stored: int) -> ReadPage:
        """Keep ``page`` (``stored`` bytes of JSON) for the next reader of ``key`` if it is full.

        Returns the page to hand out: a kept one holds its events in a tuple,
        so no reader can change what the others are given.
        """
        if page.at_head or not page.events or stored > MAX_PAGE_STORED or key in self._pages:
            return page
        kind = self._kinds.get((key[0], key[4]))
        if kind is None or kind <= time.monotonic() - IDLE_SECONDS:
            # No two readers of this kind together lately: a lone typed reader on a
            # path plain readers share would fill the budget with pages nobody takes.
            self.note(key)
            return page
        cost = 2 * stored + EVENT_OVERHEAD * len(page.events)
        if cost > self.max_bytes:
            return page
        # A tuple: no reader can change what the others are given; a typed page's
        # events are built here, once for all its readers.
        page = ReadPage(tuple(page.events), page.scanned_through_offset, page.at_head)
        self._pages[key] = (page, stored, cost, time.monotonic())
        self._bytes += cost
        while self._bytes > self.max_bytes:
            self._drop_oldest()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(IDLE_SECONDS, self._expire)
        return page

    def clear(self) -> None:
        """Drop every page (the log closed)."""
        self._pages.clear()
        self._noted.clear()
        self._shared.clear()
        self._kinds.clear()
        self._bytes = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _drop_oldest(self) -> None:
        _, (_, _, cost, _) = self._pages.popitem(last=False)
        self._bytes -= cost

    def _expire(self) -> None:
        self._timer = None
        idle_since = time.monotonic() - IDLE_SECONDS
        # Least recently used first: stop at the first page used since.
        while self._pages and next(iter(self._pages.values()))[3] <= idle_since:
            self._drop_oldest()
        if self._pages:
            self._timer = asyncio.get_running_loop().call_later(IDLE_SECONDS, self._expire)

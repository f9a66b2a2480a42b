"""The pages an engine reads from its stream: their sizes, their types, and replays.

Every read of the log an engine makes goes through one :class:`PageReader`:
a catch-up's pages, a gap repair's, a deferred state's replay and a version
re-reduce. Where the processor declares payload models, pages are read with
them (``read(..., types=...)``), so a stream that types payloads builds each
event once with the payload its reduce takes; the fold types what a plain
read leaves decoded, so both give the same batch. The typed read is a speed
trick: off under ``STREAMKIT_PLAIN=1`` (:mod:`streamkit._speed`).

A replay (:meth:`PageReader.replay`) folds the durable events of
``(after, through]`` into a state, reduce only, never past ``through``:
what the engine does to rebuild a state whose events were already
processed (their effects ran).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.engine._fold import Fold
from streamkit.events import ReadPage
from streamkit.protocols import ProcessorStream

if TYPE_CHECKING:
    from streamkit.engine._turns import Turns

__all__ = ["MAX_CATCH_UP_PAGE", "PAGE_SIZE", "PageReader"]

S = TypeVar("S")

PAGE_SIZE = 500
"""Events per read when the engine repairs a gap, and in the first page of a catch-up."""

MAX_CATCH_UP_PAGE = 4000
"""The most events one catch-up page (one batch, one checkpoint) grows to.

A catch-up doubles its page after each full one, up to this, so a backlog
pays a batch's fixed costs (the checkpoint, the live-state projection, the
read's round trip) once per 4,000 events rather than per 500. A typed page
keeps no events (a lazy ``TypedEvents``), so a larger one costs its rows and their
decoded JSON, not 4,000 live events for the garbage collector to scan; the
log caps the pages of a path several processors read at once, which it
shares at 500 (``SHARED_PAGE_EVENTS``). Measured on 1M events of a trivial
processor: 3.96-4.11 µs an event with pages of 4,000 against 4.60 µs with
pages of 500.
"""


class PageReader(Generic[S]):
    """Reads the pages one engine folds (see the module docstring)."""

    def __init__(self, stream: ProcessorStream, fold: Fold[S]) -> None:
        self._stream = stream
        self._fold = fold
        types = fold.payload_types() if SPEED_TRICKS else None
        self._types = types or None

    async def read(self, after: int, limit: int) -> ReadPage:
        """Up to ``limit`` events after ``after``, typed when the processor declares models."""
        if self._types is None:
            return await self._stream.read(after, limit)
        return await self._stream.read(after, limit, types=self._types)

    async def replay(
        self,
        state: S,
        after: int,
        through: int,
        page_size: int,
        on_page: Callable[[int, int], None] | None = None,
        save: Callable[[int, S], Awaitable[None]] | None = None,
        turns: Turns | None = None,
    ) -> tuple[S, int]:
        """``state`` with the durable events of ``(after, through]`` folded in, and how many.

        ``on_page(position, folded)`` is told after each page how far it came,
        then ``save(position, state)`` is awaited (it may checkpoint the state).
        With ``turns`` (a rebuild), the reads and folds are sized by them and
        a turn ends after each read and each slice (``page_size`` is then
        unused); without, a page is ``page_size`` events folded at once
        (paced as a catch-up's), and the loop gets one turn after it.

        Reduce only: no effects run. Stops early where the log holds nothing
        more below ``through``. Raises what the log's read raises, and
        :class:`~streamkit.errors.SchemaAhead` at a payload newer than the code
        (:class:`~streamkit.errors.PayloadMalformed` at one that does not validate,
        for a processor that stalls on those).
        """
        position = after
        folded = 0
        while position < through:
            if turns is None:
                page = await self.read(position, page_size)
                below = [event for event in page.events if event.offset <= through]
                state, count = await self._fold.fold_paced(below, state)
            else:
                held, began = time.thread_time(), time.perf_counter()
                page = await self.read(position, turns.read_events())
                took = time.perf_counter() - began
                turns.read(len(page.events), time.thread_time() - held, took)
                await turns.turn()
                state, count = await self._fold_in_turns(page, through, state, turns)
            folded += count
            # A replay that stopped short must not pass for one that reached `through`.
            self._fold.raise_if_stopped()
            if page.scanned_through_offset <= position:
                break  # the log holds nothing more below `through`
            position = min(page.scanned_through_offset, through)
            if on_page is not None:
                on_page(position, folded)
            if save is not None:
                await save(position, state)
            if turns is None:
                # A read of a local file may not suspend, nor a fold of a fast reduce:
                # without a turn here, a replay of millions would hold the loop to its end.
                await asyncio.sleep(0)
        return state, folded

    async def _fold_in_turns(
        self, page: ReadPage, through: int, state: S, turns: Turns
    ) -> tuple[S, int]:
        """Fold ``page``'s events up to ``through`` in slices the turns size, a turn after each.

        Events of a typed page are built as a slice takes them, so building
        them is part of the slice it is timed with.
        """
        events = iter(page.events)
        folded = 0
        while True:
            began = time.perf_counter()
            chunk = list(itertools.islice(events, turns.slice_events()))
            if not chunk:
                return state, folded
            past = chunk[-1].offset > through
            if past:
                chunk = [event for event in chunk if event.offset <= through]
            state, count = self._fold.fold_all(chunk, state)
            turns.folded(len(chunk), time.perf_counter() - began)
            folded += count
            await turns.turn()
            if past or self._fold.stopped is not None:
                return state, folded

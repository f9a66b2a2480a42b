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

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.engine._fold import Fold
from streamkit.events import ReadPage
from streamkit.protocols import ProcessorStream

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
    ) -> tuple[S, int]:
        """``state`` with the durable events of ``(after, through]`` folded in, and how many.

        ``on_page(position, folded)`` is told after each page how far it came,
        then ``save(position, state)`` is awaited (it may checkpoint the state).

        Reduce only: no effects run. Stops early where the log holds nothing
        more below ``through``. Raises what the log's read raises, and
        :class:`~streamkit.errors.SchemaAhead` at a payload newer than the code
        (:class:`~streamkit.errors.PayloadMalformed` at one that does not validate,
        for a processor that stalls on those).
        """
        position = after
        folded = 0
        while position < through:
            page = await self.read(position, page_size)
            below = [event for event in page.events if event.offset <= through]
            state, count = await self._fold.fold_paced(below, state)
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
        return state, folded

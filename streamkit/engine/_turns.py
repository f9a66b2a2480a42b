"""How a rebuild in the shadow shares the event loop: short turns, the serving work between.

A rebuild reduces millions of events nobody waits for, on the loop its
host's serving processors, socket and HTTP run on. A :class:`Turns` cuts
its work into turns of about :data:`TURN_SECONDS` of the loop each: a read
sized from what the last reads held the loop for (a SQLite read runs on
the loop) and took in all (a PostgreSQL read decodes its rows on a reader
thread: at most about :data:`READ_SECONDS` of it at a time), and folds
sliced from the reduce's measured speed. After each turn it gives
way: to the host's serving processors through ``give_way(seconds)`` (the
host's foreground, which waits for their ranges up to the rebuild's share),
or without a host, for one turn of the loop. The seconds it waited are
counted (:attr:`Turns.waited`), and shown with the rebuild's progress.

Measured on 1M events (docs/performance.md): a serving processor beside
the rebuild keeps its p99 within 2x of its p99 without one (1.4x on
SQLite, 1.9x on PostgreSQL), and the rebuild keeps well over half a plain
catch-up's rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["FIRST_READ", "FIRST_SLICE", "LEAST", "READ_SECONDS", "TURN_SECONDS", "Turns"]

TURN_SECONDS = 0.0003
"""How long one turn of a rebuild aims to hold the event loop.

What a serving processor that became ready meanwhile may wait for it, at
most, at each step of its own work.
"""

READ_SECONDS = 0.0005
"""How long one read of a rebuild aims to take in all (waiting on the network included).

A PostgreSQL read runs on a reader thread, which holds the interpreter's
lock while it decodes its rows: a serving processor's wake-up waits for
that. Measured on 1M events (docs/performance.md): reads of 2 ms left a
serving processor's p99 at 4x its p99 without a rebuild, reads of 1 ms at
1.9x, reads of 0.5 ms at 1.9x with a third more rebuild rate under load
(0.65x a plain catch-up's). On SQLite the loop's own turn is the tighter bound.
"""

FIRST_READ = 100
"""Events in a rebuild's first read, before its cost is known."""

FIRST_SLICE = 100
"""Events in a rebuild's first fold, before the reduce's speed is known."""

LEAST = 8
"""The fewest events a read or a fold slice is sized for (a very slow reduce)."""


class Turns:
    """The turns of one rebuild (see the module). ``give_way`` is the host's, if any;
    ``most`` the most events one read or fold slice takes."""

    __slots__ = ("_began", "_give_way", "_most", "_read", "_slice", "waited")

    def __init__(
        self, give_way: Callable[[float], Awaitable[float]] | None = None, *, most: int
    ) -> None:
        self._give_way = give_way
        self._most = most
        self._read = FIRST_READ
        self._slice = FIRST_SLICE
        self._began = time.perf_counter()
        self.waited = 0.0
        """Seconds this rebuild waited for the host's serving processors."""

    def read_events(self) -> int:
        """How many events the next read asks for."""
        return self._read

    def read(self, events: int, held: float, took: float) -> None:
        """A read of ``events`` events took ``took`` seconds, ``held`` of them on the loop's thread.

        Sized so that what it holds the loop for fits a turn, and the whole
        read :data:`READ_SECONDS`: a read on other threads (PostgreSQL's
        reader pool) decodes its rows there, holding the interpreter's lock
        that long, in pieces, against the loop.
        """
        if events <= 0:
            return
        on_loop = int(TURN_SECONDS * events / held) if held > 0 else self._most
        whole = int(READ_SECONDS * events / took) if took > 0 else self._most
        # Never more than twice the last read: one quick read is not followed by a huge one.
        grown = 2 * max(events, self._read)
        self._read = max(LEAST, min(self._most, grown, on_loop, whole))

    def slice_events(self) -> int:
        """How many events the next fold slice takes."""
        return self._slice

    def folded(self, events: int, seconds: float) -> None:
        """A fold slice of ``events`` events took ``seconds``."""
        if events <= 0:
            return
        fits = int(TURN_SECONDS * events / seconds) if seconds > 0 else self._most
        self._slice = max(LEAST, min(self._most, fits))

    async def turn(self) -> None:
        """End a turn: give way to the serving processors (or the loop), then start the next."""
        took = time.perf_counter() - self._began
        if self._give_way is None:
            await asyncio.sleep(0)
        else:
            self.waited += await self._give_way(took)
        self._began = time.perf_counter()

"""Test helpers for processor authors (imported as ``streamkit.testing``).

- :func:`reduce_processor` folds events through a processor's pure reduce, exactly
  as the engine does, with no engine, stream or storage;
- :func:`memory_stream` is a stream with the log's commit semantics in memory,
  which pushes every append to the engines in its ``.engines``;
- :func:`memory_storage` is the real checkpoint table over in-memory SQLite,
  counting ``.writes``;
- :func:`settle` lets fire-and-forget pushes land;
- :class:`ManualClock` is a clock a test moves by hand (pass it as ``clock=``).

The pytest plugin (registered on install) provides the fixtures
``streamkit_stream``, ``streamkit_storage`` and ``streamkit_clock``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from streamkit.testing._memory import MemoryStorage, MemoryStream, memory_storage, memory_stream

from streamkit.engine import Fold
from streamkit.events import EventInput, StreamEvent, format_timestamp, prepare_event
from streamkit.processor import StreamProcessor

__all__ = [
    "ManualClock",
    "MemoryStorage",
    "MemoryStream",
    "memory_storage",
    "memory_stream",
    "reduce_processor",
    "settle",
]

S = TypeVar("S")


def reduce_processor(
    processor: StreamProcessor[S],
    inputs: Iterable[StreamEvent | EventInput | Mapping[str, Any]],
) -> S:
    """Fold ``inputs`` through ``processor.reduce`` exactly as the engine does; return the state.

    Starts from the contract's initial state; skips what the contract does not
    consume; validates each declared payload (a malformed one is skipped and
    reported) and hands the reduce the validated model; a reduce that raises
    keeps the previous state. Inputs (mappings with the keys of an append, or
    :class:`~streamkit.events.EventInput`) get offsets in input order from 1;
    committed :class:`~streamkit.events.StreamEvent` inputs keep their own.
    No effects run.
    """
    events = [
        item
        if isinstance(item, StreamEvent)
        else prepare_event(item, index).decoded(
            path="/", offset=index + 1, created_at=format_timestamp(index + 1)
        )
        for index, item in enumerate(inputs)
    ]
    state, _ = Fold(processor).fold_all(events, processor.contract.initial_state())
    return state


async def settle(seconds: float = 0.025) -> None:
    """Wait ``seconds`` on the event loop, long enough for fire-and-forget pushes to land."""
    await asyncio.sleep(seconds)


class ManualClock:
    """A wall clock (epoch seconds) that moves only when the test says so."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds``; return the new time."""
        self.now += seconds
        return self.now

    def __repr__(self) -> str:
        return f"ManualClock(now={self.now})"

"""Test helpers for processor authors (imported as ``streamkit.testing``).

- :func:`reduce_processor` folds events through a processor's pure reduce, exactly
  as the engine does, with no engine, stream or storage;
- :func:`memory_stream` is a stream with the log's commit semantics in memory,
  which pushes every append to the engines in its ``.engines``;
- :func:`memory_storage` is the real checkpoint table over in-memory SQLite,
  counting ``.writes``;
- :func:`settle` lets fire-and-forget pushes land;
- :class:`ManualClock` is a clock a test moves by hand (pass it as ``clock=``).

One test has one clock. The pytest plugin (registered on install) provides the
fixtures ``streamkit_clock``, ``streamkit_stream`` (whose events are stamped by
that clock) and ``streamkit_storage``; :func:`reduce_processor` stamps its
inputs by the clock it is given, by default a :class:`ManualClock` at the same
start as the fixture's, and keeps an input's own ``created_at``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from streamkit.testing._memory import MemoryStorage, MemoryStream, memory_storage, memory_stream

from streamkit.catalog import EventCatalog
from streamkit.engine import Fold
from streamkit.errors import InvalidEvent
from streamkit.events import EventInput, StreamEvent, format_timestamp, prepare_event
from streamkit.processor import StreamProcessor
from streamkit.protocols import Clock

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
    *,
    clock: Clock | None = None,
    unversioned: int | None = None,
) -> S:
    """Fold ``inputs`` through ``processor.reduce`` exactly as the engine does; return the state.

    Starts from the contract's initial state; skips what the contract does not
    consume; validates each declared payload (a malformed one is skipped and
    reported) and hands the reduce the validated model; a reduce that raises
    keeps the previous state. An event stored in an older shape is lifted
    through its definition's upcasters (or dropped, if one returns DROP); one
    of a version newer than the contract raises
    :class:`~streamkit.errors.SchemaAhead`, as the engine stalls on it (and a
    malformed payload raises :class:`~streamkit.errors.PayloadMalformed` for a
    contract whose ``on_malformed`` is ``"stall"``).
    Inputs (mappings with the keys of an append, or
    :class:`~streamkit.events.EventInput`) get offsets in input order from 1;
    committed :class:`~streamkit.events.StreamEvent` inputs keep their own.
    No effects run.

    An input that names no ``payload_version``, of a type the contract defines,
    is stamped with the definition's current version, as a host's log stamps
    it (``unversioned=N`` reads it as version N instead, as a host set to
    ``[schema] unversioned = N`` does); one that names a version keeps it.

    Each input is stamped ``created_at`` by ``clock`` (epoch seconds), read as
    it is prepared; the default is a fresh :class:`ManualClock`, the instant the
    ``streamkit_clock`` fixture starts at. A mapping input may carry its own
    ``created_at`` (an aware :class:`~datetime.datetime`, epoch seconds, or the
    log's ISO text), which is kept.
    """
    read_clock = ManualClock() if clock is None else clock
    catalog = EventCatalog([processor.contract], unversioned=unversioned)
    events = []
    for index, item in enumerate(inputs):
        if isinstance(item, StreamEvent):
            events.append(item)
            continue
        created_at: str | None = None
        if isinstance(item, Mapping) and "created_at" in item:
            created_at = _timestamp(index, item["created_at"])
            item = {key: value for key, value in item.items() if key != "created_at"}
        prepared = prepare_event(item, index)
        catalog.stamp(prepared)
        events.append(
            prepared.decoded(
                path="/",
                offset=index + 1,
                created_at=format_timestamp(read_clock()) if created_at is None else created_at,
            )
        )
    fold = Fold(processor)
    state, _ = fold.fold_all(events, processor.contract.initial_state())
    # The engine stalls there; a test must not see a state that silently stopped short.
    fold.raise_if_stopped()
    return state


def _timestamp(index: int, value: object) -> str:
    """An input's own ``created_at`` as the log writes it, or a coded refusal."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return format_timestamp(value.timestamp())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format_timestamp(float(value))
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return format_timestamp(parsed.astimezone(UTC).timestamp())
    raise InvalidEvent(
        f"event #{index}: created_at must be an aware datetime, epoch seconds or ISO-8601 "
        f"text with a zone, got {value!r}; nothing was folded",
        details={"index": index, "field": "created_at"},
    )


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

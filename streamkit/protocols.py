"""The extension points: what a user (or the host) may supply to streamkit.

Each is a :class:`typing.Protocol`, so any object of the right shape works;
nothing needs to inherit from streamkit classes. The log's SQLite streams and
``streamkit.testing.memory_stream`` both satisfy :class:`ProcessorStream`, which
is all a :class:`~streamkit.engine.ProcessorEngine` needs of a stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from streamkit.events import EventInput, ReadPage, StreamEvent

__all__ = ["Clock", "ProcessorStream"]

Clock = Callable[[], float]
"""Wall-clock time in epoch seconds (``time.time`` in production; tests pass their own)."""


@runtime_checkable
class ProcessorStream(Protocol):
    """The stream a processor engine runs over: one path of a log, plus the alarm claim."""

    @property
    def path(self) -> str:
        """The stream path, e.g. ``/`` or ``/orders``."""
        ...

    async def append(self, *events: EventInput | Mapping[str, Any]) -> list[StreamEvent]:
        """Append atomically; return the committed (or, for ephemerals, pushed) events."""
        ...

    async def read(self, after_offset: int = 0, limit: int = 500) -> ReadPage:
        """Read durable events after ``after_offset`` with the scanned-range proof."""
        ...

    async def claim(self, at: float | None) -> None:
        """Ask to be revived by epoch second ``at``; ``None`` releases the claim."""
        ...

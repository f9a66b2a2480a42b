"""The extension points and the backend boundary, as Protocols.

Each is a :class:`typing.Protocol`, so any object of the right shape works;
nothing needs to inherit from streamkit classes.

- :class:`ProcessorStream` is all a :class:`~streamkit.engine.ProcessorEngine`
  needs of a stream; the log's streams and ``streamkit.testing.memory_stream``
  both satisfy it.
- :class:`LogBackend` is what a :class:`~streamkit.log.Log` needs of its
  storage: it executes the requests of :mod:`streamkit._requests` (group
  commits, claims, transactions) and serves reads with their proof. The log
  above it validates, batches and fans out; ``streamkit.backends`` holds one
  package per storage engine, and ``open_log(target)`` picks one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from streamkit._requests import AppendCall, Connection, FollowJob, Job, TransactionJob
from streamkit.events import EventInput, PreparedEvent, ReadPage, StreamEvent

__all__ = ["Clock", "LogBackend", "LogStats", "ProcessorStream"]

T = TypeVar("T")

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


@dataclass(frozen=True, slots=True)
class LogStats:
    """Counters of one open log since it was opened (this process only)."""

    transactions: int
    """Write transactions committed (a group of appends counts once)."""
    appended: int
    """Durable events written (idempotent retries excluded)."""
    ephemeral: int
    """Offsets handed to ephemeral events."""
    ephemeral_reservations: int
    """Writes that reserved a block of offsets for ephemerals."""
    refused: int
    """Append and claim calls refused (their effects rolled back)."""


class LogBackend(Protocol):
    """The storage under a :class:`~streamkit.log.Log`: the backend boundary of the log.

    It keeps the log contract of SPEC section 2 for what it is handed: each
    :class:`~streamkit._requests.AppendCall` lands whole or not at all, at
    dense per-path offsets in commit order, with idempotency keys compared by
    body, ``offset`` and ``expect_head`` judged inside the commit, fences run
    before any row and seals after; refusals settle the call with a coded
    error and write nothing. Reads are one snapshot, so a page's
    ``scanned_through_offset`` is a proof. New commits (its own and other
    processes') are published to the feed the log gave it.
    """

    def submit(self, job: Job | FollowJob) -> None:
        """Queue a request; it is executed in submission order and its future settled."""
        ...

    def try_inline(self, jobs: list[AppendCall] | list[TransactionJob]) -> bool:
        """Execute ``jobs`` now on the calling thread if that costs no wait; False if not run."""
        ...

    def commit_lone(
        self, path: str, event: PreparedEvent, loop: asyncio.AbstractEventLoop
    ) -> list[StreamEvent] | None:
        """Commit one event nothing can refuse, now, if that costs no wait; None if not run."""
        ...

    def follow(self, path: str) -> None:
        """Start publishing other processes' commits on ``path`` to the feed."""
        ...

    def request_close(
        self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
    ) -> None:
        """Take no more requests; finish the queued ones, then release the storage."""
        ...

    def shutdown(self) -> None:
        """Close, blocking until the queued requests are done and the storage is released."""
        ...

    def stats(self) -> LogStats:
        """This backend's counters."""
        ...

    async def query(self, fn: Callable[[Connection], T], what: str = "reading the log") -> T:
        """Run read-only ``fn`` on the backend's read connection."""
        ...

    async def read(self, path: str, after: int, limit: int, upto: int | None) -> ReadPage:
        """Durable events of ``path`` after ``after`` (at most ``limit``, at most ``upto``)."""
        ...

    async def read_sized(
        self, path: str, after: int, limit: int, upto: int | None
    ) -> tuple[ReadPage, int]:
        """:meth:`read`, with the size in bytes of the page's stored JSON."""
        ...

    async def head(self, path: str) -> int:
        """The highest durable offset of ``path`` (0 if it is empty)."""
        ...

    async def paths(self) -> list[str]:
        """Every path holding at least one durable event, sorted."""
        ...

    async def claims(self, path: str) -> dict[str, float]:
        """Every claim on ``path``: claimant -> due epoch second."""
        ...

"""The requests a :class:`~streamkit.log.Log` hands its backend, and how their futures settle.

They are the vocabulary of the backend boundary (:class:`~streamkit.protocols.LogBackend`):
the log validates and prepares, the backend executes. Each job carries the
caller's event loop and an asyncio future; the backend fills in ``result`` or
``error`` and settles every job of a group with one
``call_soon_threadsafe`` per loop (:func:`resolve_jobs`). A caller that cancelled its
wait is skipped: the outcome stands regardless (an append may still commit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamkit._event_builders import PayloadTypes
from streamkit.events import PreparedEvent, StreamEvent

Connection = Any
"""The backend's own connection inside a transaction (a ``sqlite3.Connection`` for SQLite).

Fences, seals and ``write_transaction`` functions are written for one backend;
the log passes the handle through without looking at it."""

Fence = Callable[[Connection], None]
"""Run inside an append's transaction before any row is written; a StreamkitError refuses it."""

Seal = Callable[[Connection, list[StreamEvent]], None]
"""Run inside an append's transaction after its rows are written (a control record's own row)."""

__all__ = [
    "AppendCall",
    "ClaimCall",
    "CloseJob",
    "Connection",
    "Fence",
    "FollowJob",
    "Job",
    "PageRead",
    "QueryJob",
    "Seal",
    "TransactionJob",
    "WriteCall",
    "deliver",
    "resolve_close",
    "resolve_jobs",
]


@dataclass(frozen=True, slots=True)
class PageRead:
    """One page read of a path: its durable events in ``(after, upto]``, at most ``limit``.

    Below the path's start (:mod:`streamkit.history`) the read is refused
    with HISTORY_TRUNCATED, or with ``archive`` served from the archive's
    segment files (refused still where a range was deleted). With ``types``
    (event type -> validate function), the payloads of those types are
    validated into their models as the events are built; one its function
    refuses stays decoded JSON.
    """

    path: str
    after: int
    limit: int
    upto: int | None = None
    types: PayloadTypes | None = None
    archive: bool = False


class Job:
    """One request to the writer thread and its outcome."""

    __slots__ = ("error", "future", "loop", "result")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any] | None) -> None:
        # ``None``: a call run inline at once, whose caller reads the outcome off the job.
        self.loop = loop
        self.future = future
        self.result: Any = None
        self.error: BaseException | None = None


class AppendCall(Job):
    """One ``Stream.append`` call: its events land together or not at all."""

    __slots__ = (
        "certain",
        "ephemerals",
        "events",
        "expect_head",
        "fence",
        "fresh",
        "path",
        "plain",
        "seal",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any] | None,
        path: str,
        events: list[PreparedEvent],
        fence: Fence | None = None,
        seal: Seal | None = None,
        expect_head: int | None = None,
    ) -> None:
        # Job's fields set here rather than through super(): one call fewer per append.
        self.loop = loop
        self.future = future
        self.result = None
        self.error = None
        self.path = path
        self.events = events
        self.fence = fence
        self.seal = seal
        self.expect_head = expect_head
        self.fresh: Sequence[StreamEvent] = ()
        # ``certain``: no idempotency key and no offset precondition, so the call cannot
        # be refused; a fenced, sealed or head-expecting call can be, so it never is.
        # ``plain``: certain and durable only; its events take the next offsets in
        # order, whatever the log holds (the writer's fast path).
        certain = fence is None and seal is None and expect_head is None
        if len(events) == 1:
            event = events[0]
            certain = certain and event.idempotency_key is None and event.offset is None
            self.ephemerals = 1 if event.ephemeral else 0
        else:
            certain = certain and all(
                event.idempotency_key is None and event.offset is None for event in events
            )
            self.ephemerals = sum(1 for event in events if event.ephemeral)
        self.certain = certain
        self.plain = certain and not self.ephemerals


class ClaimCall(Job):
    """Set (``due_at`` a number) or release (``None``) one claimant's claim on a path."""

    __slots__ = ("due_at", "path", "slug")

    # What a group commit asks of each call, answered for a claim once here.
    ephemerals = 0
    plain = False

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        path: str,
        slug: str,
        due_at: float | None,
    ) -> None:
        super().__init__(loop, future)
        self.path = path
        self.slug = slug
        self.due_at = due_at


class _FunctionJob(Job):
    """A caller's function to run on the backend's connection."""

    __slots__ = ("fn",)

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        fn: Callable[[Connection], Any],
    ) -> None:
        super().__init__(loop, future)
        self.fn = fn


class TransactionJob(_FunctionJob):
    """A caller's function run atomically in a ``BEGIN IMMEDIATE`` transaction.

    A ``short`` one (a few statements) may share the transaction of a group
    commit with the appends queued beside it, in a savepoint of its own.
    """

    __slots__ = ("short",)

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        fn: Callable[[Connection], Any],
        *,
        short: bool = False,
    ) -> None:
        super().__init__(loop, future, fn)
        self.short = short


class QueryJob(_FunctionJob):
    """A read run on the writer connection (an in-memory log has no second connection)."""

    __slots__ = ()


@dataclass(slots=True)
class FollowJob:
    """A new follower of ``path``: start watching it and tell followers where pushes start."""

    path: str


@dataclass(slots=True)
class CloseJob:
    """Stop the writer thread once the jobs queued before it are done."""

    pass


WriteCall = AppendCall | ClaimCall
"""The calls a group commit batches into one transaction."""


def deliver(
    jobs: list[Job],
    wakes: dict[asyncio.AbstractEventLoop, list[asyncio.Event]],
    direct: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Settle ``jobs`` and wake ``wakes`` from the backend's thread: one hand-off per loop.

    ``direct`` is the loop running this call (a commit made inline on it):
    its jobs are settled at once, with no hand-off.
    """
    if direct is not None and not wakes:
        for job in jobs:
            if job.loop is not direct:
                break
        else:
            resolve_jobs(jobs, [])
            return
    by_loop: dict[asyncio.AbstractEventLoop, tuple[list[Job], list[asyncio.Event]]] = {}
    for job in jobs:
        by_loop.setdefault(job.loop, ([], []))[0].append(job)
    for loop, events in wakes.items():
        by_loop.setdefault(loop, ([], []))[1].extend(events)
    for loop, (loop_jobs, loop_events) in by_loop.items():
        if loop is direct:
            resolve_jobs(loop_jobs, loop_events)
            continue
        # A closed loop raises: nobody awaits its futures any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(resolve_jobs, loop_jobs, loop_events)


def resolve_jobs(jobs: list[Job], events: list[asyncio.Event]) -> None:
    """Settle the jobs' futures and set the followers' events (runs on their loop)."""
    for job in jobs:
        future = job.future
        if future is None or future.done():
            # No future: the caller reads the outcome off the job. Done: the caller
            # cancelled its wait; the outcome stands regardless.
            continue
        if job.error is not None:
            future.set_exception(job.error)
        else:
            future.set_result(job.result)
    for event in events:
        event.set()


def resolve_close(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

"""The log: append-only streams of events, partitioned by path, over a backend.

Guarantees (SPEC section 2; ``docs/log.md`` explains each), kept by every
backend (:class:`~streamkit.protocols.LogBackend`; the contract suites of
``tests/contract`` hold each backend to them):

- An append is atomic: all of its events land, or none does.
- Offsets of a path start at 1 and strictly increase in commit order; an offset
  is never reused, not across processes, not after a crash. No durable event
  lands at or below an offset handed to an ephemeral. Durable events appended
  with no ephemeral between them are consecutive; a refused append leaves no hole.
- An idempotent retry (same key, same body) appends nothing and returns the
  committed event; a different body under the same key is refused.
- A read's ``scanned_through_offset`` never passes the durable head.
- An append acknowledged at ``synchronous="FULL"`` survives a crash of the
  process and of the machine; refusals leave the log serving.

What this module adds above the backend: every append checked against the
log's catalog (the events and a stream's arguments are checked as the
stream prepares them, :mod:`._stream`: nothing malformed reaches storage),
the gathering of the appends that become ready in one event-loop turn
into one group commit (a processor's write made while clients contend
waits briefly to join a client's: see :meth:`Log.clients_contend`), and
the fan-out of new events to followers. One :class:`Log` per process and
target serves its readers and writers (followers in the process see each
commit once); ``open_log`` (in :mod:`streamkit.backends`) builds it over
the backend the target names. A PostgreSQL retention run commits its cuts
through a second, private one (:mod:`streamkit.backends._retention.run`):
there two logs are two writers, as two hosts are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from streamkit._requests import (
    AppendCall,
    ClaimCall,
    Connection,
    Fence,
    PageRead,
    Seal,
    TransactionJob,
)
from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.catalog import EventCatalog
from streamkit.errors import HistoryTruncated, InvalidRequest, LogClosed
from streamkit.events import (
    ReadPage,
    StreamEvent,
    prepare_event,
    validate_path,
)
from streamkit.log._follow import MAX_BUFFERED_BYTES, Feed, Follow, wake
from streamkit.log._grouping import CommitGrouping
from streamkit.log._shared_pages import SHARED_PAGE_EVENTS, Key, SharedPages
from streamkit.log._stream import Stream, check_int
from streamkit.protocols import (
    LogBackend,
    LogStats,
    StoredType,
)

__all__ = ["Log"]

T = TypeVar("T")


class Log:
    """An open log. Cheap to share between tasks; close it once, when done.

    Build one with :func:`streamkit.open_log`, which opens the backend the
    target names and hands it here.
    """

    path: str
    """What the log was opened on: a file path, ``":memory:"`` or a URL."""

    def __init__(
        self,
        path: str,
        backend: Callable[[Feed], LogBackend],
        *,
        inline_commits: bool = True,
        follower_bytes: int = MAX_BUFFERED_BYTES,
        read_only: bool = False,
        catalog: EventCatalog | None = None,
    ) -> None:
        """Open ``backend(feed)`` under this log (``open_log`` does this; prefer it)."""
        self._read_only = read_only
        # The definitions every append of a type they know must fit (see streamkit.catalog).
        self._catalog = catalog if catalog else None
        check_int("follower_bytes", follower_bytes, 1)
        self.shared_pages = SharedPages()
        """Full pages read lately, handed to the next reader of the same range (see its module)."""
        self.path = path
        self._feed = Feed(follower_bytes)
        self._backend = backend(self._feed)
        # Inline commits (and the processors' writes held to ride clients') are a
        # speed trick: off under STREAMKIT_PLAIN=1.
        self._grouping = CommitGrouping(
            self._backend, inline_commits and not read_only and SPEED_TRICKS
        )
        self._streams: dict[str, Stream] = {}
        self._closed = False
        # Closes the backend if the Log is dropped unclosed (or at exit).
        self._finalizer = weakref.finalize(self, _shutdown, self._backend, self._feed)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Log {self.path!r} {state}>"

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Log:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the log, blocking until queued appends have committed. Idempotent.

        Followers end (``StopAsyncIteration``); later calls raise
        :class:`~streamkit.errors.LogClosed`. Prefer :meth:`aclose` on an event loop.
        """
        self._grouping.queue_pending()
        self._closed = True
        self.shared_pages.clear()
        self._finalizer()

    async def aclose(self) -> None:
        """Close the log without blocking the loop: queued appends commit first. Idempotent."""
        self._grouping.queue_pending()
        self._closed = True
        self.shared_pages.clear()
        wake(self._feed.close_all())
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._backend.request_close((loop, done))
        await done
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` or :meth:`aclose` was called."""
        return self._closed

    @property
    def stats(self) -> LogStats:
        """A snapshot of this log's counters (see :class:`~streamkit.protocols.LogStats`)."""
        return self._backend.stats()

    def follow_age(self) -> float | None:
        """Seconds since the log last looked for other processes' commits (None: nobody follows).

        Followers (every processor a host runs) hear of other processes'
        commits only through that look; an age that keeps growing means they
        hear of nothing any more, whatever else still answers.
        """
        looked = self._backend.follow_looked_at()
        return None if looked is None else max(0.0, time.monotonic() - looked)

    def clients_contend(self) -> bool:
        """Whether clients compete with processors for this log now (see ``CommitGrouping``).

        True while a client's append (one without a lease's fence) waits for
        its commit; only then does a processor's write wait briefly to share
        a client's commit, and a host pause its processors between ranges.
        """
        return self._grouping.clients_contend()

    @property
    def held_writes(self) -> int:
        """Processors' writes that waited for a client's commit to share it."""
        return self._grouping.held_writes

    @property
    def client_handovers(self) -> int:
        """Clients' appends that could not commit at once (each was in flight for a while)."""
        return self._grouping.client_handovers

    @property
    def read_only(self) -> bool:
        """Whether the log was opened read-only (every write is refused, nothing written)."""
        return self._read_only

    @property
    def backend(self) -> LogBackend:
        """The storage under this log (for streamkit's own layers; users need not touch it)."""
        return self._backend

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise InvalidRequest(
                f"the log {self.path!r} was opened read-only; nothing was written (open it "
                "without read_only, with write access to the file and its directory, to write)",
                details={"path": self.path},
            )

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(
                f"the log {self.path!r} is closed; nothing was read or written "
                "(open it again to use it)"
            )

    # -- streams --------------------------------------------------------------------------

    def stream(self, path: str = "/") -> Stream:
        """The stream at ``path`` (``/`` or ``/a/b``); the same object for the same path."""
        stream = self._streams.get(path) if isinstance(path, str) else None
        if stream is None:
            self._check_open()
            stream = self._streams[validate_path(path)] = Stream(self, path)
        return stream

    async def paths(self) -> list[str]:
        """Every stream path that holds at least one durable event, sorted."""
        self._check_open()
        return await self._backend.paths()

    async def stored_types(self, path: str | None = None) -> list[StoredType]:
        """What the log holds per (path, type, payload version): count, first and last offset.

        Read from the summary every writer keeps in its commits' transactions,
        so it costs one small read whatever the log's size (``streamkit schema
        check`` and a host's check at start ask it). Of ``path`` only if given;
        sorted by path, type and version.
        """
        self._check_open()
        return await self._backend.stored_types(path)

    async def recount_stored_types(self) -> None:
        """Count the summary of stored types again from the events, in one write transaction.

        Reads the whole log once. Needed only when a writer of a release before
        the summary appended after the log was upgraded (``streamkit schema
        check`` says so); appends wait for it, and none is counted twice.
        """
        await self.write_transaction(self._backend.recount_stored_types)

    # -- the writer connection ------------------------------------------------------------

    async def write_transaction(
        self, fn: Callable[[Connection], T], *, inline: bool = False, processor: bool = False
    ) -> T:
        """Run ``fn(conn)`` on the backend's writer connection in its own write transaction.

        ``conn`` is the backend's connection (a ``sqlite3.Connection`` for
        SQLite, in ``BEGIN IMMEDIATE``). It runs on the writer, in order with
        appends, so a process keeps one writer connection. The transaction commits when ``fn`` returns and
        rolls back if it raises (the exception is re-raised; a ``sqlite3`` error
        as :class:`~streamkit.errors.StorageError`). ``fn`` must not begin or
        end transactions nor write the ``streamkit_*`` tables. Cancelling the
        wait does not stop ``fn``.

        ``inline=True`` is for a short ``fn`` (a few statements): when the log
        commits inline (``open_log(inline_commits=True)``), the writer is idle
        and nothing else is ready to run on the event loop, ``fn`` and its
        commit run on the loop, skipping the hand-off to the writer thread and
        back, as a lone append does. It never waits for another process's
        lock there: the thread takes the transaction instead. A short ``fn``
        may also share one group commit with the appends queued beside it
        (one fsync for all), in a savepoint of its own: its writes still
        commit together or not at all, and its error is its own.

        ``processor=True`` (with ``inline``) marks a processor's write, such as
        its checkpoint: while clients contend (:meth:`clients_contend`) it waits
        up to :data:`~streamkit.log._grouping.HOLD_SECONDS` to share a client's commit, as a fenced
        append does.
        """
        self._check_writable()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        # ``fn`` is the caller's code: only on request (short) may it hold the event loop,
        # and only when nothing else is waiting to run (``CommitGrouping.hand``).
        self._grouping.hand(TransactionJob(loop, future, fn, short=inline), processor=processor)
        return await future

    async def query(self, fn: Callable[[Connection], T]) -> T:
        """Run read-only ``fn(conn)`` on the backend's reader connection and return its result.

        The reader sees every committed transaction and never waits for the
        writer. ``fn`` runs on the event loop's thread, so keep it short and
        exhaust the cursors it opens. (An in-memory SQLite log has one
        connection: there ``fn`` runs on the writer thread.)
        """
        self._check_open()
        return await self._backend.query(fn)

    async def _read_sized(self, read: PageRead) -> tuple[ReadPage, int]:
        self._check_open()
        if read.archive:
            # Only a read below the path's start differs (it is served from the archive, for
            # the few that need it: rebuilds, new processors): every other is the plain read.
            try:
                return await self._read_sized(dataclasses.replace(read, archive=False))
            except HistoryTruncated:
                return await self._backend.read_sized(read)
        if not SPEED_TRICKS:
            return await self._backend.read_sized(read)
        path, after, limit, upto, types = read.path, read.after, read.limit, read.upto, read.types
        pages = self.shared_pages
        if limit > SHARED_PAGE_EVENTS and pages.is_shared(path):
            limit = SHARED_PAGE_EVENTS  # the size its pages are shared at (SharedPages)
            read = dataclasses.replace(read, limit=limit)
        # Validators compare equal for one model, so readers of the same types meet.
        key: Key = (path, after, limit, upto, frozenset(types.items()) if types else None)
        shared = pages.get(key)
        if shared is None and types:
            # A plain page of the range will do: the typed reader's fold types it.
            shared = pages.get((path, after, limit, upto, None))
        if shared is not None:
            return shared
        page, size = await self._backend.read_sized(read)
        return pages.keep(key, page, size), size

    async def _read(self, read: PageRead) -> ReadPage:
        page, _ = await self._read_sized(read)
        return page

    async def append_control(
        self, path: str, event: Mapping[str, Any], seal: Seal, *, first: Fence | None = None
    ) -> StreamEvent:
        """(For streamkit's operator verbs.) Append one control event and ``seal`` it.

        The event may use the reserved ``streamkit.`` namespace. ``seal(conn,
        [event])`` runs in the same transaction after the event's row is
        written (an idempotent hit passes the existing event), so the control
        record it writes and the event commit together or not at all; a host
        honours a control event only with its record beside it.

        ``first(conn)``, if given, runs in the same transaction before the
        event is placed: on PostgreSQL before the path's head row is locked,
        so appends to the path do not wait for it (only for the seal and the
        commit). A StreamkitError from it refuses the call, nothing written.
        """
        path = self.stream(path).path
        outcome = self._append(path, [prepare_event(event, control=True)], first, seal=seal)
        (committed,) = outcome if isinstance(outcome, list) else await outcome
        return committed

    def _append(
        self,
        path: str,
        events: list[Any],
        fence: Fence | None = None,
        *,
        seal: Seal | None = None,
        expect_head: int | None = None,
    ) -> list[StreamEvent] | asyncio.Future[list[StreamEvent]]:
        """Commit one append call: its committed events, or a future of them.

        When the log commits now (``CommitGrouping.hand``) the call is a group of
        one, run on the loop at once: its outcome is on the call when the
        backend's ``try_inline`` returns, so there is no future to settle and
        no coroutine to wait on (the caller awaits only a future). Else, or if
        the backend declines, it is handed over and the future comes back.
        """
        if self._closed or self._read_only:
            self._check_writable()
        if self._catalog is not None:
            events = self._catalog.admit(events)
        call = AppendCall(asyncio.get_running_loop(), None, path, events, fence, seal, expect_head)
        grouping = self._grouping
        future = grouping.hand(call, processor=fence is not None)
        if future is None:
            if call.error is not None:
                raise call.error
            committed: list[StreamEvent] = call.result
            return committed
        if fence is None:
            grouping.client_waits(future, call)
        return future

    async def _submit_claim(self, path: str, slug: str, due_at: float | None) -> None:
        self._check_writable()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._backend.submit(ClaimCall(loop, future, path, slug, due_at))
        await future

    def _follow(self, path: str, after_offset: int) -> Follow:
        self._check_open()
        return Follow(
            self._feed,
            path,
            after_offset,
            self._read_sized,
            self._backend.follow,
        )


def _shutdown(backend: LogBackend, feed: Feed) -> None:
    wake(feed.close_all())
    backend.shutdown()

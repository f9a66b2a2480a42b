"""The SQLite backend of a log: one file, one writer connection, one reader connection.

:class:`SqliteLogBackend` implements :class:`~streamkit.protocols.LogBackend`.
The writer connection belongs to the writer thread (:mod:`._writer`), which
runs every write request in order (group commits, claims, transactions); the
reader connection serves reads on the caller's thread, so a read never queues
behind a commit (WAL gives it a snapshot of the committed log). An in-memory
database cannot be shared between two connections without the writer's
commits making the reader fail (SQLITE_LOCKED under a shared cache), so there
every read is a request to the writer thread instead.

Every ``sqlite3`` failure of a read leaves here as a
:class:`~streamkit.errors.StorageError` (or ``StorageBusy``), never raw.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from streamkit._requests import AppendCall, FollowJob, Job, PageRead, QueryJob, TransactionJob
from streamkit.backends._storage import LogOptions
from streamkit.backends._writer_thread import check_busy_timeout
from streamkit.backends.sqlite._layout import recount_stored_types
from streamkit.backends.sqlite._read import (
    durable_head,
    read_page_sized,
    stored_types,
    stream_paths,
)
from streamkit.backends.sqlite._schema import (
    MEMORY,
    connect_read_only,
    connect_reader,
    connect_writer,
    storage_error,
)
from streamkit.backends.sqlite._wal_guard import WalIdentity
from streamkit.backends.sqlite._writer import Writer
from streamkit.errors import InvalidRequest
from streamkit.events import ReadPage
from streamkit.log import Feed
from streamkit.protocols import LogStats, StoredType

__all__ = ["SqliteLogBackend"]

T = TypeVar("T")

_CLAIMS = "SELECT slug, due_at FROM streamkit_claims WHERE path = ? ORDER BY slug"


class SqliteLogBackend:
    """A log's storage in one SQLite file (or ``":memory:"``)."""

    def __init__(
        self,
        path: str,
        feed: Feed,
        options: LogOptions,
    ) -> None:
        synchronous, busy_timeout = options.synchronous, options.busy_timeout
        read_only = options.read_only
        if synchronous not in ("FULL", "NORMAL"):
            raise InvalidRequest(
                f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}; nothing was opened",
                details={"synchronous": repr(synchronous)},
            )
        check_busy_timeout(busy_timeout)
        memory = path == MEMORY
        if read_only:
            if memory:
                raise InvalidRequest(
                    "an in-memory log cannot be opened read-only (it would be empty); nothing "
                    "was opened"
                )
            conn = connect_read_only(path, busy_timeout=busy_timeout)
        else:
            conn = connect_writer(path, synchronous=synchronous, busy_timeout=busy_timeout)
        reader: sqlite3.Connection | None = None
        if not memory:
            try:
                reader = (
                    connect_read_only(path, busy_timeout=busy_timeout)
                    if read_only
                    else connect_reader(path, busy_timeout=busy_timeout)
                )
            except BaseException:
                conn.close()
                raise
        self.path = path
        self.busy_timeout = busy_timeout
        self._reader = reader
        self._reader_lock = threading.Lock()
        self.writer = Writer(
            conn,
            token=secrets.token_hex(8),
            clock=options.clock,
            feed=feed,
            persistent=not memory,
            busy_timeout=busy_timeout,
            wal=None if memory or read_only else WalIdentity(path),
        )
        # The writer's own methods, bound here: every append passes one of them, and a
        # delegating method would be one call more each time.
        self.submit: Callable[[Job | FollowJob], None] = self.writer.thread.submit
        """Queue a job for the writer thread (raises LogClosed once closing)."""
        self.try_inline: Callable[[list[AppendCall | TransactionJob]], bool] = (
            self.writer.try_inline
        )
        """Run jobs now on this thread if the writer is idle; False to queue them."""

    # -- writes: requests to the writer thread ------------------------------------------

    def follow(self, path: str) -> None:
        """Start pushing other processes' commits on ``path`` to the feed."""
        self.writer.thread.submit(FollowJob(path))

    def request_close(
        self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
    ) -> None:
        """Stop taking requests; queued ones finish, then the connections close."""
        self.writer.thread.request_close(waiter)

    def shutdown(self) -> None:
        """Close and wait for the writer thread (blocking), then close the reader."""
        self.writer.thread.request_close()
        self.writer.thread.join()
        if self._reader is not None:
            self._reader.close()

    def follow_looked_at(self) -> float | None:
        """When the writer last looked for other processes' commits (None: nobody follows)."""
        return self.writer.looked_at()

    def stats(self) -> LogStats:
        """The writer's counters since the log was opened."""
        return self.writer.counters.stats()

    # -- reads: the reader connection -----------------------------------------------------

    async def query(
        self, fn: Callable[[sqlite3.Connection], T], what: str = "reading the log"
    ) -> T:
        """Run read-only ``fn(conn)`` on the reader connection (the writer's, in memory)."""
        if self._reader is None:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[T] = loop.create_future()
            self.writer.thread.submit(QueryJob(loop, future, fn))
            return await future
        with self._reader_lock:
            try:
                return fn(self._reader)
            except sqlite3.Error as exc:
                raise storage_error(exc, what) from exc

    async def read_sized(self, read: PageRead) -> tuple[ReadPage, int]:
        """The page ``read`` asks for (proof included) and its stored JSON bytes."""
        return await self.query(lambda conn: read_page_sized(conn, read), f"reading {read.path!r}")

    async def head(self, path: str) -> int:
        """The durable head of ``path`` (0 if empty)."""
        return await self.query(lambda conn: durable_head(conn, path))

    async def paths(self) -> list[str]:
        """Every path holding a durable event, sorted."""
        return await self.query(stream_paths)

    async def stored_types(self, path: str | None = None) -> list[StoredType]:
        """What the log holds per (path, type, payload version), from its summary."""
        return await self.query(lambda conn: stored_types(conn, path))

    def recount_stored_types(self, conn: sqlite3.Connection) -> None:
        """Count the summary again from the events (``conn`` holds the write lock)."""
        recount_stored_types(conn)

    async def claims(self, path: str) -> dict[str, float]:
        """Every claim on ``path``: claimant -> due epoch second."""
        rows: list[Any] = await self.query(lambda conn: conn.execute(_CLAIMS, (path,)).fetchall())
        return dict(rows)

"""The PostgreSQL backend of a log: a writer thread, a listener thread and reader threads.

:class:`PostgresLogBackend` implements :class:`~streamkit.protocols.LogBackend`
over one PostgreSQL schema (:mod:`._target`, :mod:`._schema`):

- writes go to the writer thread (:mod:`._writer`), in order, in group
  commits; no commit ever runs on an event loop;
- reads run on a small pool of reader threads, one connection each, so a
  read never waits behind a commit and the loop never waits on the network;
  each read is one statement, one snapshot (:mod:`._read`);
- other processes' commits reach this process's followers through the
  listener thread (:mod:`._listener`), started by the first follower.

Opening connects once and creates the schema if missing (idempotent, safe
when several hosts start together); an unreachable server or a schema of
another version refuses the open with :class:`~streamkit.errors.LogOpenError`.
Every ``psycopg`` failure of a read leaves here as a coded
:class:`~streamkit.errors.StorageError`, never raw.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg

from streamkit._requests import AppendCall, FollowJob, Job, PageRead, TransactionJob
from streamkit._targets import PostgresTarget
from streamkit.backends._storage import LogOptions
from streamkit.backends._writer_thread import check_busy_timeout
from streamkit.backends.postgres._connect import (
    connect,
    is_disconnect,
    open_error,
    storage_error,
)
from streamkit.backends.postgres._listener import Listener
from streamkit.backends.postgres._notify import Fed
from streamkit.backends.postgres._read import Reads
from streamkit.backends.postgres._schema import (
    ensure_schema,
    recount_stored_types,
    stored_version,
)
from streamkit.backends.postgres._writer import Writer
from streamkit.errors import InvalidRequest, LogClosed, LogOpenError, StorageError
from streamkit.events import ReadPage
from streamkit.log import Feed, Log
from streamkit.protocols import LogStats, StoredType

__all__ = ["READERS", "PostgresLogBackend", "second_log"]

T = TypeVar("T")

READERS = 4
"""Reader threads (and connections) per open log."""


class PostgresLogBackend:
    """A log's storage in one schema of a PostgreSQL database."""

    def __init__(
        self,
        target: PostgresTarget,
        feed: Feed,
        options: LogOptions,
    ) -> None:
        synchronous, busy_timeout = options.synchronous, options.busy_timeout
        if synchronous != "FULL":
            raise InvalidRequest(
                f"synchronous={synchronous!r} is a SQLite setting; a PostgreSQL log commits as "
                "durably as the server's synchronous_commit says; nothing was opened (leave "
                "synchronous at 'FULL')",
                details={"synchronous": repr(synchronous)},
            )
        check_busy_timeout(busy_timeout)
        self.path = target.shown
        self.target = target
        self.options = options
        self._prepare(target, options.read_only)
        self._fed = Fed()
        self._feed = feed
        self.writer = Writer(
            target,
            feed,
            self._fed,
            token=secrets.token_hex(8),
            clock=options.clock,
            busy_timeout=busy_timeout,
        )
        self.listener = Listener(target, feed, self._fed)
        self._schema = target.schema
        self._reads = Reads(target.schema)
        self._local = threading.local()
        self._connections: list[psycopg.Connection[Any]] = []
        self._connections_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="streamkit-pg-read")
        self._reads_closed = False
        self.submit: Callable[[Job | FollowJob], None] = self._submit
        self.try_inline: Callable[[list[AppendCall | TransactionJob]], bool] = (
            self.writer.try_inline
        )

    @staticmethod
    def _prepare(target: PostgresTarget, read_only: bool) -> None:
        """Connect once; create the schema (or, read-only, find it); refuse what cannot be used."""
        try:
            conn = connect(
                target.conninfo,
                target.shown,
                outcome="nothing was opened (check the URL, and that the server runs)",
            )
        except StorageError as exc:
            raise open_error(exc, target.shown) from exc
        try:
            if read_only:
                if stored_version(conn, target.schema) is None:
                    raise LogOpenError(
                        f"the schema {target.schema!r} of {target.shown!r} holds no streamkit "
                        "log, and a read-only open creates nothing; nothing was opened",
                        details={"target": target.shown, "schema": target.schema},
                    )
            else:
                ensure_schema(conn, target.schema, target.shown)
        except psycopg.Error as exc:
            raise open_error(
                storage_error(exc, "preparing the log's tables"), target.shown
            ) from exc
        finally:
            conn.close()

    # -- writes: requests to the writer thread ------------------------------------------

    def _submit(self, job: Job | FollowJob) -> None:
        if isinstance(job, FollowJob):
            self.listener.follow(job.path)
        else:
            self.writer.thread.submit(job)

    def follow(self, path: str) -> None:
        """Start publishing other processes' commits on ``path`` to the feed."""
        self.listener.follow(path)

    def request_close(
        self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
    ) -> None:
        """Stop taking requests; queued ones finish, then the connections close."""
        self.writer.thread.request_close(waiter)
        # The rest is released off the caller's thread: joining threads may take a moment.
        threading.Thread(target=self._release, name="streamkit-pg-close", daemon=True).start()

    def shutdown(self) -> None:
        """Close and wait for every thread (blocking)."""
        self.writer.thread.request_close()
        self.writer.thread.join()
        self._release()

    def _release(self) -> None:
        self.writer.thread.join()
        self.listener.close()
        self._reads_closed = True
        self._pool.shutdown(wait=True)
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def follow_looked_at(self) -> float | None:
        """When the listener last read the followed paths (None before anyone followed)."""
        return self.listener.looked_at

    def stats(self) -> LogStats:
        """The writer's counters since the log was opened."""
        return dataclasses.replace(
            self.writer.counters.stats(), frozen_sessions_ended=self.writer.frozen_ended
        )

    # -- reads: the reader threads --------------------------------------------------------

    def _reader(self) -> tuple[psycopg.Connection[Any], bool]:
        """This reader thread's connection, and whether it was made just now."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed and not conn.broken:
            return conn, False
        conn = connect(self.target.conninfo, self.target.shown, role="reader")
        self._local.conn = conn
        with self._connections_lock:
            self._connections.append(conn)
        return conn, True

    def _run_read(self, fn: Callable[[psycopg.Connection[Any]], T], what: str) -> T:
        conn, fresh = self._reader()
        try:
            return fn(conn)
        except psycopg.Error as exc:
            if fresh or not is_disconnect(exc):
                raise storage_error(exc, what, outcome="nothing was read") from exc
        # A connection kept from before that broke while idle (the server restarted, or
        # ended it): found out only now. A read changes nothing, so it runs once more on
        # a new connection; if that fails too, the server really is out of reach.
        with contextlib.suppress(psycopg.Error):
            conn.close()
        conn, _ = self._reader()
        try:
            return fn(conn)
        except psycopg.Error as exc:
            raise storage_error(exc, what, outcome="nothing was read") from exc

    async def query(
        self, fn: Callable[[psycopg.Connection[Any]], T], what: str = "reading the log"
    ) -> T:
        """Run read-only ``fn(conn)`` on a reader connection (autocommit: one snapshot per statement)."""
        loop = asyncio.get_running_loop()
        if self._reads_closed:
            raise _closed()
        try:
            reading = loop.run_in_executor(self._pool, self._run_read, fn, what)
        except RuntimeError:
            if self._reads_closed:  # closed between the check and the submit
                raise _closed() from None
            raise
        return await reading

    async def read_sized(self, read: PageRead) -> tuple[ReadPage, int]:
        """The page ``read`` asks for (proof included) and its stored JSON bytes."""
        reads = self._reads
        return await self.query(lambda conn: reads.page_sized(conn, read), f"reading {read.path!r}")

    async def head(self, path: str) -> int:
        """The durable head of ``path`` (0 if empty)."""
        return await self.query(lambda conn: self._reads.head(conn, path))

    async def paths(self) -> list[str]:
        """Every path holding a durable event, sorted."""
        return await self.query(self._reads.paths)

    async def stored_types(self, path: str | None = None) -> list[StoredType]:
        """What the log holds per (path, type, payload version), from its summary."""
        return await self.query(lambda conn: self._reads.stored_types(conn, path))

    def recount_stored_types(self, conn: psycopg.Connection[Any]) -> None:
        """Count the summary again from the events, in the writer's open transaction."""
        recount_stored_types(conn, self._schema)

    async def claims(self, path: str) -> dict[str, float]:
        """Every claim on ``path``: claimant -> due epoch second."""
        return await self.query(lambda conn: self._reads.claims(conn, path))


def _closed() -> LogClosed:
    return LogClosed("the log is closed; nothing was read or written (open it again to use it)")


def second_log(backend: PostgresLogBackend) -> Log:
    """A log over ``backend``'s schema with a writer (and connections) of its own (blocks: it
    connects).

    Its commits do not queue behind the first log's, nor theirs behind its: a
    retention run commits its cuts through one
    (:mod:`streamkit.backends._retention.run`). Close it when done.
    """
    return Log(
        backend.path,
        functools.partial(PostgresLogBackend, backend.target, options=backend.options),
        inline_commits=False,
    )

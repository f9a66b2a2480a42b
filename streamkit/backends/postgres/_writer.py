"""The writer thread of a PostgreSQL log: every write on one connection, in order.

One thread owns the writer connection; ``psycopg`` calls block (a commit waits
for the server's WAL flush), so they never run on an event loop. Callers
enqueue jobs with an asyncio future (:mod:`streamkit.backends._writer_thread`);
the thread takes everything queued (up to a cap) and runs the write calls as
one group commit (:mod:`._group_commit`), transactions of a caller's
function one by one. A connection that broke is opened again for the next
job; on a clean close the unused rest of this writer's ephemeral blocks is
given back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import psycopg

from streamkit._requests import AppendCall, ClaimCall, CloseJob, TransactionJob, WriteCall
from streamkit._targets import PostgresTarget
from streamkit.backends._blocks import PathState
from streamkit.backends._writer_thread import WriterThread
from streamkit.backends.postgres._connect import connect, session_options, storage_error
from streamkit.backends.postgres._group_commit import GroupCommit
from streamkit.backends.postgres._notify import Fed
from streamkit.errors import StorageError
from streamkit.events import format_timestamp, now_timestamp
from streamkit.log._follow import Feed
from streamkit.protocols import Clock

__all__ = ["Writer"]

GROUP_LIMIT = 1000
"""Calls per group commit at most, so one huge backlog cannot delay every caller behind it."""

_RELEASE = (
    "UPDATE {s}.streamkit_heads SET reserved_through = GREATEST(head, %s), reserved_by = '' "
    "WHERE path = %s AND reserved_by = %s"
)


class Writer(WriterThread, GroupCommit):
    """The writer thread and the state it alone touches."""

    def __init__(
        self,
        target: PostgresTarget,
        feed: Feed,
        fed: Fed,
        *,
        token: str,
        clock: Clock,
        busy_timeout: float,
        group_limit: int = GROUP_LIMIT,
    ) -> None:
        self._target = target
        self._schema = target.schema
        self._init_statements(target.schema)
        self._release = _RELEASE.replace("{s}", f'"{target.schema}"')
        # A row lock another transaction holds is waited for up to busy_timeout.
        self._options = session_options(busy_timeout)
        self._conn: psycopg.Connection[Any] | None = self._connect()
        self._token = token
        self._timestamp: Callable[[], str] = (
            now_timestamp if clock is time.time else lambda: format_timestamp(clock())
        )
        self._last_stamp = ""
        self._feed = feed
        self._fed = fed
        self._group_limit = group_limit
        self._init_queue()
        self._states: dict[str, PathState] = {}
        self._committing = False
        self.transactions = 0
        self.appended = 0
        self.ephemeral = 0
        self.ephemeral_reservations = 0
        self.refused = 0
        self._start_thread(self._run, "streamkit-pg-writer")

    def _connect(self) -> psycopg.Connection[Any]:
        return connect(
            self._target.conninfo, self._target.shown, options=self._options, role="writer"
        )

    def _connection(self) -> psycopg.Connection[Any]:
        """The writer connection, opened again if it broke (StorageUnavailable if it cannot be)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            self._conn = None
            conn = self._conn = self._connect()
        return conn

    # -- the caller's side (any thread) ---------------------------------------------------

    def try_inline(self, jobs: list[AppendCall | TransactionJob]) -> bool:
        """Never: a commit is a network round trip, which must not block an event loop."""
        return False

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                jobs = self._take(self._queue.get(), self._group_limit)
                if self._handle(jobs):
                    return
        finally:
            try:
                if self._conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        self._conn.close()
            finally:
                self._finish()

    def _handle(self, jobs: list[Any]) -> bool:
        """Run a batch of jobs in order; True once a close was among them (the thread ends)."""
        group: list[WriteCall] = []
        for job in jobs:
            if isinstance(job, AppendCall | ClaimCall):
                group.append(job)
                continue
            if group:
                self._guarded(self._run_group, group)
                group = []
            if isinstance(job, TransactionJob):
                self._guarded(self._run_transaction, job)
            elif isinstance(job, CloseJob):
                self._release_reservations()
                return True
        if group:
            self._guarded(self._run_group, group)
        return False

    # -- other jobs -----------------------------------------------------------------------

    def _run_transaction(self, job: TransactionJob) -> None:
        self._settle.append(job)
        try:
            conn = self._connection()
            with conn.transaction():
                result = job.fn(conn)
            job.result = result
            self.transactions += 1
        except psycopg.Error as exc:
            job.error = storage_error(exc, "write_transaction")
            job.error.__cause__ = exc
        except BaseException as exc:  # whatever fn raises goes back to its caller
            job.error = exc
        finally:
            # The function may have touched any table: trust nothing cached.
            for state in self._states.values():
                state.head = None

    def _release_reservations(self) -> None:
        """Give back the unused rest of own blocks so a clean restart leaves no hole."""
        own = [
            (state.last_ephemeral, path)
            for path, state in self._states.items()
            if state.mine and state.last_ephemeral
        ]
        if not own:
            return
        try:
            conn = self._connection()
            with conn.transaction():
                for last, path in own:
                    # Still at or above every offset this writer handed out, so nothing is reused.
                    conn.execute(self._release, (last, path, self._token))
        except (psycopg.Error, StorageError):
            pass  # keeping the block only costs a hole in the offsets; nothing is lost

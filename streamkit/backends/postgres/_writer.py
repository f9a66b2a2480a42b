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
from typing import Any

import psycopg
from psycopg import pq

from streamkit._requests import (
    AppendCall,
    ClaimCall,
    CloseJob,
    TransactionJob,
    WriteCall,
)
from streamkit._targets import PostgresTarget
from streamkit.backends._group_commit import GroupCommit, WriteCounters
from streamkit.backends._settling import Settling
from streamkit.backends._stamps import Stamps
from streamkit.backends._writer_thread import WriterThread
from streamkit.backends.postgres._connect import connect, session_options
from streamkit.backends.postgres._frozen import FrozenSessions
from streamkit.backends.postgres._group_commit import PostgresStatements
from streamkit.backends.postgres._notify import Fed
from streamkit.errors import StorageError
from streamkit.log import Feed
from streamkit.protocols import Clock

__all__ = ["Writer"]

GROUP_LIMIT = 1000
"""Calls per group commit at most, so one huge backlog cannot delay every caller behind it."""

_RELEASE = (
    "UPDATE {s}.streamkit_heads SET reserved_through = GREATEST(head, %s), reserved_by = '' "
    "WHERE path = %s AND reserved_by = %s"
)


class Writer:
    """The writer of one PostgreSQL log: its thread, its connection and the parts that use it.

    Parts, each owning its state: the thread and its queue, the outcomes
    owed to callers, the stamps, the counters, and the group commit run
    through :class:`~._group_commit.PostgresStatements` (which caches the
    path states). The writer itself owns the connection, opened again for
    the next job if it broke.
    """

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
        self._release = _RELEASE.replace("{s}", f'"{target.schema}"')
        # A row lock another transaction holds is waited for up to busy_timeout.
        self._options = session_options(busy_timeout)
        self._conn: psycopg.Connection[Any] | None = self._connect()
        self._token = token
        self._group_limit = group_limit
        self.counters = WriteCounters()
        self._settling = Settling()
        self._statements = PostgresStatements(
            target.schema,
            token=token,
            connection=self._connection,
            stamps=Stamps(clock),
            counters=self.counters,
            feed=feed,
            fed=fed,
            frozen=FrozenSessions(target.schema, busy_timeout),
        )
        self._group_commit = GroupCommit(self._statements, feed, self.counters, self._settling)
        self.thread = WriterThread(self._run, "streamkit-pg-writer")
        """The thread and its queue: callers submit jobs and request the close through it."""
        self.thread.start()

    def _connect(self) -> psycopg.Connection[Any]:
        return connect(
            self._target.conninfo, self._target.shown, options=self._options, role="writer"
        )

    def _connection(self) -> psycopg.Connection[Any]:
        """The writer connection, opened again if it broke (StorageUnavailable if it cannot be)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken or _left_in_pipeline(conn):
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
        thread = self.thread
        try:
            while True:
                jobs = thread.take(thread.get(), self._group_limit)
                if self._handle(jobs):
                    return
        finally:
            try:
                if self._conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        self._conn.close()
            finally:
                thread.finish(self._settling)

    def _handle(self, jobs: list[Any]) -> bool:
        """Run a batch of jobs in order; True once a close was among them (the thread ends)."""
        guarded = self._settling.guarded
        forget = self._statements.forget
        group: list[WriteCall] = []
        for job in jobs:
            if isinstance(job, AppendCall | ClaimCall):
                group.append(job)
                continue
            if group:
                guarded(self._group_commit.run, group, forget)
                group = []
            if isinstance(job, TransactionJob):
                guarded(self._run_transaction, job, forget)
            elif isinstance(job, CloseJob):
                self._release_reservations()
                return True
        if group:
            guarded(self._group_commit.run, group, forget)
        return False

    # -- other jobs -----------------------------------------------------------------------

    def _run_transaction(self, job: TransactionJob) -> None:
        self._settling.add(job)
        try:
            try:
                result = self._transaction(job)
            except psycopg.errors.LockNotAvailable:
                # Once more if a frozen process's session held the lock and is gone now.
                if not self._statements.frozen.end(self._connection()):
                    raise
                self._statements.forget()
                result = self._transaction(job)
            job.result = result
            self.counters.transactions += 1
        except BaseException as exc:  # whatever fn raises goes back to its caller
            job.error = self._statements.transaction_error(exc)
        finally:
            # The function may have touched any table: trust nothing cached.
            self._statements.forget()

    @property
    def frozen_ended(self) -> int:
        """Sessions of frozen processes this writer ended (see ``_frozen``)."""
        return self._statements.frozen.ended

    def _transaction(self, job: TransactionJob) -> Any:
        conn = self._connection()
        with conn.transaction():
            return job.fn(conn)

    def _release_reservations(self) -> None:
        """Give back the unused rest of own blocks so a clean restart leaves no hole."""
        own = [
            (state.last_ephemeral, path)
            for path, state in self._statements.states.items()
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


def _left_in_pipeline(conn: psycopg.Connection[Any]) -> bool:
    """Whether libpq still has the connection in pipeline mode between two jobs.

    psycopg runs ``executemany`` in pipeline mode. When the server goes away
    in the middle of one (an outage, a paused server), libpq can be left in
    pipeline mode on a connection psycopg does not call broken, and every
    later query fails with "PQsendQuery not allowed in pipeline mode": seen
    in a 10-second outage drill, where the writer then refused every append
    for good. No job leaves a pipeline open, so such a connection is
    unusable and is opened again like a broken one.
    """
    return conn.pgconn.pipeline_status != pq.PipelineStatus.OFF

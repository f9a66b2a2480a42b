"""The writer thread of a log: group commit, offset assignment and ephemeral reservations.

One thread owns the one writer connection. ``sqlite3`` calls block (a commit
at ``synchronous=FULL`` waits for fsync), so by default they run off the event
loop; one dedicated thread also makes the connection's single-threaded use
obvious. Callers enqueue jobs with an asyncio future; the thread takes
everything queued (up to a cap), runs all write calls in ONE ``BEGIN
IMMEDIATE`` transaction, each call inside its own savepoint (a refused call
rolls back alone and gets its error), commits once, publishes the pushes and
settles the futures with one ``call_soon_threadsafe`` per loop. Appends that
became ready in one loop turn may instead run as one group on the loop itself
(:meth:`Writer.try_inline`) when the thread is idle: the same code under the
same lock, so both paths give the same outcomes.

Offsets and ephemeral reservations are the rules of :mod:`._offsets`; the
group commit is :mod:`streamkit.backends._group_commit` run through the
SQLite statements of :mod:`._group_commit`.

Other processes' commits (:mod:`._foreign`): the writer connection's ``PRAGMA
data_version`` changes exactly when another connection committed, so the
writer checks it at the start of every group (dropping cached heads, reading
the new rows of followed paths and pushing them) and, while anyone follows,
the thread polls it whenever 2 ms passed without such a check. A log quiet for half a second (no
events committed here, none seen from elsewhere) is polled every 50 ms instead, so an
idle host costs next to no CPU; the first commit from elsewhere after a quiet
spell is then seen within 50 ms, and the 2 ms polling resumes with it.
Polling from this thread needs no second thread or connection and never races
the writer's own view of the heads.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

from streamkit._requests import (
    AppendCall,
    ClaimCall,
    CloseJob,
    FollowJob,
    QueryJob,
    TransactionJob,
    WriteCall,
)
from streamkit.backends._group_commit import GroupCommit, WriteCounters
from streamkit.backends._settling import Settling
from streamkit.backends._stamps import Stamps
from streamkit.backends._writer_thread import WriterThread
from streamkit.backends.sqlite._foreign import ForeignCommits
from streamkit.backends.sqlite._group_commit import (
    SqliteStatements,
    TakenElsewhere,
    begin_waiting,
    transaction_error,
)
from streamkit.backends.sqlite._placement import Placement
from streamkit.backends.sqlite._schema import is_busy, storage_error
from streamkit.backends.sqlite._wal_guard import WalIdentity
from streamkit.errors import LogClosed
from streamkit.log import Feed
from streamkit.protocols import Clock

__all__ = ["Writer"]

monotonic = time.monotonic  # bound once: every loop turn reads it

GROUP_LIMIT = 1000
"""Calls per group commit at most, so one huge backlog cannot delay every caller behind it."""
POLL_SECONDS = 0.002
"""How often the idle writer looks for other processes' commits while anyone follows."""
POLL_QUIET_SECONDS = 0.5
"""After this long with no events committed, here or elsewhere, the log counts as quiet.

(A lease renewal or a checkpoint is no activity: a host's heartbeat alone must
not keep its idle log on the fast poll.)"""
POLL_QUIET_INTERVAL_SECONDS = 0.05
"""How often a quiet log is looked at: 20 looks a second instead of 500."""
POLL_WAIT_SECONDS = 0.002
"""How long an inline commit waits for a follow poll to hand the connection back."""


class Writer:
    """The writer of one SQLite log: its thread, its connection and the parts that use it.

    Parts, each owning its state: the thread and its queue
    (:class:`~streamkit.backends._writer_thread.WriterThread`), the outcomes
    owed to callers (:class:`~streamkit.backends._settling.Settling`), the
    stamps, the counters, the placement of calls and its cached path states
    (:class:`~._placement.Placement`), other processes' commits
    (:class:`~._foreign.ForeignCommits`) and the group commit run through
    :class:`~._group_commit.SqliteStatements`. The writer itself owns the
    connection's lock: whoever uses the connection (the thread for a group,
    or a caller committing inline) holds it, so the two never interleave.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        token: str,
        clock: Clock,
        feed: Feed,
        persistent: bool,
        busy_timeout: float,
        group_limit: int = GROUP_LIMIT,
        wal: WalIdentity | None = None,
    ) -> None:
        self._conn = conn
        self._wal = wal
        # SQLite's own busy wait is off: the thread waits for a foreign write lock
        # itself, and an inline group must never wait at all.
        conn.execute("PRAGMA busy_timeout = 0")
        # One cursor for the fixed statements of every commit (no cursor object per statement).
        cur = conn.cursor()
        self._busy_timeout = busy_timeout
        self._token = token
        self._feed = feed
        self._persistent = persistent
        self._group_limit = group_limit
        self._conn_lock = threading.Lock()
        self._polling = False
        self.counters = WriteCounters()
        self._settling = Settling()
        self._stamps = Stamps(clock)
        self._placement = Placement(conn, cur, token, self.counters)
        self._foreign = ForeignCommits(
            conn, cur, feed, self._stamps, self._settling, self._placement.forget
        )
        self._statements = SqliteStatements(
            conn,
            cur,
            placement=self._placement,
            foreign=self._foreign,
            stamps=self._stamps,
            counters=self.counters,
            feed=feed,
            busy_timeout=busy_timeout,
            wal=wal,
        )
        self._group_commit = GroupCommit(self._statements, feed, self.counters, self._settling)
        self.thread = WriterThread(self._run, "streamkit-log-writer")
        """The thread and its queue: callers submit jobs and request the close through it."""
        self.thread.start()

    # -- the caller's side (any thread) ---------------------------------------------------

    def try_inline(self, jobs: list[AppendCall | TransactionJob]) -> bool:
        """Run ``jobs`` now on the calling thread if the writer is idle; False to queue them.

        ``jobs`` is one unit: appends that became ready together (one group
        commit) or a single transaction. Its callers then pay no hand-off to
        the thread and back (two cross-thread wake-ups, more than the commit
        itself on a fast disk) and are settled at once, at the price of
        blocking the calling thread, the event loop, for that one commit. Only
        an idle writer (nothing queued, connection free) is taken, and never a
        wait: if another process holds the write lock nothing runs here and
        the thread, which waits up to the busy timeout, takes the jobs instead.
        """
        if len(jobs) > self._group_limit:
            return False
        conn_lock = self._conn_lock
        # Held for a follow poll, the connection is free again within microseconds once
        # the thread gets the GIL back (it may be waiting for it, from us): waiting then
        # is far cheaper than the hand-off. Held for a commit, it is not.
        if not conn_lock.acquire(False) and (  # positional: cheaper than blocking=False
            not self._polling or not conn_lock.acquire(timeout=POLL_WAIT_SECONDS)
        ):
            return False
        try:
            # Checked under the connection lock, which the thread holds for every job: a
            # close queued after this check runs after this commit. A job the thread took
            # off the queue but has not run yet may commit after this one: both calls were
            # in flight at once, so either order is one the callers could have seen.
            if not self.thread.accepting:
                raise LogClosed(
                    "the log is closed; nothing was read or written (open it again to use it)"
                )
            if not self.thread.queue_empty():
                return False
            try:
                self._run_jobs(jobs, inline=True)
            except TakenElsewhere:
                return False
            except Exception as exc:
                self._settling.fail(jobs, exc)
                self._placement.forget()
            settling = self._settling
            if settling.jobs or settling.wakes:
                settling.flush(direct=jobs[0].loop)
        finally:
            conn_lock.release()
        return True

    def looked_at(self) -> float | None:
        """When (monotonic) the last look for other processes' commits ran; None if nobody follows.

        Every transaction looks, and the idle thread polls every
        :data:`POLL_SECONDS` while anyone follows.
        """
        return self._foreign.synced_at if self._feed.has_subscribers() else None

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            try:
                self._conn.close()
            finally:
                self.thread.finish(self._settling)

    def _loop(self) -> None:
        thread = self.thread
        foreign = self._foreign
        while True:
            job: Any
            if self._feed.has_subscribers():
                # Every transaction looks for other processes' commits too, so the poll
                # is due only an interval after the latest look: while inline commits
                # flow, the thread stays off the connection and the GIL.
                now = monotonic()
                interval = (
                    POLL_SECONDS
                    if now - foreign.active_at < POLL_QUIET_SECONDS
                    else POLL_QUIET_INTERVAL_SECONDS
                )
                wait = foreign.synced_at + interval - now
                if wait <= 0:
                    # Flagged before taking the lock: the thread may hold it while it waits
                    # for the GIL, and an inline caller seeing it held must know it is a poll.
                    self._polling = True
                    try:
                        with self._conn_lock:
                            foreign.poll()
                    finally:
                        self._polling = False
                    wait = interval
                try:
                    job = thread.get(timeout=wait)
                except queue.Empty:
                    continue
            else:
                job = thread.get()
            jobs = thread.take(job, self._group_limit)
            with self._conn_lock:
                if self._handle(jobs):
                    return

    def _handle(self, jobs: list[Any]) -> bool:
        guarded = self._settling.guarded
        forget = self._placement.forget
        group: list[WriteCall | TransactionJob] = []
        for job in jobs:
            if isinstance(job, AppendCall | ClaimCall) or (
                isinstance(job, TransactionJob) and job.short
            ):
                group.append(job)
                continue
            if group:
                guarded(self._run_jobs, group, forget)
                group = []
            if isinstance(job, TransactionJob):
                guarded(self._run_transaction, job, forget)
            elif isinstance(job, QueryJob):
                guarded(self._run_query, job, forget)
            elif isinstance(job, FollowJob):
                self._foreign.follow(job.path)
                guarded(self._foreign.start_following, None, forget)
            elif isinstance(job, CloseJob):
                if self._persistent:
                    self._statements.release_reservations(self._token)
                return True
        if group:
            guarded(self._run_jobs, group, forget)
        return False

    def _run_jobs(
        self, jobs: Sequence[WriteCall | TransactionJob], *, inline: bool = False
    ) -> None:
        """Run appends, claims and short transactions queued together as one group commit.

        A lone transaction runs as before, in a transaction of its own.
        """
        writes: list[WriteCall] = []
        transactions: list[TransactionJob] = []
        for job in jobs:
            if isinstance(job, TransactionJob):
                transactions.append(job)
            else:
                writes.append(job)
        if not writes and len(transactions) == 1:
            self._run_transaction(transactions[0], inline=inline)
        else:
            self._group_commit.run(writes, transactions, inline=inline)

    # -- other jobs -----------------------------------------------------------------------

    def _run_transaction(self, job: TransactionJob, *, inline: bool = False) -> None:
        conn = self._conn
        try:
            if inline:
                conn.execute("BEGIN IMMEDIATE")
            else:
                begin_waiting(conn, self._busy_timeout)
        except sqlite3.Error as exc:
            if inline and is_busy(exc):
                raise TakenElsewhere from exc  # nothing ran: the thread takes it and may wait
            self._settling.add(job)
            job.error = storage_error(exc, "write_transaction")
            job.error.__cause__ = exc
            return
        self._settling.add(job)
        try:
            if self._wal is not None:
                self._wal.check()
            result = job.fn(conn)
            if conn.in_transaction:
                conn.execute("COMMIT")
            job.result = result
            self.counters.transactions += 1
        except BaseException as exc:  # whatever fn raises goes back to its caller
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            job.error = transaction_error(exc)
        finally:
            # The function may have touched any table: trust nothing cached.
            self._placement.forget()

    def _run_query(self, job: QueryJob) -> None:
        self._settling.add(job)
        try:
            job.result = job.fn(self._conn)
        except sqlite3.Error as exc:
            job.error = storage_error(exc, "reading the log")
            job.error.__cause__ = exc
        except BaseException as exc:  # whatever fn raises goes back to its caller
            job.error = exc

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
group commit itself is :mod:`._group_commit`.

Other processes' commits: the writer connection's ``PRAGMA data_version``
changes exactly when another connection committed, so the writer checks it at
the start of every group (dropping cached heads, reading the new rows of
followed paths and pushing them) and, while anyone follows, the thread polls it
whenever 2 ms passed without such a check. A log quiet for half a second (no
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
from collections.abc import Callable, Sequence
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
from streamkit.backends._writer_thread import WriterThread
from streamkit.backends.sqlite._group_commit import (
    GroupCommit,
    _TakenElsewhere,
    transaction_error,
)
from streamkit.backends.sqlite._offsets import PathState
from streamkit.backends.sqlite._read import (
    durable_head,
    read_page_sized,
)
from streamkit.backends.sqlite._schema import is_busy, storage_error
from streamkit.backends.sqlite._wal_guard import WalIdentity
from streamkit.errors import (
    LogClosed,
)
from streamkit.events import (
    format_timestamp,
    now_timestamp,
)
from streamkit.log._follow import Feed, Push
from streamkit.protocols import Clock

__all__ = ["Writer"]

monotonic = time.monotonic  # bound once: every transaction reads it

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
FOREIGN_PAGE = 1000
"""Rows of other processes' commits read per path per poll (bounds one push's size)."""

# The newest created_at of the log: the head row of each path, found by walking the
# primary key from one distinct path to the next (no scan of the rows between).
_LATEST_STAMP = """
WITH RECURSIVE p(x) AS (
    SELECT min(path) FROM streamkit_events
    UNION ALL
    SELECT (SELECT min(path) FROM streamkit_events WHERE path > x) FROM p WHERE x IS NOT NULL
)
SELECT max((SELECT created_at FROM streamkit_events WHERE path = x ORDER BY "offset" DESC
            LIMIT 1))
FROM p WHERE x IS NOT NULL
"""


class Writer(WriterThread, GroupCommit):
    """The writer thread and the state it alone touches."""

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
        # itself (_BusyWait), and an inline group must never wait at all.
        conn.execute("PRAGMA busy_timeout = 0")
        # One cursor for the fixed statements of every commit (no cursor object per statement).
        self._cur = conn.cursor()
        self._busy_timeout = busy_timeout
        self._inline = False
        self._polling = False
        # Rows of plain appends held back to be inserted together (see _apply_group).
        self._deferred_rows: list[tuple[Any, ...]] | None = None
        self._synced_at = 0.0  # monotonic time of the latest look for other processes' commits
        self._active_at = 0.0  # monotonic time of the latest events, committed here or seen
        self._token = token
        # What stamps each commit's created_at: the default clock is read as integer
        # nanoseconds (cheaper to format); any other clock through format_timestamp.
        self._timestamp: Callable[[], str] = (
            now_timestamp if clock is time.time else lambda: format_timestamp(clock())
        )
        self._feed = feed
        self._persistent = persistent
        self._group_limit = group_limit
        self._init_queue()
        # Held by whoever uses the connection: the thread for a group, or a caller
        # committing inline (see try_inline), so the two never interleave.
        self._conn_lock = threading.Lock()
        self._states: dict[str, PathState] = {}
        self._data_version: int | None = None
        self._fed: dict[str, int] = {}
        self._pending_follows: set[str] = set()
        self._in_transaction = False
        self._following = False
        self._group_before: dict[str, int] = {}
        self._now = ""
        # The latest created_at this writer used or saw committed: no commit is
        # stamped earlier, whatever this process's clock (or another's) says.
        self._last_stamp = ""
        self.transactions = 0
        self.appended = 0
        self.ephemeral = 0
        self.ephemeral_reservations = 0
        self.refused = 0
        self._start_thread(self._run, "streamkit-log-writer")

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
            if not self._accepting:
                raise LogClosed(
                    "the log is closed; nothing was read or written (open it again to use it)"
                )
            if not self._queue.empty():
                return False
            self._inline = True
            try:
                self._run_jobs(jobs)
            except _TakenElsewhere:
                return False
            except Exception as exc:
                self._fail(jobs, exc)
            finally:
                self._inline = False
            if self._settle or self._wakes:
                self._flush(direct=jobs[0].loop)
        finally:
            conn_lock.release()
        return True

    def looked_at(self) -> float | None:
        """When (monotonic) the last look for other processes' commits ran; None if nobody follows.

        Every transaction looks, and the idle thread polls every
        :data:`POLL_SECONDS` while anyone follows.
        """
        return self._synced_at if self._feed.has_subscribers() else None

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            try:
                self._conn.close()
            finally:
                self._finish()

    def _loop(self) -> None:
        while True:
            job: Any
            if self._feed.has_subscribers():
                # Every transaction looks for other processes' commits too (_sync_foreign),
                # so the poll is due only an interval after the latest look: while inline
                # commits flow, the thread stays off the connection and the GIL.
                now = monotonic()
                interval = (
                    POLL_SECONDS
                    if now - self._active_at < POLL_QUIET_SECONDS
                    else POLL_QUIET_INTERVAL_SECONDS
                )
                wait = self._synced_at + interval - now
                if wait <= 0:
                    # Flagged before taking the lock: the thread may hold it while it waits
                    # for the GIL, and an inline caller seeing it held must know it is a poll.
                    self._polling = True
                    try:
                        with self._conn_lock:
                            self._poll()
                    finally:
                        self._polling = False
                    wait = interval
                try:
                    job = self._queue.get(timeout=wait)
                except queue.Empty:
                    continue
            else:
                job = self._queue.get()
            jobs = self._take(job, self._group_limit)
            with self._conn_lock:
                if self._handle(jobs):
                    return

    def _handle(self, jobs: list[Any]) -> bool:
        group: list[WriteCall | TransactionJob] = []
        for job in jobs:
            if isinstance(job, AppendCall | ClaimCall) or (
                isinstance(job, TransactionJob) and job.short
            ):
                group.append(job)
                continue
            if group:
                self._guarded(self._run_jobs, group)
                group = []
            if isinstance(job, TransactionJob):
                self._guarded(self._run_transaction, job)
            elif isinstance(job, QueryJob):
                self._guarded(self._run_query, job)
            elif isinstance(job, FollowJob):
                self._pending_follows.add(job.path)
                self._guarded(self._start_following, None)
            elif isinstance(job, CloseJob):
                self._release_reservations()
                return True
        if group:
            self._guarded(self._run_jobs, group)
        return False

    def _run_jobs(self, jobs: Sequence[WriteCall | TransactionJob]) -> None:
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
            self._run_transaction(transactions[0])
        else:
            self._run_group(writes, transactions)

    def _forget(self) -> None:
        self._invalidate()

    # -- reading and caching what other connections committed ----------------------------

    def _sync_foreign(self) -> None:
        """Notice other connections' commits: drop cached heads and push their rows to followers."""
        self._synced_at = monotonic()
        version = self._cur.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._take_foreign(version)

    def _take_foreign(self, version: int) -> None:
        """Other connections committed (``data_version`` is now ``version``): see to it."""
        self._data_version = version
        self._active_at = self._synced_at
        self._invalidate()
        latest = self._conn.execute(_LATEST_STAMP).fetchone()[0]
        if latest is not None and latest > self._last_stamp:
            self._last_stamp = str(latest)
        followed = set(self._feed.followed_paths())
        for path in list(self._fed):
            if path not in followed:
                del self._fed[path]
        pushes: list[tuple[str, Push]] = []
        for path, fed in self._fed.items():
            page, size = read_page_sized(self._conn, path, fed, FOREIGN_PAGE)
            if page.events:
                pushes.append((path, Push(fed, page.scanned_through_offset, page.events, size)))
                self._fed[path] = page.scanned_through_offset
            if not page.at_head:
                self._data_version = None  # more rows wait: read on at the next look
        if pushes:
            self._feed.publish(pushes, self._wakes)

    def _poll(self) -> None:
        try:
            self._sync_foreign()
            if self._pending_follows:
                self._start_following(None)
        except sqlite3.Error:
            self._data_version = None  # a busy or failing read: try again at the next poll
        self._flush()

    def _start_following(self, _: None) -> None:
        """Start watching newly followed paths (retried at the next poll if SQLite fails)."""
        self._sync_foreign()
        followed = set(self._feed.followed_paths())
        pushes: list[tuple[str, Push]] = []
        for path in sorted(self._pending_follows):
            if path in followed:
                fed = self._fed.get(path)
                if fed is None:
                    fed = self._fed[path] = durable_head(self._conn, path)
                # Everything at or below ``fed`` is committed; everything above will be pushed.
                pushes.append((path, Push(fed, fed, ())))
        self._feed.publish(pushes, self._wakes)
        self._pending_follows.clear()

    # -- other jobs -----------------------------------------------------------------------

    def _run_transaction(self, job: TransactionJob) -> None:
        conn = self._conn
        try:
            if self._inline:
                conn.execute("BEGIN IMMEDIATE")
            else:
                self._begin_waiting()
        except sqlite3.Error as exc:
            if self._inline and is_busy(exc):
                raise _TakenElsewhere from exc  # nothing ran: the thread takes it and may wait
            self._settle.append(job)
            job.error = storage_error(exc, "write_transaction")
            job.error.__cause__ = exc
            return
        self._settle.append(job)
        try:
            if self._wal is not None:
                self._wal.check()
            result = job.fn(conn)
            if conn.in_transaction:
                conn.execute("COMMIT")
            job.result = result
            self.transactions += 1
        except BaseException as exc:  # whatever fn raises goes back to its caller
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            job.error = transaction_error(exc)
        finally:
            # The function may have touched any table: trust nothing cached.
            self._invalidate()

    def _run_query(self, job: QueryJob) -> None:
        self._settle.append(job)
        try:
            job.result = job.fn(self._conn)
        except sqlite3.Error as exc:
            job.error = storage_error(exc, "reading the log")
            job.error.__cause__ = exc
        except BaseException as exc:  # whatever fn raises goes back to its caller
            job.error = exc

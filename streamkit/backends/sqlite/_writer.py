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

Offsets (per stream path):

- The durable head is ``max(offset)`` of the path, read inside the transaction
  (cached while ``PRAGMA data_version`` says no other connection committed).
- Ephemerals draw offsets from a block reserved with one write to
  ``streamkit_heads(path, reserved_through, reserved_by)``; ``reserved_by`` is
  this writer's random token. A durable append lands at
  ``max(head, last own ephemeral)`` + 1 while the block is this writer's, else
  at ``max(head, reserved_through)`` + 1, so no durable event ever lands at or
  below an offset another process may have handed to an ephemeral, and this
  process's durable-ephemeral-durable gets 1, 2, 3. The heads row is written
  only to reserve (and, on a clean close, to give back the unused rest).
- A block is void once another process reserved (``reserved_by`` changed) or
  the head passed its end; the next ephemeral reserves a new block above
  everything. Blocks double (256 up to 4096) while one writer keeps using them
  up (one reservation write per thousands of ephemerals) and shrink back to 256
  when another writer takes the row or its durable append skips past the block:
  such a skip is the hole another live process leaves, so it must stay small. A group of ephemerals that fits
  the current block runs with no transaction at all, and a clean close gives
  the unused rest of the block back, so only a crash or another live process
  leaves a hole.

Other processes' commits: the writer connection's ``PRAGMA data_version``
changes exactly when another connection committed, so the writer checks it at
the start of every group (dropping cached heads, reading the new rows of
followed paths and pushing them) and, while anyone follows, the thread polls it
whenever 2 ms passed without such a check.
Polling from this thread needs no second thread or connection and never races
the writer's own view of the heads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamkit._fast import make_event
from streamkit._json import decode, decode_many
from streamkit._requests import (
    AppendCall,
    ClaimCall,
    CloseJob,
    FollowJob,
    Job,
    QueryJob,
    TransactionJob,
    WriteCall,
    resolve_close,
    settle,
)
from streamkit.backends.sqlite._read import (
    durable_head,
    read_page_sized,
    select_key,
)
from streamkit.backends.sqlite._schema import is_busy, storage_error
from streamkit.backends.sqlite._wal_guard import WalIdentity
from streamkit.errors import (
    IdempotencyConflict,
    LogClosed,
    OffsetConflict,
    StorageError,
    StreamkitError,
)
from streamkit.events import (
    PreparedEvent,
    StreamEvent,
    format_timestamp,
    now_timestamp,
    same_body,
)
from streamkit.log._follow import Feed, Push, WakeList
from streamkit.protocols import Clock

__all__ = ["Writer"]

monotonic = time.monotonic  # bound once: every transaction reads it

GROUP_LIMIT = 1000
"""Calls per group commit at most, so one huge backlog cannot delay every caller behind it."""
POLL_SECONDS = 0.002
"""How often the idle writer looks for other processes' commits while anyone follows."""
POLL_WAIT_SECONDS = 0.002
"""How long an inline commit waits for a follow poll to hand the connection back."""
BLOCK_MIN = 256
BLOCK_MAX = 4096
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

_INSERT = (
    'INSERT INTO streamkit_events (path, "offset", type, payload, metadata, source, '
    "idempotency_key, created_at) VALUES (?, ?, ?, ?, ?, NULLIF(?, ''), NULLIF(?, ''), ?)"
)
"""Source and key go in as ``''`` for NULL: neither can be empty (a source is a JSON object,
a key is refused if empty), and ``sqlite3`` binds ``None`` only after a failed adapter
lookup that formats an AttributeError: two per event, some 3% of an append's instructions."""
_RESERVE = (
    "INSERT INTO streamkit_heads (path, reserved_through, reserved_by) VALUES (?, ?, ?) "
    "ON CONFLICT (path) DO UPDATE SET reserved_through = excluded.reserved_through, "
    "reserved_by = excluded.reserved_by"
)
_RESERVATION = "SELECT reserved_through, reserved_by FROM streamkit_heads WHERE path = ?"
_RELEASE = (
    "UPDATE streamkit_heads SET reserved_through = ?, reserved_by = '' "
    "WHERE path = ? AND reserved_by = ?"
)
_CLAIM = (
    "INSERT INTO streamkit_claims (path, slug, due_at) VALUES (?, ?, ?) "
    "ON CONFLICT (path, slug) DO UPDATE SET due_at = excluded.due_at"
)
_UNCLAIM = "DELETE FROM streamkit_claims WHERE path = ? AND slug = ?"


@dataclass(slots=True)
class _PathState:
    """What the writer knows of one path; ``None`` means re-read it in the next transaction."""

    head: int | None = None
    reserved_through: int | None = None
    mine: bool = False
    last_ephemeral: int = 0
    block: int = BLOCK_MIN

    def snapshot(self) -> tuple[int | None, int | None, bool, int, int]:
        return (self.head, self.reserved_through, self.mine, self.last_ephemeral, self.block)

    def restore(self, saved: tuple[int | None, int | None, bool, int, int]) -> None:
        (self.head, self.reserved_through, self.mine, self.last_ephemeral, self.block) = saved


class _BusyWait:
    """The thread's wait for another connection's write lock, in place of SQLite's busy handler.

    Sleeps 1, 2, 4 ... ms (at most 50 ms at a time) until ``timeout`` seconds
    have passed since the first busy answer; the sleep releases the GIL, so the
    event loop runs on meanwhile.
    """

    __slots__ = ("_deadline", "_delay", "_timeout")

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._deadline: float | None = None
        self._delay = 0.001

    def another(self) -> bool:
        """Sleep before another attempt; False once the timeout has run out (give up)."""
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self._timeout
        left = self._deadline - now
        if left <= 0:
            return False
        time.sleep(min(self._delay, left))
        self._delay = min(self._delay * 2, 0.05)
        return True


class _TakenElsewhere(Exception):
    """An inline group met another connection's write lock: nothing ran; the thread takes it."""


class Writer:
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
        self._token = token
        # What stamps each commit's created_at: the default clock is read as integer
        # nanoseconds (cheaper to format); any other clock through format_timestamp.
        self._timestamp: Callable[[], str] = (
            now_timestamp if clock is time.time else lambda: format_timestamp(clock())
        )
        self._feed = feed
        self._persistent = persistent
        self._group_limit = group_limit
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._submit_lock = threading.Lock()
        # Held by whoever uses the connection: the thread for a group, or a caller
        # committing inline (see try_inline), so the two never interleave.
        self._conn_lock = threading.Lock()
        self._accepting = True
        self._finished = threading.Event()
        self._close_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._states: dict[str, _PathState] = {}
        self._data_version: int | None = None
        self._fed: dict[str, int] = {}
        self._pending_follows: set[str] = set()
        self._in_transaction = False
        self._group_before: dict[str, int] = {}
        self._now = ""
        # The latest created_at this writer used or saw committed: no commit is
        # stamped earlier, whatever this process's clock (or another's) says.
        self._last_stamp = ""
        self._settle: list[Job] = []
        self._wakes: WakeList = {}
        self.transactions = 0
        self.appended = 0
        self.ephemeral = 0
        self.ephemeral_reservations = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._run, name="streamkit-log-writer", daemon=True)
        self._thread.start()

    # -- the caller's side (any thread) ---------------------------------------------------

    def submit(self, job: Job | FollowJob) -> None:
        """Queue a job; raise :class:`LogClosed` once the log is closing."""
        with self._submit_lock:
            if not self._accepting:
                raise LogClosed(
                    "the log is closed; nothing was read or written (open it again to use it)"
                )
            self._queue.put(job)

    def try_inline(self, jobs: list[AppendCall] | list[TransactionJob]) -> bool:
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
        with self._submit_lock:
            if not self._accepting:
                raise LogClosed(
                    "the log is closed; nothing was read or written (open it again to use it)"
                )
            if len(jobs) > self._group_limit or not self._queue.empty():
                return False
            taken = self._conn_lock.acquire(blocking=False)
            polling = self._polling
        if not taken:
            # Held for a follow poll, the connection is free again within microseconds
            # once the thread gets the GIL back (it may be waiting for it, from us):
            # waiting here is far cheaper than the hand-off. Held for a commit, it is not.
            if not polling or not self._conn_lock.acquire(timeout=POLL_WAIT_SECONDS):
                return False
            if not self._queue.empty():  # queued while we waited: keep the order
                self._conn_lock.release()
                return False
        loop = jobs[0].loop
        try:
            self._inline = True
            try:
                if isinstance(jobs[0], TransactionJob):
                    (job,) = jobs
                    self._guarded(self._run_transaction, job)
                else:
                    self._guarded(self._run_group, jobs)
            except _TakenElsewhere:
                return False
            finally:
                self._inline = False
            self._flush(direct=loop)
        finally:
            self._conn_lock.release()
        return True

    def commit_lone(
        self, path: str, event: PreparedEvent, loop: asyncio.AbstractEventLoop
    ) -> list[StreamEvent] | None:
        """Commit one plain event (durable, no key, no offset precondition) now, on this thread.

        The commonest call, a single event nothing can refuse, taken without a
        job, a future or group bookkeeping: :meth:`try_inline` cut down to what
        one such event needs. ``None`` means nothing ran, and the caller takes
        the queued path: the writer was busy or had work queued (which must
        commit first), or another process holds the write lock (the thread
        waits that out). A storage failure raises; nothing was written then.
        """
        if not self._conn_lock.acquire(False):  # positional: cheaper than blocking=False
            return None
        try:
            # Checked under the connection lock: a close queued after this check can
            # only run once the lock is released, after this commit.
            if not self._accepting:
                raise LogClosed(
                    "the log is closed; nothing was read or written (open it again to use it)"
                )
            if not self._queue.empty():
                return None
            cur = self._cur
            inflight = False
            try:
                cur.execute("BEGIN IMMEDIATE")
                if self._wal is not None:
                    self._wal.check()
                following = self._feed.has_subscribers()
                self._sync_foreign()
                # After the look at other commits: the stamp is no earlier than theirs.
                now = self._now = self._stamp_commit()
                state = self._states.get(path)
                if state is None or state.head is None or state.reserved_through is None:
                    state = self._state(path)
                before = state.head
                offset = _next_plain(state)
                cur.execute(
                    _INSERT,
                    (
                        path,
                        offset,
                        event.type,
                        event.payload_json,
                        event.metadata_json,
                        event.source_json or "",
                        "",
                        now,
                    ),
                )
                if following:
                    self._group_before = {path: before or 0}
                    self._feed.set_inflight(self._group_before)
                    inflight = True
                cur.execute("COMMIT")
            except BaseException as exc:
                # Nothing was written; the cached heads are re-read by the next transaction.
                self._roll_back(inflight)
                self._invalidate()
                if not isinstance(exc, sqlite3.Error):
                    raise
                if is_busy(exc):
                    return None  # the thread waits the lock out instead
                raise storage_error(exc, f"appending to {path!r}") from exc
            state.head = offset
            self.transactions += 1
            self.appended += 1
            committed = _decode(path, (event,), (offset,), now)
            if inflight:
                self._push_own({path: committed}, {path: _json_bytes((event,))})
            return committed
        finally:
            if self._wakes:  # followers of other processes' rows, or of this one
                self._flush(direct=loop)
            self._conn_lock.release()

    def request_close(
        self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
    ) -> None:
        """Stop accepting jobs; the thread finishes the queued ones, then closes the connection."""
        with self._submit_lock:
            if waiter is not None:
                if self._finished.is_set():
                    waiter[1].set_result(None)
                else:
                    self._close_waiters.append(waiter)
            if self._accepting:
                self._accepting = False
                self._queue.put(CloseJob())

    def join(self) -> None:
        """Wait until the writer thread has finished (not from the thread itself)."""
        if threading.current_thread() is not self._thread:
            self._thread.join()

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
                # so the poll is due only POLL_SECONDS after the latest look: while inline
                # commits flow, the thread stays off the connection and the GIL.
                wait = self._synced_at + POLL_SECONDS - time.monotonic()
                if wait <= 0:
                    # Flagged before taking the lock: the thread may hold it while it waits
                    # for the GIL, and an inline caller seeing it held must know it is a poll.
                    self._polling = True
                    try:
                        with self._conn_lock:
                            self._poll()
                    finally:
                        self._polling = False
                    wait = POLL_SECONDS
                try:
                    job = self._queue.get(timeout=wait)
                except queue.Empty:
                    continue
            else:
                job = self._queue.get()
            jobs = [job]
            while len(jobs) < self._group_limit:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            with self._conn_lock:
                if self._handle(jobs):
                    return

    def _handle(self, jobs: list[Any]) -> bool:
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
            elif isinstance(job, QueryJob):
                self._guarded(self._run_query, job)
            elif isinstance(job, FollowJob):
                self._pending_follows.add(job.path)
                self._guarded(self._start_following, None)
            elif isinstance(job, CloseJob):
                self._release_reservations()
                return True
        if group:
            self._guarded(self._run_group, group)
        return False

    def _guarded(self, step: Callable[[Any], None], arg: Any) -> None:
        # A bug must fail the calls it touched, never kill the thread and hang every caller.
        try:
            step(arg)
        except _TakenElsewhere:
            raise
        except Exception as exc:
            for job in arg if isinstance(arg, list) else [arg]:
                if isinstance(job, Job) and job not in self._settle:
                    job.error = exc
                    self._settle.append(job)
            self._invalidate()
        if not self._inline:
            self._flush()

    def _flush(self, direct: asyncio.AbstractEventLoop | None = None) -> None:
        """Settle finished jobs and wake followers; ``direct`` is the loop running this call."""
        jobs = self._settle
        if direct is not None and not self._wakes and all(job.loop is direct for job in jobs):
            self._settle = []
            settle(jobs, [])
            return
        by_loop: dict[asyncio.AbstractEventLoop, tuple[list[Job], list[asyncio.Event]]] = {}
        for job in self._settle:
            by_loop.setdefault(job.loop, ([], []))[0].append(job)
        for loop, events in self._wakes.items():
            by_loop.setdefault(loop, ([], []))[1].extend(events)
        self._settle = []
        self._wakes = {}
        for loop, (jobs, events) in by_loop.items():
            if loop is direct:
                settle(jobs, events)
                continue
            # A closed loop raises: nobody awaits its futures any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, jobs, events)

    def _finish(self) -> None:
        leftovers: list[Job] = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, Job):
                job.error = LogClosed("the log closed before this call ran; nothing was written")
                leftovers.append(job)
        self._settle.extend(leftovers)
        self._flush()
        with self._submit_lock:
            self._accepting = False
            self._finished.set()
            waiters, self._close_waiters = self._close_waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve_close, future)

    # -- reading and caching what other connections committed ----------------------------

    def _invalidate(self) -> None:
        for state in self._states.values():
            state.head = None
            state.reserved_through = None

    def _state(self, path: str) -> _PathState:
        state = self._states.get(path)
        if state is None:
            state = self._states[path] = _PathState()
        if state.head is None:
            state.head = durable_head(self._conn, path)
        if state.reserved_through is None:
            row = self._conn.execute(_RESERVATION, (path,)).fetchone()
            mine = row is not None and row[1] == self._token
            if state.mine and not mine:
                state.block = BLOCK_MIN  # another writer took the row: keep holes small
            state.reserved_through = 0 if row is None else int(row[0])
            state.mine = mine
        return state

    def _sync_foreign(self) -> None:
        """Notice other connections' commits: drop cached heads and push their rows to followers."""
        self._synced_at = monotonic()
        version = self._cur.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._take_foreign(version)

    def _stamp_commit(self) -> str:
        """``created_at`` for the commit about to be made: now, or the latest stamp if later."""
        now = self._timestamp()
        # Fixed-width ISO stamps compare in time order as strings.
        if now < self._last_stamp:
            return self._last_stamp
        self._last_stamp = now
        return now

    def _take_foreign(self, version: int) -> None:
        """Other connections committed (``data_version`` is now ``version``): see to it."""
        self._data_version = version
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

    # -- group commit ---------------------------------------------------------------------

    def _run_group(self, calls: list[WriteCall]) -> None:
        states = self._states
        if len(calls) == 1:
            path = calls[0].path
            state = states.get(path) or states.setdefault(path, _PathState())
            saved = {path: state.snapshot()}
        else:
            paths = {call.path for call in calls}
            saved = {path: states.setdefault(path, _PathState()).snapshot() for path in paths}
        waited: _BusyWait | None = None
        while True:
            self._group_before = {}
            try:
                if not self._run_without_transaction(calls):
                    self._run_in_transaction(calls)
                break
            except Exception as exc:
                for path, snapshot in saved.items():
                    self._states[path].restore(snapshot)
                self._invalidate()
                for call in calls:
                    call.error = call.result = None
                    if isinstance(call, AppendCall):
                        call.fresh = []
                        call.inserted = call.reserved = 0
                if is_busy(exc):
                    # Nothing was written: the thread waits the lock out and runs the group
                    # again; an inline group never waits, it goes to the thread instead.
                    if self._inline:
                        raise _TakenElsewhere from exc
                    waited = waited or _BusyWait(self._busy_timeout)
                    if waited.another():
                        continue
                for call in calls:
                    if isinstance(exc, sqlite3.Error):
                        call.error = storage_error(exc, f"appending to {call.path!r}")
                        call.error.__cause__ = exc
                    else:
                        call.error = exc
                break
            finally:
                self._in_transaction = False
        self._settle.extend(calls)
        following = self._feed.has_subscribers()
        pushes: dict[str, list[StreamEvent]] = {}
        sizes: dict[str, int] = {}
        for call in calls:
            if isinstance(call.error, StreamkitError) and not isinstance(call.error, StorageError):
                self.refused += 1
            if call.error is not None or not isinstance(call, AppendCall):
                continue
            self.appended += call.inserted
            self.ephemeral += call.ephemerals
            self.ephemeral_reservations += call.reserved
            if following and call.fresh:
                pushes.setdefault(call.path, []).extend(call.fresh)
                sizes[call.path] = sizes.get(call.path, 0) + _json_bytes(call.events)
        if pushes:
            self._push_own(pushes, sizes)

    def _push_own(self, pushes: dict[str, list[StreamEvent]], sizes: dict[str, int]) -> None:
        """Publish a group's new events: one push per path, from the path's head before the group."""
        published: list[tuple[str, Push]] = []
        for path, events in pushes.items():
            before = self._group_before[path]
            published.append((path, Push(before, events[-1].offset, events, sizes.get(path, 0))))
            fed = self._fed.get(path)
            durable = [event.offset for event in events if not event.ephemeral]
            if fed is not None and durable:
                self._fed[path] = max(fed, durable[-1])
        self._feed.publish(published, self._wakes)

    def _run_without_transaction(self, calls: list[WriteCall]) -> bool:
        """Hand out ephemerals from own blocks with no transaction; False if one must be reserved."""
        need: dict[str, int] = {}
        for call in calls:
            if (
                not isinstance(call, AppendCall)
                or call.ephemerals != len(call.events)
                or call.expect_head is not None
            ):
                return False
            need[call.path] = need.get(call.path, 0) + call.ephemerals
        self._sync_foreign()
        self._now = self._stamp_commit()
        for path, count in need.items():
            state = self._state(path)
            assert state.head is not None
            assert state.reserved_through is not None
            if not state.mine or max(state.head, state.last_ephemeral) + count > (
                state.reserved_through
            ):
                return False
        for call in calls:
            self._apply(call)
        return True

    def _run_in_transaction(self, calls: list[WriteCall]) -> None:
        cur = self._cur
        cur.execute("BEGIN IMMEDIATE")  # busy: _run_group waits and runs the group again
        self._in_transaction = True
        inflight = False
        try:
            if self._wal is not None:
                self._wal.check()
            self._sync_foreign()
            # Stamped under the write lock and after the look at other commits, so
            # created_at follows commit order across processes.
            self._now = self._stamp_commit()
            wrote = self._apply(calls[0]) if len(calls) == 1 else self._apply_group(calls)
            if wrote:
                self._feed.set_inflight(self._group_before)
                inflight = True
                cur.execute("COMMIT")
                self.transactions += 1
            else:
                cur.execute("ROLLBACK")
        except BaseException:
            self._roll_back(inflight)
            raise

    def _roll_back(self, inflight: bool) -> None:
        """End a failed transaction: drop its in-flight marks, roll back what is left of it."""
        if inflight:
            self._feed.clear_inflight(set(self._group_before))
        if self._conn.in_transaction:
            # SQLite may have rolled back already (it does on I/O and full-disk errors).
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def _apply_group(self, calls: list[WriteCall]) -> bool:
        """Apply several calls in the open transaction; a refused one must roll back alone.

        A group of calls that cannot be refused needs no savepoint at all. Else,
        refusals being rare, the calls first run without a savepoint each (two
        statements per call saved); on the first refusal the whole attempt is
        rolled back to the group's savepoint and replayed with one savepoint
        per call. Replaying gives the same outcome: the calls are deterministic
        given the log, which the write lock keeps still.
        """
        if all(isinstance(call, ClaimCall) or call.certain for call in calls):
            # Nothing here can be refused (no key, no offset precondition), so there
            # is nothing to roll back alone: no savepoints. Nor does any call look up
            # rows, so the plain appends' rows can wait and go in one executemany.
            self._deferred_rows = []
            try:
                for call in calls:
                    if not self._apply(call):
                        raise AssertionError(
                            f"a call without preconditions was refused: {call.error!r}"
                        )
                rows, self._deferred_rows = self._deferred_rows, None
                if rows:
                    self._conn.executemany(_INSERT, rows)
            finally:
                self._deferred_rows = None
            return True
        conn = self._conn
        start = {call.path: self._state(call.path).snapshot() for call in calls}
        conn.execute("SAVEPOINT streamkit_group")
        if all(self._apply(call) for call in calls):
            conn.execute("RELEASE streamkit_group")
            return True
        conn.execute("ROLLBACK TO streamkit_group")
        conn.execute("RELEASE streamkit_group")
        for path, snapshot in start.items():
            self._states[path].restore(snapshot)
        self._group_before = {}
        wrote = False
        for call in calls:
            call.error = call.result = None
            conn.execute("SAVEPOINT streamkit_call")
            if self._apply(call):
                wrote = True
                conn.execute("RELEASE streamkit_call")
            else:
                conn.execute("ROLLBACK TO streamkit_call")
                conn.execute("RELEASE streamkit_call")
        return wrote

    def _apply(self, call: WriteCall) -> bool:
        """Run one call; on refusal undo its effect on the cached state and keep its error."""
        state = self._state(call.path)
        self._group_before.setdefault(call.path, state.head or 0)
        if isinstance(call, AppendCall) and call.plain:
            call.result = self._append_plain(call, state)  # cannot be refused: nothing to undo
            return True
        saved = state.snapshot()
        try:
            if isinstance(call, AppendCall):
                call.result = self._append(call, state)
            else:
                self._claim(call)
            return True
        except StreamkitError as exc:
            state.restore(saved)
            call.error = exc
            call.result = None
            if isinstance(call, AppendCall):
                call.inserted = call.reserved = 0
                call.fresh = []
            return False

    def _claim(self, call: ClaimCall) -> None:
        if call.due_at is None:
            self._conn.execute(_UNCLAIM, (call.path, call.slug))
        else:
            self._conn.execute(_CLAIM, (call.path, call.slug, call.due_at))

    def _append(self, call: AppendCall, state: _PathState) -> list[StreamEvent]:
        """Place the events of a call that is not plain (see :meth:`_append_plain`).

        Returns the committed events in input order.

        ``call.fresh`` gets the events this call adds (what followers are pushed);
        an idempotent hit returns the event committed earlier and is not pushed again.
        """
        path = call.path
        if call.fence is not None:
            # Inside the transaction, before any row: a fence that refuses (a lease
            # taken over, say) leaves this call with nothing written.
            call.fence(self._conn)
        # New events as (input, offset), decoded together at the end in one parser call;
        # ``placed`` maps each input to an index into them or to an earlier committed event.
        fresh: list[tuple[PreparedEvent, int]] = []
        placed: list[int | StreamEvent] = []
        hits = False
        rows: list[tuple[Any, ...]] = []
        keyed: dict[str, int] = {}
        ephemerals_left = call.ephemerals
        call.inserted = call.reserved = 0
        now = self._now
        # The next durable offset is one above the head or the floor below which
        # offsets may have gone to ephemerals; both live in locals while the loop runs.
        head = state.head
        floor = state.last_ephemeral if state.mine else state.reserved_through
        assert head is not None
        assert floor is not None
        # expect_head is judged at the first NEW event: a call whose events are all
        # idempotent hits (the retry of one that landed) returns them, head or not.
        expected = call.expect_head
        for event in call.events:
            if expected is not None and not (event.idempotency_key and not event.ephemeral):
                if head != expected:
                    raise OffsetConflict.of_head(path, expected, head)
                expected = None
            if event.ephemeral:
                state.head = head
                offset = self._next_ephemeral(call, state, ephemerals_left)
                floor = state.last_ephemeral
                ephemerals_left -= 1
                if event.offset is not None and event.offset != offset:
                    raise _offset_conflict(path, event, offset)
                placed.append(len(fresh))
                fresh.append((event, offset))
                continue
            key = event.idempotency_key
            if key is not None:
                index = keyed.get(key)
                if index is not None:
                    first, offset = fresh[index]
                    if not _same_input_body(event, first):
                        raise _key_conflict(path, key, offset)
                    if event.offset is not None and event.offset != offset:
                        raise _offset_conflict(path, event, offset)
                    placed.append(index)
                    hits = True
                    continue
                existing = select_key(self._conn, path, key)
                if existing is not None:
                    if not same_body(event, existing):
                        raise _key_conflict(path, key, existing.offset)
                    if event.offset is not None and event.offset != existing.offset:
                        raise _offset_conflict(path, event, existing.offset)
                    placed.append(existing)
                    hits = True
                    continue
                keyed[key] = len(fresh)
            if expected is not None:
                if head != expected:
                    raise OffsetConflict.of_head(path, expected, head)
                expected = None
            offset = _next_offset(head, floor)
            if event.offset is not None and event.offset != offset:
                raise _offset_conflict(path, event, offset)
            head = offset
            rows.append(
                (
                    path,
                    offset,
                    event.type,
                    event.payload_json,
                    event.metadata_json,
                    event.source_json or "",
                    key or "",
                    now,
                )
            )
            placed.append(len(fresh))
            fresh.append((event, offset))
        state.head = head
        if len(rows) == 1:
            self._cur.execute(_INSERT, rows[0])
        elif rows:
            self._conn.executemany(_INSERT, rows)
        call.inserted = len(rows)
        new = call.fresh = _decode(
            path, [event for event, _ in fresh], [offset for _, offset in fresh], now
        )
        result = new if not hits else [new[i] if isinstance(i, int) else i for i in placed]
        if call.seal is not None:
            # Same transaction as the rows: a control record and its event land together.
            call.seal(self._conn, result)
        return result

    def _append_plain(self, call: AppendCall, state: _PathState) -> list[StreamEvent]:
        """:meth:`_append` for a call of durable events with no key and no offset precondition.

        Nothing in such a call can be refused or already be in the log: its
        events take the next offsets in order, so the rows and the committed
        events are built in one pass each.
        """
        path = call.path
        events = call.events
        first = _next_plain(state)
        offsets = range(first, first + len(events))
        now = self._now
        deferred = self._deferred_rows
        if len(events) == 1:  # the calls of a group, mostly: no comprehension or zip to set up
            e = events[0]
            row = (
                path,
                first,
                e.type,
                e.payload_json,
                e.metadata_json,
                e.source_json or "",
                "",
                now,
            )
            if deferred is not None:
                deferred.append(row)
            else:
                self._cur.execute(_INSERT, row)
        else:
            rows = [
                (
                    path,
                    offset,
                    e.type,
                    e.payload_json,
                    e.metadata_json,
                    e.source_json or "",
                    "",
                    now,
                )
                for offset, e in zip(offsets, events, strict=True)
            ]
            if deferred is not None:
                deferred.extend(rows)
            else:
                self._conn.executemany(_INSERT, rows)
        state.head = offsets[-1]
        call.inserted = len(events)
        call.reserved = 0
        new = call.fresh = _decode(path, events, offsets, now)
        return new

    def _next_ephemeral(self, call: AppendCall, state: _PathState, wanted: int) -> int:
        assert state.head is not None
        assert state.reserved_through is not None
        if state.mine:
            offset = max(state.head, state.last_ephemeral) + 1
            if offset <= state.reserved_through:
                state.last_ephemeral = offset
                return offset
            if state.head > state.reserved_through:
                # Another writer's durable landed past the block (it had to skip it
                # whole): the block was voided, not used up, so do not grow it; under
                # contention small blocks keep the skipped holes small.
                block = BLOCK_MIN
            else:
                block = min(state.block * 2, BLOCK_MAX)  # used up by this writer alone: grow
        else:
            block = BLOCK_MIN
        if not self._in_transaction:
            raise AssertionError("an ephemeral reservation needs the write transaction")
        start = max(state.head, state.reserved_through, state.last_ephemeral) + 1
        block = max(block, wanted)
        through = start + block - 1
        self._conn.execute(_RESERVE, (call.path, through, self._token))
        state.block = block
        state.reserved_through = through
        state.mine = True
        state.last_ephemeral = start
        call.reserved += 1
        return start

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
            if isinstance(exc, sqlite3.Error):
                job.error = storage_error(exc, "write_transaction")
                job.error.__cause__ = exc
            else:
                job.error = exc
        finally:
            # The function may have touched any table: trust nothing cached.
            self._invalidate()

    def _begin_waiting(self) -> None:
        """``BEGIN IMMEDIATE``, waiting out another connection's write lock up to the busy timeout."""
        waited = _BusyWait(self._busy_timeout)
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or not waited.another():
                    raise

    def _run_query(self, job: QueryJob) -> None:
        self._settle.append(job)
        try:
            job.result = job.fn(self._conn)
        except sqlite3.Error as exc:
            job.error = storage_error(exc, "reading the log")
            job.error.__cause__ = exc
        except BaseException as exc:  # whatever fn raises goes back to its caller
            job.error = exc

    def _release_reservations(self) -> None:
        """Give back the unused rest of own blocks so a clean restart leaves no hole."""
        if not self._persistent:
            return
        own = [
            (state.last_ephemeral, path)
            for path, state in self._states.items()
            if state.mine and state.last_ephemeral
        ]
        if not own:
            return
        try:
            self._begin_waiting()
            for last, path in own:
                # Still at or above every offset this writer handed out, so nothing is reused.
                self._conn.execute(_RELEASE, (last, path, self._token))
            self._conn.execute("COMMIT")
        except sqlite3.Error:
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            # Keeping the block only costs a hole in the offsets; nothing is lost.


def _json_bytes(events: Sequence[PreparedEvent]) -> int:
    """The payload and metadata JSON of prepared events: what a push costs a follower to hold."""
    return sum(len(e.payload_json) + len(e.metadata_json) for e in events)


def _next_plain(state: _PathState) -> int:
    """The offset a durable event takes next: past the head and past any ephemeral handed out.

    Ephemerals of this writer come from its reserved block (past the last one
    given); another writer's block is skipped whole, so no offset is used twice.
    """
    head = state.head
    floor = state.last_ephemeral if state.mine else state.reserved_through
    assert head is not None
    assert floor is not None
    return _next_offset(head, floor)


def _next_offset(head: int, floor: int) -> int:
    """The offset rule, in one place: one past the durable head and past the ephemeral floor."""
    return (head if head > floor else floor) + 1


def _decode(
    path: str, events: Sequence[PreparedEvent], offsets: Sequence[int], now: str
) -> list[StreamEvent]:
    """The committed form of new events, decoded from their JSON so each equals a later read."""
    if not events:
        return []
    make = make_event
    if len(events) == 1:
        event = events[0]
        return [
            make(
                path,
                offsets[0],
                event.type,
                decode(event.payload_json),
                decode(event.metadata_json),
                None if event.source_json is None else decode(event.source_json),
                event.idempotency_key,
                now,
                event.ephemeral,
            )
        ]
    # One parser call for all payloads (and one for all metadata) of the call.
    payloads = decode_many([event.payload_json for event in events])
    metadatas = decode_many([event.metadata_json for event in events])
    return [
        make(
            path,
            offset,
            event.type,
            payload,
            metadata,
            None if event.source_json is None else decode(event.source_json),
            event.idempotency_key,
            now,
            event.ephemeral,
        )
        for offset, event, payload, metadata in zip(
            offsets, events, payloads, metadatas, strict=True
        )
    ]


def _same_input_body(a: PreparedEvent, b: PreparedEvent) -> bool:
    """Two inputs of one call have the same body (type, payload, metadata as JSON)."""
    return (
        a.type == b.type
        and (
            a.payload_json == b.payload_json
            or json.loads(a.payload_json) == json.loads(b.payload_json)
        )
        and (
            a.metadata_json == b.metadata_json
            or json.loads(a.metadata_json) == json.loads(b.metadata_json)
        )
    )


def _key_conflict(path: str, key: str, offset: int) -> IdempotencyConflict:
    return IdempotencyConflict(
        f'idempotency key "{key}" already names a different event at offset {offset}; '
        f"nothing was appended (stream {path!r}: retry with the original body, or use a new key)",
        details={"key": key, "offset": offset, "path": path},
    )


def _offset_conflict(path: str, event: PreparedEvent, actual: int) -> OffsetConflict:
    return OffsetConflict(
        f"event #{event.index} expected offset {event.offset} of {path!r} but would land at "
        f"offset {actual}; nothing was appended (read the stream again and retry with the "
        "offset it shows)",
        details={"path": path, "index": event.index, "expected": event.offset, "actual": actual},
    )

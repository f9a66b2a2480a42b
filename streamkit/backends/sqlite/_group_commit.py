"""The group commit of the SQLite writer: offsets, ephemeral reservations, one transaction.

The writer thread (:mod:`._writer`) hands a group of write calls to
:meth:`GroupCommit._run_group`, on its thread or inline on the loop. The group
runs in ONE ``BEGIN IMMEDIATE`` transaction, each refusable call in its own
savepoint (a refused call rolls back alone and keeps its error); a group of
ephemerals that fits this writer's reserved block runs with no transaction
at all. Another connection's write lock is waited out on the thread
(:class:`_BusyWait`) and never on the loop (:class:`_TakenElsewhere`).

How each call's events are placed (the plain fast path, keys, offsets,
claims) is :mod:`._placement`; the offset rule and the reservation of blocks
for ephemerals are in :mod:`._offsets`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from streamkit._requests import AppendCall, ClaimCall, Job, TransactionJob, WriteCall
from streamkit.backends._blocks import ephemeral_needs
from streamkit.backends.sqlite._offsets import (
    RELEASE,
    PathState,
    Snapshot,
)
from streamkit.backends.sqlite._placement import _INSERT, Placement
from streamkit.backends.sqlite._schema import is_busy, storage_error
from streamkit.backends.sqlite._wal_guard import WalIdentity
from streamkit.errors import StorageError, StreamkitError
from streamkit.events import PreparedEvent, StreamEvent
from streamkit.log._follow import Feed, Push, WakeList

__all__ = ["GroupCommit", "transaction_error"]


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


class GroupCommit(Placement):
    """The group-commit half of :class:`~._writer.Writer` (it inherits this; no state of its own).

    The attributes below are the writer's; they are named here so each
    method's use of them is checked.
    """

    _wal: WalIdentity | None
    _busy_timeout: float
    _persistent: bool
    _inline: bool
    _last_stamp: str
    _timestamp: Callable[[], str]
    _feed: Feed
    _fed: dict[str, int]
    _wakes: WakeList
    _settle: list[Job]
    _synced_at: float
    _active_at: float
    transactions: int

    if TYPE_CHECKING:

        def _sync_foreign(self) -> None: ...

    def _invalidate(self) -> None:
        for state in self._states.values():
            state.head = None
            state.reserved_through = None

    def _stamp_commit(self) -> str:
        """``created_at`` for the commit about to be made: now, or the latest stamp if later."""
        # Fixed-width ISO stamps compare in time order as strings: a clock that steps
        # back never makes a later commit look older.
        self._last_stamp = max(self._timestamp(), self._last_stamp)
        return self._last_stamp

    # -- group commit ---------------------------------------------------------------------

    def _run_group(
        self, calls: Sequence[WriteCall], transactions: Sequence[TransactionJob] = ()
    ) -> None:
        """Commit ``calls`` and ``transactions`` in one transaction (each refusable one alone).

        A transaction's function runs after the calls, in a savepoint of its
        own: one that raises rolls back alone and gets its error, the rest
        commit. A failure of the whole transaction fails every job in it.
        """
        states = self._states
        # What a failed attempt must put back: the counters, and the block bookkeeping
        # of ephemerals (a failure forgets every cached head and reservation anyway:
        # _invalidate), so a group without ephemerals, the commonest, saves no state.
        counters = (self.appended, self.ephemeral, self.ephemeral_reservations, self.refused)
        saved: Sequence[tuple[str, Snapshot]] = ()
        if len(calls) > 1:
            paths = {call.path: None for call in calls if call.ephemerals}
            saved = [(path, states.setdefault(path, PathState()).snapshot()) for path in paths]
        elif calls and calls[0].ephemerals:
            saved = ((calls[0].path, states.setdefault(calls[0].path, PathState()).snapshot()),)
        # Ephemerals only may fit this writer's blocks: then no transaction at all.
        blocks_only = bool(calls) and bool(calls[0].ephemerals) and not transactions
        # One look at the followers per group: a follower that subscribes while the group
        # runs starts from the head after it (_start_following), so it misses nothing.
        following = self._following = self._feed.has_subscribers()
        waited: _BusyWait | None = None
        while True:
            if following:  # (the heads before the group: what its pushes start from)
                self._group_before = {}
            try:
                if not (blocks_only and self._run_without_transaction(calls)):
                    self._run_in_transaction(calls, transactions)
                break
            except Exception as exc:
                for path, snapshot in saved:
                    states[path].restore(snapshot)
                self._invalidate()
                (self.appended, self.ephemeral, self.ephemeral_reservations, self.refused) = (
                    counters
                )
                for call in calls:
                    call.error = call.result = None
                    if isinstance(call, AppendCall):
                        call.fresh = ()
                for job in transactions:
                    job.error = job.result = None
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
                        if isinstance(exc, StreamkitError) and not isinstance(exc, StorageError):
                            self.refused += 1
                for job in transactions:
                    job.error = transaction_error(exc)
                break
            finally:
                self._in_transaction = False
        if calls and (calls[0].future is not None or len(calls) > 1):
            self._settle.extend(calls)  # (a lone call without a future is read off by its caller)
        if transactions:
            self._settle.extend(transactions)
            self._invalidate()  # their functions may have touched any table: trust nothing cached
        if following:
            self._push_fresh(calls)
        elif self._fed:
            # Pushed to nobody, so no path is published through its head any more: a
            # path followed again starts from the head it has then (_start_following).
            self._fed.clear()

    def _push_fresh(self, calls: Sequence[WriteCall]) -> None:
        """Publish a group's new events: one push per path, from the path's head before the group."""
        pushes: dict[str, list[StreamEvent]] = {}
        sizes: dict[str, int] = {}
        for call in calls:
            if call.error is None and isinstance(call, AppendCall) and call.fresh:
                pushes.setdefault(call.path, []).extend(call.fresh)
                sizes[call.path] = sizes.get(call.path, 0) + _json_bytes(call.events)
        published: list[tuple[str, Push]] = []
        for path, events in pushes.items():
            before = self._group_before[path]
            published.append((path, Push(before, events[-1].offset, events, sizes[path])))
            fed = self._fed.get(path)
            durable = [event.offset for event in events if not event.ephemeral]
            if fed is not None and durable:
                self._fed[path] = max(fed, durable[-1])
        if published:
            self._active_at = self._synced_at  # events: the log is busy (see Writer._loop)
            self._feed.publish(published, self._wakes)

    def _run_without_transaction(self, calls: Sequence[WriteCall]) -> bool:
        """Hand out ephemerals from own blocks with no transaction; False if one must be reserved."""
        need = ephemeral_needs(calls)
        if need is None:
            return False
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

    def _run_in_transaction(
        self, calls: Sequence[WriteCall], transactions: Sequence[TransactionJob] = ()
    ) -> None:
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
            wrote = False
            if calls:
                wrote = self._apply(calls[0]) if len(calls) == 1 else self._apply_group(calls)
            for job in transactions:
                wrote = self._run_nested(job) or wrote
            if wrote:
                if self._following:
                    self._feed.set_inflight(self._group_before)
                    inflight = True
                cur.execute("COMMIT")
                self.transactions += 1
            else:
                cur.execute("ROLLBACK")
        except BaseException:
            self._roll_back(inflight)
            raise

    def _run_nested(self, job: TransactionJob) -> bool:
        """Run one transaction's function in a savepoint of the open transaction; False if it failed.

        Its error (or result) stays on the job. An error that ended the whole
        transaction (SQLite rolls back by itself on I/O and full-disk errors)
        is raised: the group fails as one.
        """
        conn = self._conn
        conn.execute("SAVEPOINT streamkit_transaction")
        try:
            result = job.fn(conn)
        except BaseException as exc:  # whatever fn raises goes back to its caller
            if not conn.in_transaction:
                raise
            conn.execute("ROLLBACK TO streamkit_transaction")
            conn.execute("RELEASE streamkit_transaction")
            job.error = transaction_error(exc)
            return False
        if not conn.in_transaction:
            raise StorageError(
                "a write_transaction function ended the transaction it shares with a group "
                "commit, which it must never do; whether the appends before it were written "
                "is unknown (read the log to see); retry them with their idempotency keys",
                details={},
            )
        conn.execute("RELEASE streamkit_transaction")
        job.result = result
        return True

    def _roll_back(self, inflight: bool) -> None:
        """End a failed transaction: drop its in-flight marks, roll back what is left of it."""
        if inflight:
            self._feed.clear_inflight(set(self._group_before))
        if self._conn.in_transaction:
            # SQLite may have rolled back already (it does on I/O and full-disk errors).
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def _apply_group(self, calls: Sequence[WriteCall]) -> bool:
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
        counters = (self.appended, self.ephemeral, self.ephemeral_reservations, self.refused)
        conn.execute("SAVEPOINT streamkit_group")
        if all(self._apply(call) for call in calls):
            conn.execute("RELEASE streamkit_group")
            return True
        conn.execute("ROLLBACK TO streamkit_group")
        conn.execute("RELEASE streamkit_group")
        for path, snapshot in start.items():
            self._states[path].restore(snapshot)
        (self.appended, self.ephemeral, self.ephemeral_reservations, self.refused) = counters
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
                self._conn.execute(RELEASE, (last, path, self._token))
            self._conn.execute("COMMIT")
        except sqlite3.Error:
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            # Keeping the block only costs a hole in the offsets; nothing is lost.


def transaction_error(exc: BaseException) -> BaseException:
    """What the caller of a write transaction gets: a sqlite3 error as a StorageError."""
    if isinstance(exc, sqlite3.Error):
        error = storage_error(exc, "write_transaction")
        error.__cause__ = exc
        return error
    return exc


def _json_bytes(events: Sequence[PreparedEvent]) -> int:
    """The payload and metadata JSON of prepared events: what a push costs a follower to hold."""
    return sum(len(e.payload_json) + len(e.metadata_json) for e in events)

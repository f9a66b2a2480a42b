"""The SQLite statements of the shared group commit: one ``BEGIN IMMEDIATE`` per group.

:class:`SqliteStatements` is what :class:`~streamkit.backends._group_commit.GroupCommit`
runs a group through on SQLite. The group runs in ONE ``BEGIN IMMEDIATE``
transaction, each refusable call in its own savepoint (a refused call rolls
back alone and keeps its error), each short transaction riding the group in
a savepoint of its own; a group of ephemerals that fits this writer's
reserved blocks runs with no transaction at all. Before the commit, a
(path, type, version) stored for the first time gets its summary row, and a
path far enough past its settled mark is settled (:mod:`._summary`), and a
path's first stored event sets the floor of its heads row (later commits
leave the row alone: the head is the greater of it and the newest row, and
a trigger raises it when a row above it is deleted, see :mod:`._offsets`).
Another connection's write lock is waited out on the writer thread
(sleeping 1, 2, 4 ... ms, at most 50 ms at a time, up to the busy timeout;
the sleep releases the GIL) and never on the loop: an inline group that
meets it raises :class:`TakenElsewhere` and the thread takes the group
instead.

How each call's events are placed (the plain fast path, keys, offsets,
claims) is :mod:`._placement`; the offset rule and the reservation of blocks
for ephemerals are in :mod:`._offsets`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

from streamkit._requests import ClaimCall, TransactionJob, WriteCall
from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.backends._blocks import ephemeral_needs
from streamkit.backends._group_commit import Group, WriteCounters
from streamkit.backends._stamps import Stamps
from streamkit.backends._stored_types import SummaryRow, summary_rows
from streamkit.backends.sqlite._foreign import ForeignCommits
from streamkit.backends.sqlite._offsets import RELEASE, PathState, Snapshot
from streamkit.backends.sqlite._placement import INSERT, Placement
from streamkit.backends.sqlite._schema import is_busy, storage_error
from streamkit.backends.sqlite._summary import TypeSummary
from streamkit.backends.sqlite._wal_guard import WalIdentity
from streamkit.errors import StorageError
from streamkit.log import Feed

__all__ = ["SqliteStatements", "TakenElsewhere", "begin_waiting", "transaction_error"]

monotonic = time.monotonic

HEAD = (
    "INSERT INTO streamkit_heads (path, reserved_through, reserved_by, head) VALUES (?, 0, '', ?) "
    "ON CONFLICT (path) DO UPDATE SET head = max(head, excluded.head)"
)
"""A path's heads row raised to the last offset a group stored there (see :mod:`._offsets`)."""


def _heads(summary: Sequence[SummaryRow], headed: set[str]) -> list[tuple[str, int]]:
    """Each path's last stored offset among a group's summary rows, for paths not ``headed``."""
    heads: dict[str, int] = {}
    for path, _, _, _, _, last in summary:
        if path not in headed and last > heads.get(path, 0):
            heads[path] = last
    return list(heads.items())


class TakenElsewhere(Exception):
    """An inline group met another connection's write lock: nothing ran; the thread takes it."""


def wait_busy(attempt: int, since: float, timeout: float) -> bool:
    """Sleep before attempt ``attempt + 1`` at a lock busy since ``since``; False once past ``timeout``."""
    left = since + timeout - monotonic()
    if left <= 0:
        return False
    time.sleep(min(0.001 * 2 ** min(attempt - 1, 6), 0.05, left))
    return True


def begin_waiting(conn: sqlite3.Connection, timeout: float) -> None:
    """``BEGIN IMMEDIATE``, waiting out another connection's write lock up to ``timeout`` s."""
    since = monotonic()
    attempt = 0
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            attempt += 1
            if not is_busy(exc) or not wait_busy(attempt, since, timeout):
                raise


def transaction_error(exc: BaseException) -> BaseException:
    """What the caller of a write transaction gets: a sqlite3 error as a StorageError."""
    if isinstance(exc, sqlite3.Error):
        error = storage_error(exc, "write_transaction")
        error.__cause__ = exc
        return error
    return exc


class SqliteStatements:
    """How a group commits on SQLite (see the module docstring)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        cur: sqlite3.Cursor,
        *,
        placement: Placement,
        foreign: ForeignCommits,
        stamps: Stamps,
        counters: WriteCounters,
        feed: Feed,
        busy_timeout: float,
        wal: WalIdentity | None,
    ) -> None:
        self._conn = conn
        self._cur = cur
        self._placement = placement
        self._foreign = foreign
        self._stamps = stamps
        self._counters = counters
        self._feed = feed
        self._busy_timeout = busy_timeout
        self._wal = wal
        # Paths whose heads row this writer saw committed above 0. A row never goes
        # back to 0 (nothing deletes heads rows, every change is a max), so these
        # commits skip it; emptied by any attempt that fails, since it may be undone.
        # A speed trick: under STREAMKIT_PLAIN=1 every commit raises the row.
        self._headed: set[str] = set()
        self._skip_heads = SPEED_TRICKS
        self._summary = TypeSummary()
        # The protocol's hooks that only pass a call on are the parts' own methods:
        # no frame of ours on every commit.
        self.forget: Callable[[], None] = placement.forget
        self.pushed: Callable[[str, int | None], None] = foreign.pushed
        self.unfollowed: Callable[[], None] = foreign.unfollowed

    # -- the GroupStatements protocol ---------------------------------------------------

    def saved(self, calls: Sequence[WriteCall]) -> Sequence[tuple[str, Snapshot]]:
        # Only the block bookkeeping of ephemerals: a failure forgets every cached head
        # and reservation anyway (undo), so a group without ephemerals, the commonest,
        # saves no state.
        states = self._placement.states
        if len(calls) > 1:
            paths = {call.path: None for call in calls if call.ephemerals}
            return [(path, states.setdefault(path, PathState()).snapshot()) for path in paths]
        if calls and calls[0].ephemerals:
            return ((calls[0].path, states.setdefault(calls[0].path, PathState()).snapshot()),)
        return ()

    def undo(self, saved: object) -> None:
        states = self._placement.states
        assert isinstance(saved, Sequence)
        for path, snapshot in saved:
            states[path].restore(snapshot)
        self._placement.forget()

    def attempt(self, group: Group) -> None:
        """One ``BEGIN IMMEDIATE`` for the whole group (or none: see below)."""
        calls = group.calls
        # Ephemerals only may fit this writer's blocks: then no transaction at all
        # (a speed trick; under STREAMKIT_PLAIN=1 every group takes the transaction).
        if (
            SPEED_TRICKS
            and calls
            and calls[0].ephemerals
            and not group.transactions
            and self._without_transaction(group)
        ):
            return
        cur = self._cur
        cur.execute("BEGIN IMMEDIATE")  # busy: the group commit waits and runs it again
        inflight = False
        try:
            if self._wal is not None:
                self._wal.check()
            self._foreign.sync()
            # Stamped under the write lock and after the look at other commits, so
            # created_at follows commit order across processes.
            group.now = self._stamps.stamp()
            wrote = False
            if calls:
                wrote = (
                    self._placement.apply(calls[0], group)
                    if len(calls) == 1
                    else self._apply_group(group)
                )
            for job in group.transactions:
                wrote = self._run_nested(job) or wrote
            headed = self._headed
            fresh: list[tuple[str, int]] = []
            if wrote:
                summary = summary_rows(calls)
                if len(summary) == 1:
                    row = summary[0]
                    if row[0] not in headed:
                        fresh = [(row[0], row[5])]
                        cur.execute(HEAD, fresh[0])
                elif summary:
                    fresh = _heads(summary, headed)
                    self._conn.executemany(HEAD, fresh)
                if summary:
                    self._summary.stage(self._conn, summary)
                if group.following:
                    self._feed.set_inflight(group.starts)
                    inflight = True
                cur.execute("COMMIT")
                self._counters.transactions += 1
                if summary:
                    self._summary.committed()
                if self._skip_heads:
                    headed.update(path for path, _ in fresh)
            else:
                cur.execute("ROLLBACK")
        except BaseException:
            self._headed.clear()
            self._summary.forget()
            if inflight:
                self._feed.clear_inflight(set(group.starts))
            if self._conn.in_transaction:
                # SQLite may have rolled back already (it does on I/O and full-disk errors).
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            raise

    def again(self, exc: Exception, attempt: int, group: Group) -> bool:
        if not is_busy(exc):
            return False
        # Nothing was written: the thread waits the lock out and runs the group again;
        # an inline group never waits, it goes to the thread instead.
        if group.inline:
            raise TakenElsewhere from exc
        if group.first_failed_at is None:
            group.first_failed_at = monotonic()
        return wait_busy(attempt, group.first_failed_at, self._busy_timeout)

    def call_error(self, exc: Exception, call: WriteCall, group: Group) -> BaseException:
        if isinstance(exc, sqlite3.Error):
            error = storage_error(exc, f"appending to {call.path!r}")
            error.__cause__ = exc
            return error
        return exc

    def transaction_error(self, exc: BaseException) -> BaseException:
        return transaction_error(exc)

    # -- the attempts -------------------------------------------------------------------

    def _without_transaction(self, group: Group) -> bool:
        """Hand out ephemerals from own blocks with no transaction; False if one must be reserved."""
        need = ephemeral_needs(group.calls)
        if need is None:
            return False
        self._foreign.sync()
        group.now = self._stamps.stamp()
        placement = self._placement
        for path, count in need.items():
            state = placement.state(path)
            assert state.head is not None
            assert state.reserved_through is not None
            if not state.mine or max(state.head, state.last_ephemeral) + count > (
                state.reserved_through
            ):
                return False
        for call in group.calls:
            placement.apply(call, group, transaction=False)
        return True

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

    def _apply_group(self, group: Group) -> bool:
        """Apply several calls in the open transaction; a refused one must roll back alone.

        A group of calls that cannot be refused needs no savepoint at all. Else,
        refusals being rare, the calls first run without a savepoint each (two
        statements per call saved); on the first refusal the whole attempt is
        rolled back to the group's savepoint and replayed with one savepoint
        per call. Replaying gives the same outcome: the calls are deterministic
        given the log, which the write lock keeps still.
        """
        calls = group.calls
        placement = self._placement
        if SPEED_TRICKS and all(isinstance(call, ClaimCall) or call.certain for call in calls):
            # Nothing here can be refused (no key, no offset precondition), so there
            # is nothing to roll back alone: no savepoints. Nor does any call look up
            # rows, so the plain appends' rows can wait and go in one executemany.
            rows: list[tuple[Any, ...]] = []
            for call in calls:
                if not placement.apply(call, group, deferred=rows):
                    raise AssertionError(
                        f"a call without preconditions was refused: {call.error!r}"
                    )
            if rows:
                self._conn.executemany(INSERT, rows)
            return True
        conn = self._conn
        start = {call.path: placement.state(call.path).snapshot() for call in calls}
        counters = self._counters.saved()
        conn.execute("SAVEPOINT streamkit_group")
        if all(placement.apply(call, group) for call in calls):
            conn.execute("RELEASE streamkit_group")
            return True
        conn.execute("ROLLBACK TO streamkit_group")
        conn.execute("RELEASE streamkit_group")
        for path, snapshot in start.items():
            placement.states[path].restore(snapshot)
        self._counters.restore(counters)
        group.starts.clear()
        wrote = False
        for call in calls:
            call.error = call.result = None
            conn.execute("SAVEPOINT streamkit_call")
            if placement.apply(call, group):
                wrote = True
                conn.execute("RELEASE streamkit_call")
            else:
                conn.execute("ROLLBACK TO streamkit_call")
                conn.execute("RELEASE streamkit_call")
        return wrote

    def release_reservations(self, token: str) -> None:
        """Give back the unused rest of own blocks so a clean restart leaves no hole."""
        own = [
            (state.last_ephemeral, path)
            for path, state in self._placement.states.items()
            if state.mine and state.last_ephemeral
        ]
        if not own:
            return
        conn = self._conn
        try:
            begin_waiting(conn, self._busy_timeout)
            for last, path in own:
                # Still at or above every offset this writer handed out, so nothing is reused.
                conn.execute(RELEASE, (last, path, token))
            conn.execute("COMMIT")
        except sqlite3.Error:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            # Keeping the block only costs a hole in the offsets; nothing is lost.

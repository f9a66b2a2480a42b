"""The group commit of the SQLite writer: offsets, ephemeral reservations, one transaction.

The writer thread (:mod:`._writer`) hands a group of write calls to
:meth:`GroupCommit._run_group`, on its thread or inline on the loop. The group
runs in ONE ``BEGIN IMMEDIATE`` transaction, each refusable call in its own
savepoint (a refused call rolls back alone and keeps its error); a group of
ephemerals that fits this writer's reserved block runs with no transaction
at all. Another connection's write lock is waited out on the thread
(:class:`_BusyWait`) and never on the loop (:class:`_TakenElsewhere`).

The offset rule and the reservation of blocks for ephemerals are in
:mod:`._offsets`.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from streamkit._requests import AppendCall, ClaimCall, Job, WriteCall
from streamkit.backends.sqlite._offsets import (
    BLOCK_MIN,
    RELEASE,
    RESERVATION,
    RESERVE,
    PathState,
    Snapshot,
    next_ephemeral,
    next_offset,
    next_plain,
)
from streamkit.backends.sqlite._read import decode_prepared, durable_head, select_key
from streamkit.backends.sqlite._schema import is_busy, storage_error
from streamkit.backends.sqlite._wal_guard import WalIdentity
from streamkit.errors import IdempotencyConflict, OffsetConflict, StorageError, StreamkitError
from streamkit.events import PreparedEvent, StreamEvent, same_body
from streamkit.log._follow import Feed, Push, WakeList

__all__ = ["GroupCommit"]

_INSERT = (
    'INSERT INTO streamkit_events (path, "offset", type, payload, metadata, source, '
    "idempotency_key, created_at) VALUES (?, ?, ?, ?, ?, NULLIF(?, ''), NULLIF(?, ''), ?)"
)
"""Source and key go in as ``''`` for NULL: neither can be empty (a source is a JSON object,
a key is refused if empty), and ``sqlite3`` binds ``None`` only after a failed adapter
lookup that formats an AttributeError: two per event, some 3% of an append's instructions."""
_CLAIM = (
    "INSERT INTO streamkit_claims (path, slug, due_at) VALUES (?, ?, ?) "
    "ON CONFLICT (path, slug) DO UPDATE SET due_at = excluded.due_at"
)
_UNCLAIM = "DELETE FROM streamkit_claims WHERE path = ? AND slug = ?"


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


class GroupCommit:
    """The group-commit half of :class:`~._writer.Writer` (it inherits this; no state of its own).

    The attributes below are the writer's; they are named here so each
    method's use of them is checked.
    """

    _conn: sqlite3.Connection
    _cur: sqlite3.Cursor
    _wal: WalIdentity | None
    _token: str
    _busy_timeout: float
    _persistent: bool
    _inline: bool
    _in_transaction: bool
    _following: bool
    _deferred_rows: list[tuple[Any, ...]] | None
    _states: dict[str, PathState]
    _group_before: dict[str, int]
    _now: str
    _last_stamp: str
    _timestamp: Callable[[], str]
    _feed: Feed
    _fed: dict[str, int]
    _wakes: WakeList
    _settle: list[Job]
    transactions: int
    appended: int
    ephemeral: int
    ephemeral_reservations: int
    refused: int

    if TYPE_CHECKING:

        def _sync_foreign(self) -> None: ...

    def _invalidate(self) -> None:
        for state in self._states.values():
            state.head = None
            state.reserved_through = None

    def _state(self, path: str) -> PathState:
        state = self._states.get(path)
        if state is None:
            state = self._states[path] = PathState()
        if state.head is None:
            state.head = durable_head(self._conn, path)
        if state.reserved_through is None:
            row = self._conn.execute(RESERVATION, (path,)).fetchone()
            mine = row is not None and row[1] == self._token
            if state.mine and not mine:
                state.block = BLOCK_MIN  # another writer took the row: keep holes small
            state.reserved_through = 0 if row is None else int(row[0])
            state.mine = mine
        return state

    def _stamp_commit(self) -> str:
        """``created_at`` for the commit about to be made: now, or the latest stamp if later."""
        now = self._timestamp()
        # Fixed-width ISO stamps compare in time order as strings.
        if now < self._last_stamp:
            return self._last_stamp
        self._last_stamp = now
        return now

    # -- group commit ---------------------------------------------------------------------

    def _run_group(self, calls: Sequence[WriteCall]) -> None:
        states = self._states
        # What a failed attempt must put back: a failure forgets every cached head and
        # reservation (_invalidate), so only the block bookkeeping of ephemerals is left,
        # and a group without ephemerals (the commonest: a lone append) saves nothing.
        saved: Sequence[tuple[str, Snapshot]] = ()
        if len(calls) > 1:
            paths = {call.path: None for call in calls if call.ephemerals}
            saved = [(path, states.setdefault(path, PathState()).snapshot()) for path in paths]
        elif calls[0].ephemerals:
            path = calls[0].path
            saved = ((path, states.setdefault(path, PathState()).snapshot()),)
        # One look at the followers per group: a follower that subscribes while the group
        # runs starts from the head after it (_start_following), so it misses nothing.
        following = self._following = self._feed.has_subscribers()
        waited: _BusyWait | None = None
        while True:
            if following:  # (the heads before the group: what its pushes start from)
                self._group_before = {}
            try:
                # Ephemerals only may fit this writer's blocks: then no transaction at all.
                if not (calls[0].ephemerals and self._run_without_transaction(calls)):
                    self._run_in_transaction(calls)
                break
            except Exception as exc:
                for path, snapshot in saved:
                    states[path].restore(snapshot)
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
        if calls[0].future is not None or len(calls) > 1:
            self._settle.extend(calls)  # (a lone call without a future is read off by its caller)
        for call in calls:
            error = call.error
            if error is None:
                if type(call) is AppendCall:
                    self.appended += call.inserted
                    if call.ephemerals:
                        self.ephemeral += call.ephemerals
                        self.ephemeral_reservations += call.reserved
            elif isinstance(error, StreamkitError) and not isinstance(error, StorageError):
                self.refused += 1
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
            self._feed.publish(published, self._wakes)

    def _run_without_transaction(self, calls: Sequence[WriteCall]) -> bool:
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

    def _run_in_transaction(self, calls: Sequence[WriteCall]) -> None:
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
        """Run one call; on refusal undo its effect on the cached state and keep its error.

        A plain call (durable events, no key, no offset precondition: the
        commonest by far) is placed here: nothing in it can be refused or be in
        the log already, so its events take the next offsets in order and the
        rows and the committed events are built in one pass each. Any other
        append is placed by :meth:`_append`.
        """
        path = call.path
        state = self._states.get(path)
        if state is None or state.head is None or state.reserved_through is None:
            state = self._state(path)
        if self._following:
            self._group_before.setdefault(path, state.head or 0)
        if not call.plain:
            return self._apply_refusable(call, state)
        assert isinstance(call, AppendCall)
        events = call.events
        first = next_plain(state)
        now = self._now
        deferred = self._deferred_rows  # (rows held back for one executemany: _apply_group)
        offsets: Sequence[int]
        if len(events) == 1:  # the calls of a group, mostly: no comprehension or zip to set up
            offsets = (first,)
            state.head = first
            e = events[0]
            source = e.source_json or ""
            row = (path, first, e.type, e.payload_json, e.metadata_json, source, "", now)
            if deferred is not None:
                deferred.append(row)
            else:
                self._cur.execute(_INSERT, row)
        else:
            offsets = range(first, first + len(events))
            rows = [
                (path, o, e.type, e.payload_json, e.metadata_json, e.source_json or "", "", now)
                for o, e in zip(offsets, events, strict=True)
            ]
            if deferred is not None:
                deferred.extend(rows)
            else:
                self._conn.executemany(_INSERT, rows)
            state.head = offsets[-1]
        call.inserted = len(events)
        call.result = call.fresh = decode_prepared(path, events, offsets, now)
        return True

    def _apply_refusable(self, call: WriteCall, state: PathState) -> bool:
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

    def _append(self, call: AppendCall, state: PathState) -> list[StreamEvent]:
        """Place the events of a call that is not plain (see :meth:`_apply`).

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
                offset, reserved = next_ephemeral(
                    path, state, ephemerals_left, self._reserve if self._in_transaction else None
                )
                call.reserved += reserved
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
            offset = next_offset(head, floor)
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
        new = call.fresh = decode_prepared(
            path, [event for event, _ in fresh], [offset for _, offset in fresh], now
        )
        result = new if not hits else [new[i] if isinstance(i, int) else i for i in placed]
        if call.seal is not None:
            # Same transaction as the rows: a control record and its event land together.
            call.seal(self._conn, result)
        return result

    def _reserve(self, path: str, through: int) -> None:
        self._conn.execute(RESERVE, (path, through, self._token))

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


def _json_bytes(events: Sequence[PreparedEvent]) -> int:
    """The payload and metadata JSON of prepared events: what a push costs a follower to hold."""
    return sum(len(e.payload_json) + len(e.metadata_json) for e in events)


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

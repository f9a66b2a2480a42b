"""The group commit of the PostgreSQL writer: placing a group's calls, in one round trip if it can.

:class:`GroupCommit` is the half of :class:`~._writer.Writer` that runs one
group of write calls (it inherits this; no state of its own):

- plain appends to one path (a lone append, most groups) are ONE statement
  in its own transaction: the head-row upsert, the rows and the ``NOTIFY``;
- a group of ephemerals that fits this writer's reserved blocks runs with no
  transaction: one read of the head rows, no write;
- any other group is one transaction. The head rows of every path it
  touches are locked first, in path order, so two groups of two processes
  never wait on each other in a cycle; consecutive plain calls take their
  offsets with one statement per path and insert every row in one batch;
  any other call runs in its own savepoint with the shared placement rules
  (:mod:`streamkit.backends._placing`), so a refused call rolls back alone
  and keeps its coded error; the commit carries a ``NOTIFY`` per path.

A deadlock or serialization failure reported by the server runs the group
again (nothing was written); a connection that breaks fails the group with
:class:`~streamkit.errors.StorageUnavailable`. A connection that broke while
the commit was in flight leaves the outcome unknown, and the error says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from streamkit._requests import AppendCall, ClaimCall, Job, WriteCall
from streamkit.backends._blocks import BLOCK_MIN, PathState, Snapshot, ephemeral_needs
from streamkit.backends._placing import place_events
from streamkit.backends._stored import decode_prepared
from streamkit.backends._writer_thread import fresh_by_path
from streamkit.backends.postgres._connect import is_disconnect, is_retryable, storage_error
from streamkit.backends.postgres._notify import Fed, notify_channel
from streamkit.backends.postgres._offsets import (
    TAKE,
    HeadRow,
    lock_head,
    read_heads,
    store_head,
    take_offsets,
)
from streamkit.backends.postgres._read import Reads
from streamkit.errors import StorageError, StreamkitError
from streamkit.events import StreamEvent
from streamkit.log._follow import Feed, Push, WakeList

__all__ = ["GroupCommit"]

RETRIES = 5
"""Times a group the server aborted (deadlock, serialization) runs again before it fails."""
MAX_NOTIFY_PATH = 4000
"""A path longer than this (in bytes) is notified without a name: listeners read every path."""

_INSERT = (
    'INSERT INTO {s}.streamkit_events (path, "offset", type, payload, metadata, source, '
    "idempotency_key, created_at) VALUES (%s, %s, %s, %s, %s, NULLIF(%s, ''), NULLIF(%s, ''), %s)"
)
_CLAIM = (
    "INSERT INTO {s}.streamkit_claims (path, slug, due_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (path, slug) DO UPDATE SET due_at = excluded.due_at"
)
_UNCLAIM = "DELETE FROM {s}.streamkit_claims WHERE path = %s AND slug = %s"
_ENSURE_HEADS = (
    "INSERT INTO {s}.streamkit_heads (path) SELECT p FROM unnest(%s::text[]) AS p "
    'ORDER BY p COLLATE "C" ON CONFLICT (path) DO NOTHING'
)
_LOCK_HEADS = (
    'SELECT path FROM {s}.streamkit_heads WHERE path = ANY(%s) ORDER BY path COLLATE "C" FOR UPDATE'
)
# A group of plain appends to one path in one statement (see Writer._run_plain): the
# offset rule (_offsets.TAKE, its one home), the rows, and the NOTIFY.
_PLAIN = (
    "WITH h AS ("
    + TAKE
    + """), rows AS (
    INSERT INTO {s}.streamkit_events
        (path, "offset", type, payload, metadata, source, idempotency_key, created_at)
    SELECT %(path)s, h.head - %(count)s + r.n, r.type, r.payload, r.metadata,
        NULLIF(r.source, ''), NULL, h.stamped
    FROM h, unnest(%(types)s::text[], %(payloads)s::text[], %(metadatas)s::text[],
        %(sources)s::text[]) WITH ORDINALITY AS r(type, payload, metadata, source, n)
), note AS (
    SELECT pg_notify(%(channel)s, %(notified)s)
)
SELECT h.head, h.stamped, (SELECT count(*) FROM note) FROM h
"""
)


class GroupCommit:
    """The group-commit half of the writer (see the module docstring).

    The attributes below are the writer's; they are named here so each
    method's use of them is checked.
    """

    _schema: str
    _token: str
    _timestamp: Callable[[], str]
    _last_stamp: str
    _feed: Feed
    _fed: Fed
    _states: dict[str, PathState]
    _committing: bool
    _settle: list[Job]
    _wakes: WakeList
    transactions: int
    appended: int
    ephemeral: int
    ephemeral_reservations: int
    refused: int

    if TYPE_CHECKING:

        def _connection(self) -> psycopg.Connection[Any]: ...

    def _init_statements(self, schema: str) -> None:
        quoted = f'"{schema}"'
        self._insert = _INSERT.replace("{s}", quoted)
        self._claim = _CLAIM.replace("{s}", quoted)
        self._unclaim = _UNCLAIM.replace("{s}", quoted)
        self._ensure_heads = _ENSURE_HEADS.replace("{s}", quoted)
        self._lock_heads = _LOCK_HEADS.replace("{s}", quoted)
        self._plain = _PLAIN.replace("{s}", quoted)
        self._channel = notify_channel(schema)
        self._reads = Reads(schema)

    def _stamp(self) -> str:
        """``created_at`` for what is placed now: the clock, or the latest stamp seen if later."""
        # Fixed-width ISO stamps compare in time order as strings: a clock that steps
        # back never makes a later commit look older.
        self._last_stamp = max(self._timestamp(), self._last_stamp)
        return self._last_stamp

    def _state(self, path: str) -> PathState:
        state = self._states.get(path)
        if state is None:
            state = self._states[path] = PathState()
        return state

    # -- group commit ---------------------------------------------------------------------

    def _run_group(self, calls: Sequence[WriteCall]) -> None:
        counters = (self.appended, self.ephemeral, self.ephemeral_reservations, self.refused)
        paths = sorted({call.path for call in calls})
        saved: dict[str, Snapshot] = {path: self._state(path).snapshot() for path in paths}
        following = self._feed.has_subscribers()
        attempt = 0
        while True:
            self._committing = False
            try:
                if len(paths) == 1 and all(call.plain for call in calls):
                    self._run_plain(calls, paths[0], following)
                elif not self._run_without_transaction(calls):
                    self._run_in_transaction(calls, paths, following)
                break
            except Exception as exc:
                for path, snapshot in saved.items():
                    self._states[path].restore(snapshot)
                (self.appended, self.ephemeral, self.ephemeral_reservations, self.refused) = (
                    counters
                )
                for call in calls:
                    call.error = call.result = None
                    if isinstance(call, AppendCall):
                        call.fresh = ()
                attempt += 1
                if is_retryable(exc) and attempt < RETRIES:
                    continue  # nothing was written: the server asks for the group again
                self._fail_group(calls, exc)
                break
        self._settle.extend(calls)
        if following:
            self._push_fresh(calls)

    def _fail_group(self, calls: Sequence[WriteCall], exc: Exception) -> None:
        if isinstance(exc, psycopg.Error):
            outcome = (
                "the connection broke while the commit was in flight, so it may or may not "
                "have been written (retry with idempotency keys to find out)"
                if self._committing and is_disconnect(exc)
                else "the transaction was rolled back and nothing was written"
            )
            error: BaseException = storage_error(exc, "appending", outcome=outcome)
            error.__cause__ = exc
        else:
            error = exc
        for call in calls:
            call.error = error
        if isinstance(exc, StreamkitError) and not isinstance(exc, StorageError):
            self.refused += len(calls)

    def _run_without_transaction(self, calls: Sequence[WriteCall]) -> bool:
        """Hand out ephemerals from own blocks with no transaction; False if one must be reserved."""
        need = ephemeral_needs(calls)
        if need is None:
            return False
        rows = read_heads(self._connection(), self._schema, list(need))
        for path, count in need.items():
            row = rows.get(path)
            state = self._state(path)
            if row is None or row.reserved_by != self._token or not state.mine:
                return False
            state.head = row.head
            state.reserved_through = row.reserved_through
            if max(row.head, state.last_ephemeral) + count > row.reserved_through:
                return False
        now = self._stamp()
        for call in calls:
            assert isinstance(call, AppendCall)
            state = self._states[call.path]
            placed = place_events(call, state, now, _no_key, None)
            call.fresh, call.result = placed.committed(call.path, now)
            self.ephemeral += call.ephemerals
        return True

    def _run_in_transaction(
        self, calls: Sequence[WriteCall], paths: list[str], following: bool
    ) -> None:
        conn = self._connection()
        stamps: dict[str, str] = {}
        inflight = False
        try:
            with conn.transaction():
                if len(paths) > 1:
                    # Every head row this group needs, locked in one order for all writers.
                    conn.execute(self._ensure_heads, (paths,))
                    conn.execute(self._lock_heads, (paths,))
                now = self._stamp()
                wrote = False
                plain: list[AppendCall] = []
                for call in calls:
                    if call.plain:
                        assert isinstance(call, AppendCall)
                        plain.append(call)
                        continue
                    if plain:
                        self._place_plain(conn, plain, now, stamps)
                        wrote = True
                        plain = []
                    wrote = self._apply_refusable(conn, call, now, stamps) or wrote
                if plain:
                    self._place_plain(conn, plain, now, stamps)
                    wrote = True
                if wrote:
                    for path in self._notified(calls):
                        conn.execute("SELECT pg_notify(%s, %s)", (self._channel, path))
                    if following:
                        self._feed.set_inflight(_starts(calls))
                        inflight = True
                    self._committing = True
                else:
                    # Nothing to keep (every call refused): roll back rather than commit.
                    raise psycopg.Rollback
            if wrote:
                self.transactions += 1
        except BaseException:
            # (_committing stays as it was: the group's failure says whether the commit was sent)
            if inflight:
                self._feed.clear_inflight(set(_starts(calls)))
            raise
        self._committing = False
        for stamp in stamps.values():
            if stamp > self._last_stamp:
                self._last_stamp = stamp

    def _run_plain(self, calls: Sequence[WriteCall], path: str, following: bool) -> None:
        """Plain appends to one path (the commonest group): ONE statement, its own transaction.

        The head row's upsert, the rows' insert and the notification are one
        statement with data-modifying parts, so the group costs one round trip
        and commits on its own (autocommit); the offsets come back with it.
        """
        conn = self._connection()
        state = self._state(path)
        events = [e for call in calls if isinstance(call, AppendCall) for e in call.events]
        count = len(events)
        now = self._stamp()
        if following:
            # Before the commit: this process's readers stop short of it until its push
            # is out. Any position at or below the commit's start will do; the head
            # this writer saw last is one (a follower reads the rest as a gap).
            self._feed.set_inflight({path: state.head or 0})
        self._committing = True
        try:
            row = conn.execute(
                self._plain,
                {
                    "path": path,
                    "count": count,
                    "writer": self._token,
                    "last_ephemeral": state.last_ephemeral if state.mine else 0,
                    "now": now,
                    "types": [e.type for e in events],
                    "payloads": [e.payload_json for e in events],
                    "metadatas": [e.metadata_json for e in events],
                    "sources": [e.source_json or "" for e in events],
                    "channel": self._channel,
                    "notified": "" if len(path.encode()) > MAX_NOTIFY_PATH else path,
                },
            ).fetchone()
        except BaseException:
            if following:
                self._feed.clear_inflight({path})
            raise
        self._committing = False
        assert row is not None
        last, stamp = int(row[0]), str(row[1])
        if stamp > self._last_stamp:
            self._last_stamp = stamp
        state.head = last
        first = last - count + 1
        for call in calls:
            assert isinstance(call, AppendCall)
            size = len(call.events)
            offsets = range(first, first + size)
            first += size
            call.result = call.fresh = decode_prepared(path, call.events, offsets, stamp)
        self.appended += count
        self.transactions += 1

    def _notified(self, calls: Sequence[WriteCall]) -> list[str]:
        """The payloads to notify: each path with new durable events, or ``""`` for "read all"."""
        paths: dict[str, None] = {}
        for call in calls:
            if (
                isinstance(call, AppendCall)
                and call.error is None
                and any(not event.ephemeral for event in call.fresh)
            ):
                path = call.path
                paths["" if len(path.encode()) > MAX_NOTIFY_PATH else path] = None
        return list(paths)

    def _place_plain(
        self,
        conn: psycopg.Connection[Any],
        calls: list[AppendCall],
        now: str,
        stamps: dict[str, str],
    ) -> None:
        """Place consecutive plain calls: one offset statement per path, one batch of rows."""
        counts: dict[str, int] = {}
        for call in calls:
            counts[call.path] = counts.get(call.path, 0) + len(call.events)
        next_offsets: dict[str, int] = {}
        for path in sorted(counts):
            state = self._state(path)
            taken = take_offsets(
                conn,
                self._schema,
                path,
                counts[path],
                writer=self._token,
                last_ephemeral=state.last_ephemeral if state.mine else 0,
                now=max(now, stamps.get(path, "")),
            )
            next_offsets[path] = taken.first
            stamps[path] = taken.stamp
            state.head = taken.first + counts[path] - 1
        rows: list[tuple[Any, ...]] = []
        for call in calls:
            path = call.path
            first = next_offsets[path]
            stamp = stamps[path]
            offsets = range(first, first + len(call.events))
            next_offsets[path] = first + len(call.events)
            rows.extend(
                (path, o, e.type, e.payload_json, e.metadata_json, e.source_json or "", "", stamp)
                for o, e in zip(offsets, call.events, strict=True)
            )
            call.result = call.fresh = decode_prepared(path, call.events, offsets, stamp)
            self.appended += len(call.events)
        with conn.cursor() as cur:
            cur.executemany(self._insert, rows)

    def _apply_refusable(
        self, conn: psycopg.Connection[Any], call: WriteCall, now: str, stamps: dict[str, str]
    ) -> bool:
        """Run one call that may be refused in its own savepoint; False if it was refused."""
        state = self._state(call.path)
        saved = state.snapshot()
        counters = (self.appended, self.ephemeral, self.ephemeral_reservations)
        try:
            with conn.transaction():
                if isinstance(call, ClaimCall):
                    if call.due_at is None:
                        conn.execute(self._unclaim, (call.path, call.slug))
                    else:
                        conn.execute(self._claim, (call.path, call.slug, call.due_at))
                else:
                    call.result = self._append(conn, call, state, now, stamps)
            return True
        except StreamkitError as exc:
            state.restore(saved)
            (self.appended, self.ephemeral, self.ephemeral_reservations) = counters
            call.error = exc
            call.result = None
            if isinstance(call, AppendCall):
                call.fresh = ()
            if not isinstance(exc, StorageError):
                self.refused += 1
            return False

    def _append(
        self,
        conn: psycopg.Connection[Any],
        call: AppendCall,
        state: PathState,
        now: str,
        stamps: dict[str, str],
    ) -> list[StreamEvent]:
        path = call.path
        if call.fence is not None:
            # Inside the transaction, before any row: a fence that refuses (a lease
            # taken over, say) leaves this call with nothing written.
            call.fence(conn)
        row = lock_head(conn, self._schema, path)
        mine = row.reserved_by == self._token
        if state.mine and not mine:
            state.block = BLOCK_MIN  # another writer took the row: keep holes small
        state.head = row.head
        state.reserved_through = row.reserved_through
        state.mine = mine
        stamp = max(now, row.stamped, stamps.get(path, ""))
        reserved: list[int] = []
        placed = place_events(
            call,
            state,
            stamp,
            lambda key: self._reads.key(conn, path, key),
            lambda _path, through: reserved.append(through),
        )
        if placed.rows:
            with conn.cursor() as cur:
                cur.executemany(self._insert, placed.rows)
        if placed.rows or reserved:
            assert state.head is not None
            assert state.reserved_through is not None
            store_head(
                conn,
                self._schema,
                path,
                HeadRow(
                    state.head,
                    state.reserved_through,
                    self._token if state.mine else row.reserved_by,
                    stamp if placed.rows else row.stamped,
                ),
            )
        if placed.rows:
            stamps[path] = stamp
        call.fresh, result = placed.committed(path, stamp)
        if call.seal is not None:
            # Same transaction as the rows: a control record and its event land together.
            call.seal(conn, result)
        self.appended += len(placed.rows)
        if call.ephemerals:
            self.ephemeral += call.ephemerals
            self.ephemeral_reservations += placed.reserved
        return result

    def _push_fresh(self, calls: Sequence[WriteCall]) -> None:
        """Publish a group's new events: one push per path, proving the range they fill."""
        published: list[tuple[str, Push]] = []
        for path, (events, size) in fresh_by_path(calls).items():
            # The group held the path's row (or drew from its own block), so nothing of
            # anyone else's lies between its first offset and its last.
            published.append((path, Push(events[0].offset - 1, events[-1].offset, events, size)))
            durable = [event.offset for event in events if not event.ephemeral]
            if durable:
                self._fed.advance(path, durable[-1])
        if published:
            self._feed.publish(published, self._wakes)


def _no_key(_key: str) -> StreamEvent | None:
    raise AssertionError("an ephemeral has no idempotency key")


def _starts(calls: Sequence[WriteCall]) -> dict[str, int]:
    """Per path, the position a group's commit starts after (its first offset, less one)."""
    return {path: events[0].offset - 1 for path, (events, _) in fresh_by_path(calls).items()}

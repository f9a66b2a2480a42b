"""The PostgreSQL statements of the shared group commit: one round trip per group if it can.

:class:`PostgresStatements` is what
:class:`~streamkit.backends._group_commit.GroupCommit` runs a group of write
calls through on PostgreSQL:

- plain appends to one path (a lone append, most groups) are ONE statement
  in its own transaction: the head-row upsert, the rows, the summary of
  stored types and the ``NOTIFY``;
- a group of ephemerals that fits this writer's reserved blocks runs with no
  transaction: one read of the head rows, no write;
- any other group is one transaction. The head rows of every path it
  touches are locked first, in path order, so two groups of two processes
  never wait on each other in a cycle; consecutive plain calls take their
  offsets with one statement per path and insert every row in one batch;
  any other call runs in its own savepoint with the shared placement rules
  (:mod:`streamkit.backends._append_rules`), so a refused call rolls back alone
  and keeps its coded error; the commit carries a ``NOTIFY`` per path.

A deadlock or serialization failure reported by the server runs the group
again (nothing was written), and so does a lock wait that timed out behind a
session a frozen process left in its transaction, once that session is
ended (:mod:`streamkit.backends.postgres._frozen`); a connection that breaks fails the group with
:class:`~streamkit.errors.StorageUnavailable`. A connection that broke while
the commit was in flight leaves the outcome unknown, and the error says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from streamkit._requests import AppendCall, ClaimCall, WriteCall
from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.backends._append_rules import event_row, place_events
from streamkit.backends._blocks import BLOCK_MIN, PathState, Snapshot, ephemeral_needs
from streamkit.backends._group_commit import Group, WriteCounters, fresh_by_path, refuse
from streamkit.backends._keys import key_rows
from streamkit.backends._stamps import Stamps
from streamkit.backends._stored import decode_prepared
from streamkit.backends._stored_types import summary_rows
from streamkit.backends.postgres._connect import is_disconnect, is_retryable, storage_error
from streamkit.backends.postgres._frozen import FrozenSessions
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
from streamkit.errors import StreamkitError
from streamkit.events import StreamEvent
from streamkit.log import Feed

__all__ = ["PostgresStatements"]

RETRIES = 5
"""Times a group the server aborted (deadlock, serialization) runs again before it fails."""
MAX_NOTIFY_PATH = 4000
"""A path longer than this (in bytes) is notified without a name: listeners read every path."""

_INSERT = (
    'INSERT INTO {s}.streamkit_events (path, "offset", type, payload, metadata, source, '
    "idempotency_key, created_at, payload_version) "
    "VALUES (%s, %s, %s, %s, %s, NULLIF(%s, ''), NULLIF(%s, ''), %s, %s)"
)
_KEEP_KEY = 'INSERT INTO {s}.streamkit_keys (path, key, "offset") VALUES (%s, %s, %s)'
"""A keyed event's key, in its own table so it outlives the row (:mod:`streamkit.backends._keys`)."""
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
_SUMMARIZE = (
    "INSERT INTO {s}.streamkit_stored_types AS t "
    "(path, type, version, events, first_offset, last_offset) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (path, type, version) DO UPDATE SET "
    "events = t.events + excluded.events, "
    "first_offset = least(t.first_offset, excluded.first_offset), "
    "last_offset = greatest(t.last_offset, excluded.last_offset)"
)
"""One summary row moved by what a group adds (see :mod:`streamkit.backends._stored_types`).
The rows' path is locked in its heads row first, so two writers never wait on each other here."""
# A group of plain appends to one path in one statement (see Writer._run_plain): the
# offset rule (_offsets.TAKE, its one home), the rows, the summary of stored types, and
# the NOTIFY.
_PLAIN = (
    "WITH h AS ("
    + TAKE
    + """), rows AS (
    INSERT INTO {s}.streamkit_events
        (path, "offset", type, payload, metadata, source, idempotency_key, created_at,
        payload_version)
    SELECT %(path)s, h.head - %(count)s + r.n, r.type, r.payload, r.metadata,
        NULLIF(r.source, ''), NULL, h.stamped, r.version
    FROM h, unnest(%(types)s::text[], %(payloads)s::text[], %(metadatas)s::text[],
        %(sources)s::text[], %(versions)s::smallint[])
        WITH ORDINALITY AS r(type, payload, metadata, source, version, n)
    RETURNING "offset", type, payload_version
), summary AS (
    INSERT INTO {s}.streamkit_stored_types AS t
        (path, type, version, events, first_offset, last_offset)
    SELECT %(path)s::text, type, payload_version, count(*), min("offset"), max("offset")
    FROM rows GROUP BY type, payload_version
    ON CONFLICT (path, type, version) DO UPDATE SET
        events = t.events + excluded.events,
        first_offset = least(t.first_offset, excluded.first_offset),
        last_offset = greatest(t.last_offset, excluded.last_offset)
), note AS (
    SELECT pg_notify(%(channel)s, %(notified)s)
)
SELECT h.head, h.stamped, (SELECT count(*) FROM note) FROM h
"""
)


class PostgresStatements:
    """How a group commits on PostgreSQL (see the module docstring).

    Owns the cached :class:`~streamkit.backends._blocks.PathState` of each
    path this writer touched; ``connection()`` is the writer's connection,
    opened again if it broke.
    """

    def __init__(
        self,
        schema: str,
        *,
        token: str,
        connection: Callable[[], psycopg.Connection[Any]],
        stamps: Stamps,
        counters: WriteCounters,
        feed: Feed,
        fed: Fed,
        frozen: FrozenSessions,
    ) -> None:
        self._schema = schema
        self.frozen = frozen
        self._token = token
        self._connection = connection
        self._stamps = stamps
        self._counters = counters
        self._feed = feed
        self._fed = fed
        self.states: dict[str, PathState] = {}
        quoted = f'"{schema}"'
        self._insert = _INSERT.replace("{s}", quoted)
        self._keep_key = _KEEP_KEY.replace("{s}", quoted)
        self._claim = _CLAIM.replace("{s}", quoted)
        self._unclaim = _UNCLAIM.replace("{s}", quoted)
        self._ensure_heads = _ENSURE_HEADS.replace("{s}", quoted)
        self._lock_heads = _LOCK_HEADS.replace("{s}", quoted)
        self._plain = _PLAIN.replace("{s}", quoted)
        self._summarize = _SUMMARIZE.replace("{s}", quoted)
        self._channel = notify_channel(schema)
        self._reads = Reads(schema)

    def _state(self, path: str) -> PathState:
        state = self.states.get(path)
        if state is None:
            state = self.states[path] = PathState()
        return state

    # -- the GroupStatements protocol ---------------------------------------------------

    def saved(self, calls: Sequence[WriteCall]) -> dict[str, Snapshot]:
        return {path: self._state(path).snapshot() for path in {call.path for call in calls}}

    def undo(self, saved: object) -> None:
        assert isinstance(saved, dict)
        for path, snapshot in saved.items():
            self.states[path].restore(snapshot)

    def attempt(self, group: Group) -> None:
        calls = group.calls
        paths = sorted({call.path for call in calls})
        # One statement for plain appends to one path, no transaction for ephemerals
        # that fit own blocks: speed tricks, off under STREAMKIT_PLAIN=1.
        if SPEED_TRICKS and len(paths) == 1 and all(call.plain for call in calls):
            self._run_plain(group, paths[0])
        elif not SPEED_TRICKS or not self._without_transaction(group):
            self._in_transaction(group, paths)

    def again(self, exc: Exception, attempt: int, group: Group) -> bool:
        # Nothing was written: the server asks for the group again (deadlock, serialization),
        # or a frozen process's session held a lock it needed, and is gone now.
        if attempt >= RETRIES:
            return False
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return self.frozen.end(self._connection()) > 0
        return is_retryable(exc)

    def call_error(self, exc: Exception, call: WriteCall, group: Group) -> BaseException:
        if not isinstance(exc, psycopg.Error):
            return exc
        outcome = (
            "the connection broke while the commit was in flight, so it may or may not "
            "have been written (retry with idempotency keys to find out)"
            if group.committing and is_disconnect(exc)
            else "the transaction was rolled back and nothing was written"
        )
        error = storage_error(exc, "appending", outcome=outcome)
        error.__cause__ = exc
        return error

    def transaction_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, psycopg.Error):
            error = storage_error(exc, "write_transaction")
            error.__cause__ = exc
            return error
        return exc

    def forget(self) -> None:
        for state in self.states.values():
            state.head = None

    def pushed(self, path: str, durable_through: int | None) -> None:
        if durable_through is not None:
            self._fed.advance(path, durable_through)

    def unfollowed(self) -> None:
        """(The listener keeps the positions of followed paths; nothing to drop here.)"""

    # -- the attempts -------------------------------------------------------------------

    def _without_transaction(self, group: Group) -> bool:
        """Hand out ephemerals from own blocks with no transaction; False if one must be reserved."""
        need = ephemeral_needs(group.calls)
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
        now = group.now = self._stamps.stamp()
        counters = self._counters
        for call in group.calls:
            assert isinstance(call, AppendCall)
            state = self.states[call.path]
            placed = place_events(call, state, now, _no_key, None)
            call.fresh, call.result = placed.committed(call.path, now)
            counters.ephemeral += call.ephemerals
        return True

    def _in_transaction(self, group: Group, paths: list[str]) -> None:
        conn = self._connection()
        calls = group.calls
        stamps: dict[str, str] = {}
        inflight: dict[str, int] | None = None
        try:
            with conn.transaction():
                if len(paths) > 1:
                    # Every head row this group needs, locked in one order for all writers.
                    conn.execute(self._ensure_heads, (paths,))
                    conn.execute(self._lock_heads, (paths,))
                now = group.now = self._stamps.stamp()
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
                    summary = summary_rows(calls)
                    if summary:
                        with conn.cursor() as cur:
                            cur.executemany(self._summarize, summary)
                    for path in self._notified(calls):
                        conn.execute("SELECT pg_notify(%s, %s)", (self._channel, path))
                    if group.following:
                        inflight = _starts(calls)
                        self._feed.set_inflight(inflight)
                    group.committing = True
                else:
                    # Nothing to keep (every call refused): roll back rather than commit.
                    raise psycopg.Rollback
            if wrote:
                self._counters.transactions += 1
        except BaseException:
            # (committing stays as it was: the group's failure says whether the commit was sent)
            if inflight is not None:
                self._feed.clear_inflight(set(inflight))
            raise
        group.committing = False
        for stamp in stamps.values():
            self._stamps.saw(stamp)

    def _run_plain(self, group: Group, path: str) -> None:
        """Plain appends to one path (the commonest group): ONE statement, its own transaction.

        The head row's upsert, the rows' insert and the notification are one
        statement with data-modifying parts, so the group costs one round trip
        and commits on its own (autocommit); the offsets come back with it.
        """
        conn = self._connection()
        calls = group.calls
        state = self._state(path)
        events = [e for call in calls if isinstance(call, AppendCall) for e in call.events]
        count = len(events)
        now = group.now = self._stamps.stamp()
        if group.following:
            # Before the commit: this process's readers stop short of it until its push
            # is out. Any position at or below the commit's start will do; the head
            # this writer saw last is one (a follower reads the rest as a gap).
            self._feed.set_inflight({path: state.head or 0})
        group.committing = True
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
                    "versions": [e.payload_version for e in events],
                    "channel": self._channel,
                    "notified": "" if len(path.encode()) > MAX_NOTIFY_PATH else path,
                },
            ).fetchone()
        except BaseException:
            if group.following:
                self._feed.clear_inflight({path})
            raise
        group.committing = False
        assert row is not None
        last, stamp = int(row[0]), str(row[1])
        self._stamps.saw(stamp)
        state.head = last
        first = last - count + 1
        for call in calls:
            assert isinstance(call, AppendCall)
            size = len(call.events)
            offsets = range(first, first + size)
            first += size
            call.result = call.fresh = decode_prepared(path, call.events, offsets, stamp)
        self._counters.appended += count
        self._counters.transactions += 1

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
                event_row(path, o, e, stamp) for o, e in zip(offsets, call.events, strict=True)
            )
            call.result = call.fresh = decode_prepared(path, call.events, offsets, stamp)
            self._counters.appended += len(call.events)
        with conn.cursor() as cur:
            cur.executemany(self._insert, rows)

    def _apply_refusable(
        self, conn: psycopg.Connection[Any], call: WriteCall, now: str, stamps: dict[str, str]
    ) -> bool:
        """Run one call that may be refused in its own savepoint; False if it was refused."""
        state = self._state(call.path)
        saved = state.snapshot()
        counters = self._counters.saved()
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
            self._counters.restore(counters)
            return refuse(call, exc, self._counters)

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
                keys = key_rows(placed.rows)
                if keys:
                    cur.executemany(self._keep_key, keys)
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
        self._counters.placed(call, len(placed.rows), placed.reserved)
        return result


def _no_key(_key: str) -> StreamEvent | None:
    raise AssertionError("an ephemeral has no idempotency key")


def _starts(calls: Sequence[WriteCall]) -> dict[str, int]:
    """Per path, the position a group's commit starts after (its first offset, less one)."""
    return {path: events[0].offset - 1 for path, (events, _) in fresh_by_path(calls).items()}

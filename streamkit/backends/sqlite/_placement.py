"""Placing one call inside a group commit: its rows, its offsets, its refusals.

:meth:`Placement._apply` runs one write call in the group's open
transaction (or, for ephemerals that fit this writer's block, with none). A
plain call (durable events, no key, no offset precondition) cannot be refused
and takes the next offsets in one pass. Any other append is placed event by
event by :meth:`Placement._append`: idempotency keys compared by body
(against the call itself and the log), ``offset`` and ``expect_head`` judged
against the head as it stands, the fence run before any row and the seal
after. A refused call keeps its coded error and leaves the writer's cached
state as it was; rolling its rows back is the group's savepoint.
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any

from streamkit._requests import AppendCall, ClaimCall, WriteCall
from streamkit.backends.sqlite._offsets import (
    BLOCK_MIN,
    RESERVATION,
    RESERVE,
    PathState,
    next_ephemeral,
    next_offset,
    next_plain,
)
from streamkit.backends.sqlite._read import decode_prepared, durable_head, select_key
from streamkit.errors import IdempotencyConflict, OffsetConflict, StorageError, StreamkitError
from streamkit.events import PreparedEvent, StreamEvent, same_body

__all__ = ["_INSERT", "Placement"]

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


class Placement:
    """The placement half of the writer's group commit (:class:`~._group_commit.GroupCommit`).

    The attributes below are the writer's; they are named here so each
    method's use of them is checked.
    """

    _conn: sqlite3.Connection
    _cur: sqlite3.Cursor
    _token: str
    _in_transaction: bool
    _following: bool
    _deferred_rows: list[tuple[Any, ...]] | None
    _states: dict[str, PathState]
    _group_before: dict[str, int]
    _now: str
    # The writer's counters (its stats), moved by the placement that earns them; a
    # group that fails puts them back (see GroupCommit._run_group).
    appended: int
    ephemeral: int
    ephemeral_reservations: int
    refused: int

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
        if TYPE_CHECKING:  # (plain only ever marks an append: no isinstance at run time)
            assert isinstance(call, AppendCall)
        events = call.events
        first = next_plain(state)
        now = self._now
        deferred = self._deferred_rows  # (rows held back for one executemany: _apply_group)
        if len(events) == 1:  # the calls of a group, mostly: no comprehension or zip to set up
            e = events[0]
            source = e.source_json or ""
            row = (path, first, e.type, e.payload_json, e.metadata_json, source, "", now)
            if deferred is None:
                self._cur.execute(_INSERT, row)
            else:
                deferred.append(row)
            state.head = first
            self.appended += 1
            call.result = call.fresh = decode_prepared(path, events, (first,), now)
            return True
        offsets = range(first, first + len(events))
        rows = [
            (path, o, e.type, e.payload_json, e.metadata_json, e.source_json or "", "", now)
            for o, e in zip(offsets, events, strict=True)
        ]
        if deferred is None:
            self._conn.executemany(_INSERT, rows)
        else:
            deferred.extend(rows)
        state.head = offsets[-1]
        self.appended += len(events)
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
                call.fresh = ()
            if not isinstance(exc, StorageError):
                self.refused += 1
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
        reserved = 0
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
                offset, reserving = next_ephemeral(
                    path, state, ephemerals_left, self._reserve if self._in_transaction else None
                )
                reserved += reserving
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
        new = call.fresh = decode_prepared(
            path, [event for event, _ in fresh], [offset for _, offset in fresh], now
        )
        result = new if not hits else [new[i] if isinstance(i, int) else i for i in placed]
        if call.seal is not None:
            # Same transaction as the rows: a control record and its event land together.
            call.seal(self._conn, result)
        # Counted once nothing more can refuse the call (the seal may).
        self.appended += len(rows)
        if call.ephemerals:
            self.ephemeral += call.ephemerals
            self.ephemeral_reservations += reserved
        return result

    def _reserve(self, path: str, through: int) -> None:
        self._conn.execute(RESERVE, (path, through, self._token))


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

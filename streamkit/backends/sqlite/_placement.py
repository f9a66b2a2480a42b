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

import sqlite3
from typing import TYPE_CHECKING, Any

from streamkit._requests import AppendCall, ClaimCall, WriteCall
from streamkit.backends._placing import place_events
from streamkit.backends._stored import decode_prepared
from streamkit.backends.sqlite._offsets import (
    BLOCK_MIN,
    RESERVATION,
    RESERVE,
    PathState,
    next_plain,
)
from streamkit.backends.sqlite._read import durable_head, select_key
from streamkit.errors import StorageError, StreamkitError
from streamkit.events import StreamEvent

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

        Returns the committed events in input order. The rules are
        :func:`~streamkit.backends._placing.place_events`; ``call.fresh`` gets
        the events this call adds (what followers are pushed): an idempotent
        hit returns the event committed earlier and is not pushed again.
        """
        path = call.path
        conn = self._conn
        if call.fence is not None:
            # Inside the transaction, before any row: a fence that refuses (a lease
            # taken over, say) leaves this call with nothing written.
            call.fence(conn)
        now = self._now
        placed = place_events(
            call,
            state,
            now,
            lambda key: select_key(conn, path, key),
            self._reserve if self._in_transaction else None,
        )
        rows = placed.rows
        if len(rows) == 1:
            self._cur.execute(_INSERT, rows[0])
        elif rows:
            conn.executemany(_INSERT, rows)
        call.fresh, result = placed.committed(path, now)
        if call.seal is not None:
            # Same transaction as the rows: a control record and its event land together.
            call.seal(conn, result)
        # Counted once nothing more can refuse the call (the seal may).
        self.appended += len(rows)
        if call.ephemerals:
            self.ephemeral += call.ephemerals
            self.ephemeral_reservations += placed.reserved
        return result

    def _reserve(self, path: str, through: int) -> None:
        self._conn.execute(RESERVE, (path, through, self._token))

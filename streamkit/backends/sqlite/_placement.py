"""Placing one call inside a group commit: its rows, its offsets, its refusals.

:meth:`Placement.apply` runs one write call in the group's open
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
from streamkit.backends._append_rules import event_row, place_events
from streamkit.backends._group_commit import Group, WriteCounters, refuse
from streamkit.backends._keys import key_rows
from streamkit.backends._stored import decode_prepared
from streamkit.backends.sqlite._offsets import (
    BLOCK_MIN,
    RESERVATION,
    RESERVE,
    PathState,
    next_plain,
)
from streamkit.backends.sqlite._read import durable_head, select_key
from streamkit.errors import StreamkitError
from streamkit.events import StreamEvent

__all__ = ["INSERT", "KEEP_KEY", "Placement"]

INSERT = (
    'INSERT INTO streamkit_events (path, "offset", type, payload, metadata, source, '
    "idempotency_key, created_at, payload_version) "
    "VALUES (?, ?, ?, ?, ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?)"
)
"""Source and key go in as ``''`` for NULL: neither can be empty (a source is a JSON object,
a key is refused if empty), and ``sqlite3`` binds ``None`` only after a failed adapter
lookup that formats an AttributeError: two per event, some 3% of an append's instructions."""
KEEP_KEY = 'INSERT INTO streamkit_keys (path, key, "offset") VALUES (?, ?, ?)'
"""A keyed event's key, in its own table so it outlives the row (:mod:`streamkit.backends._keys`)."""
_CLAIM = (
    "INSERT INTO streamkit_claims (path, slug, due_at) VALUES (?, ?, ?) "
    "ON CONFLICT (path, slug) DO UPDATE SET due_at = excluded.due_at"
)
_UNCLAIM = "DELETE FROM streamkit_claims WHERE path = ? AND slug = ?"


class Placement:
    """Places calls on the writer connection and caches each path's head and block.

    Owns the cached :class:`~._offsets.PathState` of every path the writer
    touched (loaded from the log on first use, dropped by :meth:`forget`
    whenever another connection may have written), and moves the writer's
    counters as it places. The group being committed is passed in as a
    :class:`~streamkit.backends._group_commit.Group` value.
    """

    def __init__(
        self, conn: sqlite3.Connection, cur: sqlite3.Cursor, token: str, counters: WriteCounters
    ) -> None:
        self._conn = conn
        self._cur = cur
        self._token = token
        self._counters = counters
        self.states: dict[str, PathState] = {}

    def forget(self) -> None:
        """Drop every cached head and reservation: read them again before the next use."""
        for state in self.states.values():
            state.head = None
            state.reserved_through = None

    def state(self, path: str) -> PathState:
        """``path``'s cached state, its head and reservation read from the log if unknown."""
        state = self.states.get(path)
        if state is None:
            state = self.states[path] = PathState()
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

    def apply(
        self,
        call: WriteCall,
        group: Group,
        *,
        transaction: bool = True,
        deferred: list[tuple[Any, ...]] | None = None,
    ) -> bool:
        """Run one call; on refusal undo its effect on the cached state and keep its error.

        A plain call (durable events, no key, no offset precondition: the
        commonest by far) is placed here: nothing in it can be refused or be in
        the log already, so its events take the next offsets in order and the
        rows and the committed events are built in one pass each. Any other
        append is placed by :meth:`_append`. ``transaction``: whether a
        transaction is open (else only ephemerals from own blocks are placed).
        ``deferred``: plain rows are held there for one ``executemany``.
        """
        path = call.path
        state = self.states.get(path)
        if state is None or state.head is None or state.reserved_through is None:
            state = self.state(path)
        if group.following:
            group.starts.setdefault(path, state.head or 0)
        if not call.plain:
            return self._apply_refusable(call, state, group, transaction)
        if TYPE_CHECKING:  # (plain only ever marks an append: no isinstance at run time)
            assert isinstance(call, AppendCall)
        events = call.events
        first = next_plain(state)
        now = group.now
        if len(events) == 1:  # the calls of a group, mostly: no comprehension or zip to set up
            row = event_row(path, first, events[0], now)
            if deferred is None:
                self._cur.execute(INSERT, row)
            else:
                deferred.append(row)
            state.head = first
            self._counters.appended += 1
            call.result = call.fresh = decode_prepared(path, events, (first,), now)
            return True
        offsets = range(first, first + len(events))
        rows = [event_row(path, o, e, now) for o, e in zip(offsets, events, strict=True)]
        if deferred is None:
            self._conn.executemany(INSERT, rows)
        else:
            deferred.extend(rows)
        state.head = offsets[-1]
        self._counters.appended += len(events)
        call.result = call.fresh = decode_prepared(path, events, offsets, now)
        return True

    def _apply_refusable(
        self, call: WriteCall, state: PathState, group: Group, transaction: bool
    ) -> bool:
        saved = state.snapshot()
        try:
            if isinstance(call, AppendCall):
                call.result = self._append(call, state, group.now, transaction)
            else:
                self._claim(call)
            return True
        except StreamkitError as exc:
            state.restore(saved)
            return refuse(call, exc, self._counters)

    def _claim(self, call: ClaimCall) -> None:
        if call.due_at is None:
            self._conn.execute(_UNCLAIM, (call.path, call.slug))
        else:
            self._conn.execute(_CLAIM, (call.path, call.slug, call.due_at))

    def _append(
        self, call: AppendCall, state: PathState, now: str, transaction: bool
    ) -> list[StreamEvent]:
        """Place the events of a call that is not plain (see :meth:`apply`).

        Returns the committed events in input order. The rules are
        :func:`~streamkit.backends._append_rules.place_events`; ``call.fresh`` gets
        the events this call adds (what followers are pushed): an idempotent
        hit returns the event committed earlier and is not pushed again.
        """
        path = call.path
        conn = self._conn
        if call.fence is not None:
            # Inside the transaction, before any row: a fence that refuses (a lease
            # taken over, say) leaves this call with nothing written.
            call.fence(conn)
        placed = place_events(
            call,
            state,
            now,
            lambda key: select_key(conn, path, key),
            self._reserve if transaction else None,
        )
        rows = placed.rows
        if len(rows) == 1:
            self._cur.execute(INSERT, rows[0])
        elif rows:
            conn.executemany(INSERT, rows)
        keys = key_rows(rows)
        if len(keys) == 1:
            self._cur.execute(KEEP_KEY, keys[0])
        elif keys:
            conn.executemany(KEEP_KEY, keys)
        call.fresh, result = placed.committed(path, now)
        if call.seal is not None:
            # Same transaction as the rows: a control record and its event land together.
            call.seal(conn, result)
        # Counted once nothing more can refuse the call (the seal may).
        self._counters.placed(call, len(rows), placed.reserved)
        return result

    def _reserve(self, path: str, through: int) -> None:
        self._conn.execute(RESERVE, (path, through, self._token))

"""Placing the events of one refusable append: keys, offset preconditions, ephemerals.

A call that is not plain (an idempotency key, an ``offset`` or
``expect_head`` precondition, an ephemeral, a fence or a seal) is placed
event by event by :func:`place_events`, against what the backend knows of
the path (its :class:`~streamkit.backends._blocks.PathState`, read under the
backend's write lock) and what ``find_key`` finds in its rows. Every backend
uses this one function, so the rules hold alike everywhere:

- an idempotency key matches the call itself first, then the path's keys; a
  match of the same body (type, payload and metadata as JSON) returns the
  earlier event, another body is an :class:`~streamkit.errors.IdempotencyConflict`
  (a key whose event is no longer stored is judged by its recorded hash,
  :mod:`streamkit.backends._keys`);
- ``expect_head`` is judged at the first NEW durable event, so a retry whose
  events all landed already returns them whatever the head is now;
- an ``offset`` precondition is checked where the event lands or landed;
- ephemerals take offsets from the writer's reserved block.

A refusal raises before the backend writes a row; the backend rolls back
and restores the path's state itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from streamkit._requests import AppendCall
from streamkit.backends._blocks import PathState, next_ephemeral, next_offset
from streamkit.backends._keys import KeptKey, kept_event
from streamkit.backends._stored import decode_prepared
from streamkit.errors import IdempotencyConflict, OffsetConflict
from streamkit.events import Appended, PreparedEvent, StreamEvent, same_body

__all__ = ["Placed", "Row", "event_row", "place_events"]

Row = tuple[str, int, str, str, str, str, str, str, int]
"""An event row to insert: path, offset, type, payload, metadata, source, key, created_at,
payload version.

Source and key are ``''`` for none (neither can be empty otherwise); the
backend's INSERT turns ``''`` back into NULL."""


def event_row(path: str, offset: int, event: PreparedEvent, now: str) -> Row:
    """The row ``event`` is inserted as at ``offset``: every backend's INSERT takes this order."""
    return (
        path,
        offset,
        event.type,
        event.payload_json,
        event.metadata_json,
        event.source_json or "",
        event.idempotency_key or "",
        now,
        event.payload_version,
    )


@dataclass(slots=True)
class Placed:
    """Where a call's events go: the rows to insert and how to build what the call returns."""

    rows: list[Row]
    fresh: list[tuple[PreparedEvent, int]]
    """The events this call adds (durable and ephemeral), with their offsets, in order."""
    placed: list[int | StreamEvent]
    """Per input: an index into ``fresh``, or the committed event an idempotency key matched."""
    hits: bool
    """Whether any input matched an event committed earlier (or earlier in the call)."""
    reserved: int
    """Blocks of ephemeral offsets reserved for this call (0 or 1 each time one ran out)."""

    def committed(self, path: str, now: str) -> tuple[list[StreamEvent], list[StreamEvent]]:
        """``(new, result)``: the events this call adds, and what it returns in input order."""
        new = decode_prepared(
            path, [event for event, _ in self.fresh], [offset for _, offset in self.fresh], now
        )
        if not self.hits:
            return new, new
        result = [new[i] if isinstance(i, int) else i for i in self.placed]
        earlier = frozenset(i.offset for i in self.placed if not isinstance(i, int))
        return new, Appended(result, earlier) if earlier else result


def place_events(
    call: AppendCall,
    state: PathState,
    now: str,
    find_key: Callable[[str], StreamEvent | KeptKey | None],
    reserve: Callable[[str, int], None] | None,
) -> Placed:
    """Place the events of ``call`` on ``state`` (moved forward as they land); raise to refuse.

    ``find_key(key)`` returns the committed event of the path under an
    idempotency key, if any, or what the key's row kept of an event no longer
    stored (:mod:`streamkit.backends._keys`); ``reserve(path, through)`` records a new block
    of ephemeral offsets (``None`` where the backend may not reserve, outside
    a write transaction).
    """
    path = call.path
    fresh: list[tuple[PreparedEvent, int]] = []
    placed: list[int | StreamEvent] = []
    hits = False
    rows: list[Row] = []
    keyed: dict[str, int] = {}
    ephemerals_left = call.ephemerals
    reserved = 0
    # The next durable offset is one above the head or the floor below which
    # offsets may have gone to ephemerals; both live in locals while the loop runs.
    head = state.head
    floor = state.last_ephemeral if state.mine else state.reserved_through
    assert head is not None
    assert floor is not None
    expected = call.expect_head
    for event in call.events:
        if expected is not None and not (event.idempotency_key and not event.ephemeral):
            if head != expected:
                raise OffsetConflict.of_head(path, expected, head)
            expected = None
        if event.ephemeral:
            state.head = head
            offset, reserving = next_ephemeral(path, state, ephemerals_left, reserve)
            reserved += reserving
            floor = state.last_ephemeral
            ephemerals_left -= 1
            if event.offset is not None and event.offset != offset:
                raise offset_conflict(path, event, offset)
            placed.append(len(fresh))
            fresh.append((event, offset))
            continue
        key = event.idempotency_key
        if key is not None:
            index = keyed.get(key)
            if index is not None:
                first, offset = fresh[index]
                if not _same_input_body(event, first):
                    raise key_conflict(path, key, offset)
                if event.offset is not None and event.offset != offset:
                    raise offset_conflict(path, event, offset)
                placed.append(index)
                hits = True
                continue
            existing = find_key(key)
            if existing is not None:
                if isinstance(existing, KeptKey):
                    existing = kept_event(path, key, event, existing)
                elif not same_body(event, existing):
                    raise key_conflict(path, key, existing.offset)
                if event.offset is not None and event.offset != existing.offset:
                    raise offset_conflict(path, event, existing.offset)
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
            raise offset_conflict(path, event, offset)
        head = offset
        rows.append(event_row(path, offset, event, now))
        placed.append(len(fresh))
        fresh.append((event, offset))
    state.head = head
    return Placed(rows, fresh, placed, hits, reserved)


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


def key_conflict(path: str, key: str, offset: int) -> IdempotencyConflict:
    """The refusal of a different body under an idempotency key already used at ``offset``."""
    return IdempotencyConflict(
        f'idempotency key "{key}" already names a different event at offset {offset}; '
        f"nothing was appended (stream {path!r}: retry with the original body, or use a new key)",
        details={"key": key, "offset": offset, "path": path},
    )


def offset_conflict(path: str, event: PreparedEvent, actual: int) -> OffsetConflict:
    """The refusal of an event whose ``offset`` precondition is not where it lands."""
    return OffsetConflict(
        f"event #{event.index} expected offset {event.offset} of {path!r} but would land at "
        f"offset {actual}; nothing was appended (read the stream again and retry with the "
        "offset it shows)",
        details={"path": path, "index": event.index, "expected": event.offset, "actual": actual},
    )

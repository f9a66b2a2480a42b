"""The summary of what a log stores: one row per (path, type, payload version).

Every backend keeps a small table beside its events, one row per stored
(path, type, version) with the number of events and their first and last
offsets, exact after every commit: a commit that lands counts, a rollback
leaves it as it was. PostgreSQL moves the rows in the SAME transaction as the
rows they count; SQLite makes a key's row in its first event's transaction
and settles the counts in steps, its reads adding what lies past each path's
mark (:mod:`streamkit.backends.sqlite._summary`). Questions about what a log
holds (``streamkit schema check``, a host's check at start) read it instead
of scanning the log.

:func:`summary_rows` turns the calls of one committed group into one row per
distinct key in the group, never one per event (PostgreSQL's upserts; on
SQLite, the keys a commit may make and the paths it may settle).
Ephemeral events are never stored and are not counted; an idempotent hit
added nothing and is not counted again; a refused call has no fresh events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamkit._requests import AppendCall, WriteCall
from streamkit.records import StoredType

__all__ = ["SummaryRow", "stored_type", "summary_rows"]

SummaryRow = tuple[str, str, int, int, int, int]
"""``(path, type, version, count, first_offset, last_offset)``: what one upsert adds."""


def summary_rows(calls: Sequence[WriteCall]) -> list[SummaryRow]:
    """What the committed calls of one group add to the summary, one row per key."""
    if len(calls) == 1:
        call = calls[0]
        if call.error is not None or not isinstance(call, AppendCall):
            return []
        fresh = call.fresh
        if len(fresh) == 1:  # a lone append of one event: most groups
            event = fresh[0]
            if event.ephemeral:
                return []
            o = event.offset
            return [(call.path, event.type, event.payload_version, 1, o, o)]
    found: dict[tuple[str, str, int], list[int]] = {}
    for call in calls:
        if call.error is not None or not isinstance(call, AppendCall):
            continue
        path = call.path
        for event in call.fresh:
            if event.ephemeral:
                continue
            o = event.offset
            seen = found.get((path, event.type, event.payload_version))
            if seen is None:
                found[(path, event.type, event.payload_version)] = [1, o, o]
            else:
                seen[0] += 1
                seen[1] = min(seen[1], o)
                seen[2] = max(seen[2], o)
    return [(p, t, v, n, first, last) for (p, t, v), (n, first, last) in found.items()]


def stored_type(row: Sequence[Any]) -> StoredType:
    """A summary row as read back: (path, type, version, count, first, last)."""
    path, type_, version, count, first, last = row
    return StoredType(str(path), str(type_), int(version), int(count), int(first), int(last))

"""Idempotency keys that outlive their events: the key table and how a retry is judged by it.

Every backend keeps a path's keys in a table of their own
(``streamkit_keys``: path, key, offset), written in the transaction of the
append that used the key, and not in an index over the events. A key
therefore still answers after its event's row is gone. While the row is
there a retry is compared with it as always (:func:`~streamkit.events.same_body`).
Once retention removes the row it records the body's hash and the event's
``created_at`` in the key's row first (:func:`body_sha256`); a retry of
the same body then gets the original offset back and writes nothing, one
of another body gets :class:`~streamkit.errors.IdempotencyConflict`. A key
whose row was deleted with no hash recorded (by hand, outside streamkit)
cannot be judged: the retry is refused with that said, rather than append
a second copy or accept a different body unseen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamkit._json_canonical import canonical_json
from streamkit.backends._stored import decode_prepared
from streamkit.errors import IdempotencyConflict
from streamkit.events import PreparedEvent, StreamEvent, same_body

__all__ = ["KeptKey", "body_sha256", "kept_event", "key_rows"]


@dataclass(frozen=True, slots=True)
class KeptKey:
    """A key whose event is no longer in the events table: what its row still records."""

    offset: int
    body_sha256: str | None
    """The hash of the event's body (:func:`body_sha256`); None if nobody recorded it."""
    created_at: str | None
    archived: Callable[[], StreamEvent | None] | None = None
    """Reads the event back from the archive (within the caller's transaction), where a
    segment holds it; None where none could."""


def body_sha256(type_: str, payload_json: str, metadata_json: str) -> str:
    """The hex SHA-256 of an event's body (type, payload, metadata) in one canonical JSON form.

    Two bodies :func:`~streamkit.events.same_body` calls equal (JSON-equal
    payload and metadata, keys in any order) hash alike.
    """
    text = canonical_json([type_, json.loads(payload_json), json.loads(metadata_json)])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def key_rows(rows: list[Any]) -> list[tuple[str, str, int]]:
    """``(path, key, offset)`` of each keyed event row a call inserts (rows as ``event_row``)."""
    return [(row[0], row[6], row[1]) for row in rows if row[6]]


def kept_event(path: str, key: str, event: PreparedEvent, kept: KeptKey) -> StreamEvent:
    """The answer to a retry of ``key`` whose event is no longer stored; raise to refuse.

    The event returned is the committed one as far as it can be known: its
    offset and ``created_at`` from the key's row, its body the retry's own
    (equal to the stored one by hash), its source the retry's.
    """
    if kept.body_sha256 is None:
        raise IdempotencyConflict(
            f'idempotency key "{key}" names the event at offset {kept.offset} of {path!r}, '
            "which is no longer in the log and whose body was not recorded (its row was "
            "deleted outside streamkit's retention), so this retry cannot be judged; nothing "
            "was appended (use a new key if this is a new event)",
            details={"key": key, "offset": kept.offset, "path": path, "reason": "unrecorded"},
        )
    if body_sha256(event.type, event.payload_json, event.metadata_json) != kept.body_sha256:
        # Not the stored body to the letter: the archive, where it holds the event, lets the
        # retry be compared as a stored one is (in the newer shape, by the log's catalog).
        stored = None if kept.archived is None else kept.archived()
        if stored is not None and stored.offset == kept.offset and same_body(event, stored):
            return stored
        raise IdempotencyConflict(
            f'idempotency key "{key}" already names a different event at offset {kept.offset} '
            f"(archived; compared by its body's hash); nothing was appended (stream {path!r}: "
            "retry with the original body, or use a new key)",
            details={"key": key, "offset": kept.offset, "path": path, "reason": "archived"},
        )
    return decode_prepared(path, [event], [kept.offset], kept.created_at or "")[0]

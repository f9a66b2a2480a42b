"""Stored events: committed events built from rows or appended inputs, and a page's proof.

Both directions decode the stored JSON texts, so an event an append returns
equals the one a later read returns, field for field. Nothing is checked
here: every text was validated and encoded by the log before it was written.
A typed read (``types``) only validates payloads into the models a reader
asked for, as each event is built, so a catch-up builds each event once.
A stored row is ``(offset, type, payload, metadata, source, idempotency_key,
created_at)``, the column order every backend's reads select.

:func:`page_of` is the proof rule of SPEC section 2, for every backend: a
page cut short (by ``limit`` or by :data:`MAX_PAGE_BYTES`) proves through
its last event, not at the head; a short page proves through the head, which
one snapshot shows is its last row (or at most ``after``), or through
``upto`` when the read was bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamkit._fast import make_event
from streamkit._json import decode, decode_many
from streamkit.events import PreparedEvent, ReadPage, StreamEvent
from streamkit.protocols import PayloadTypes

__all__ = ["MAX_PAGE_BYTES", "Row", "decode_prepared", "decode_rows", "page_of"]

MAX_PAGE_BYTES = 4 * 1024 * 1024
"""The stored JSON a read page holds at most (one event always fits, whatever its size)."""

Row = tuple[int, str, str, str, str | None, str | None, str]
"""A stored event: offset, type, payload, metadata, source, idempotency key, created_at."""


def decode_rows(
    path: str, rows: Sequence[Row], types: PayloadTypes | None = None
) -> list[StreamEvent]:
    """Committed events from stored rows (no validation: they were validated when written).

    With ``types``, the payload of each event whose type it names is
    validated into that type's model as the event is built (see
    :data:`~streamkit.protocols.PayloadTypes`).
    """
    if not rows:
        return []
    payloads = decode_many([row[2] for row in rows])
    metadatas = decode_many([row[3] for row in rows])
    if types:
        _type_payloads(rows, payloads, types)
    make = make_event
    return [
        make(
            path,
            offset,
            etype,
            payload,
            metadata,
            None if source is None else decode(source),
            key,
            created_at,
            False,
        )
        for (offset, etype, _, _, source, key, created_at), payload, metadata in zip(
            rows, payloads, metadatas, strict=True
        )
    ]


def _type_payloads(rows: Sequence[Row], payloads: list[Any], types: PayloadTypes) -> None:
    """Validate in place each payload whose event type ``types`` names; a refused one stays."""
    typed = types.get
    for at, row in enumerate(rows):
        validate = typed(row[1])
        if validate is not None:
            payload = payloads[at]
            # An absent payload is ``{}``, as everywhere a payload is validated. A
            # refused one stays decoded: the reader's fold reports it (a try, not
            # contextlib.suppress: this runs once per event of a catch-up).
            try:  # noqa: SIM105
                payloads[at] = validate({} if payload is None else payload)
            except Exception:
                pass


def decode_prepared(
    path: str, events: Sequence[PreparedEvent], offsets: Sequence[int], now: str
) -> list[StreamEvent]:
    """The committed form of new events, decoded from their JSON so each equals a later read."""
    if not events:
        return []
    make = make_event
    if len(events) == 1:
        event = events[0]
        return [
            make(
                path,
                offsets[0],
                event.type,
                decode(event.payload_json),
                {} if event.metadata_json == "{}" else decode(event.metadata_json),
                None if event.source_json is None else decode(event.source_json),
                event.idempotency_key,
                now,
                event.ephemeral,
            )
        ]
    # One parser call for all payloads (and one for all metadata) of the call.
    payloads = decode_many([event.payload_json for event in events])
    metadatas = decode_many([event.metadata_json for event in events])
    return [
        make(
            path,
            offset,
            event.type,
            payload,
            metadata,
            None if event.source_json is None else decode(event.source_json),
            event.idempotency_key,
            now,
            event.ephemeral,
        )
        for offset, event, payload, metadata in zip(
            offsets, events, payloads, metadatas, strict=True
        )
    ]


def page_of(
    path: str,
    rows: Sequence[Row],
    after: int,
    upto: int | None,
    full: bool,
    types: PayloadTypes | None = None,
) -> ReadPage:
    """The page of ``rows`` (read in one snapshot) with its proof; ``full``: cut short."""
    if full:
        return ReadPage(decode_rows(path, rows, types), rows[-1][0], False)
    # Nothing lies past the last row (within ``upto``): the proof reaches the head, or ``upto``.
    through = max(after, rows[-1][0]) if rows else after
    if upto is not None:
        through = max(through, upto)
    return ReadPage(decode_rows(path, rows, types), through, True)

"""Stored events: committed events built from rows or appended inputs, and a page's proof.

Both directions decode the stored JSON texts, so an event an append returns
equals the one a later read returns, field for field. Nothing is checked
here: every text was validated and encoded by the log before it was written.
A typed read (``types``) only validates payloads (stored at version 1) into
the models a reader asked for, as each event is built, so a catch-up builds each event once;
its page builds them as they are taken and keeps none (:class:`TypedEvents`).
A stored row is ``(offset, type, payload, metadata, source, idempotency_key,
created_at, payload_version)``, the column order every backend's reads
select (a row stored without a version selects 1).

:func:`page_of` is the proof rule of SPEC section 2, for every backend: a
page cut short (by ``limit`` or by :data:`MAX_PAGE_BYTES`) proves through
its last event, not at the head; a short page proves through the head, which
one snapshot shows is its last row (or at most ``after``), or through
``upto`` when the read was bounded.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

from streamkit._event_builders import make_event
from streamkit._json import decode, decode_many
from streamkit.events import PreparedEvent, ReadPage, StreamEvent
from streamkit.protocols import PayloadTypes

__all__ = ["MAX_PAGE_BYTES", "Row", "TypedEvents", "decode_prepared", "decode_rows", "page_of"]

MAX_PAGE_BYTES = 4 * 1024 * 1024
"""The stored JSON a read page holds at most (one event always fits, whatever its size)."""

Row = tuple[int, str, str, str, str | None, str | None, str, int]
"""A stored event: offset, type, payload, metadata, source, idempotency key, created_at,
payload version."""


def decode_rows(
    path: str, rows: Sequence[Row], types: PayloadTypes | None = None
) -> Sequence[StreamEvent]:
    """Committed events from stored rows (no validation: they were validated when written).

    With ``types``, the events come as :class:`TypedEvents`: each payload of
    a type ``types`` names is validated into its model as its event is built
    (see :data:`~streamkit.protocols.PayloadTypes`).
    """
    if not rows:
        return []
    payloads = decode_many([row[2] for row in rows])
    metadatas = decode_many([row[3] for row in rows])
    if types:
        return TypedEvents(path, rows, payloads, metadatas, types)
    return list(_events(path, rows, payloads, metadatas, None))


def _events(
    path: str,
    rows: Sequence[Row],
    payloads: Sequence[Any],
    metadatas: Sequence[Any],
    types: PayloadTypes | None,
) -> Iterator[StreamEvent]:
    """Each row as its event: the one place a stored row becomes a :class:`StreamEvent`."""
    make = make_event
    typed = types.get if types else None
    for (offset, etype, _, _, source, key, created_at, version), payload, metadata in zip(
        rows, payloads, metadatas, strict=True
    ):
        if typed is not None and version == 1 and (validate := typed(etype)) is not None:
            # An absent payload is ``{}``, as everywhere a payload is validated. A
            # refused one stays decoded: the reader's fold reports it. A payload of
            # another version stays decoded too: its shape is not the model's.
            try:  # noqa: SIM105 (a try costs less than contextlib.suppress, once per event)
                payload = validate({} if payload is None else payload)
            except Exception:
                pass
        yield make(
            path,
            offset,
            etype,
            payload,
            metadata,
            None if source is None else decode(source),
            key,
            created_at,
            False,
            version,
        )


class TypedEvents(Sequence[StreamEvent]):
    """The events of a typed page, each built when it is taken from the page and kept by no one.

    A fold takes each event once and drops it, so a catch-up holds one event
    and its model at a time, not a page of them: the page keeps only its rows
    and their decoded JSON. Held as a list, a page's events and models
    outlived the garbage collector's youngest generation, and each was
    promoted and scanned again: about a fifth of a catch-up's time, measured.
    Taking the same index twice builds two equal events, not one;
    ``list(page.events)`` keeps them.
    """

    __slots__ = ("_metadatas", "_path", "_payloads", "_rows", "_types")

    def __init__(
        self,
        path: str,
        rows: Sequence[Row],
        payloads: list[Any],
        metadatas: list[Any],
        types: PayloadTypes,
    ) -> None:
        self._path = path
        self._rows = rows
        self._payloads = payloads
        self._metadatas = metadatas
        self._types = types

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> StreamEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[StreamEvent]: ...

    def __getitem__(self, index: int | slice) -> StreamEvent | list[StreamEvent]:
        if isinstance(index, slice):
            return list(self._part(index))
        if index < 0:
            index += len(self._rows)
        if not 0 <= index < len(self._rows):
            raise IndexError("page index out of range")
        return next(self._part(slice(index, index + 1)))

    def __iter__(self) -> Iterator[StreamEvent]:
        return _events(self._path, self._rows, self._payloads, self._metadatas, self._types)

    def __eq__(self, other: object) -> bool:
        # Equal to the list of the same events, as the plain page's list is.
        if isinstance(other, TypedEvents | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TypedEvents({list(self)!r})"

    def _part(self, part: slice) -> Iterator[StreamEvent]:
        return _events(
            self._path, self._rows[part], self._payloads[part], self._metadatas[part], self._types
        )


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
                event.payload_version,
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
            event.payload_version,
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

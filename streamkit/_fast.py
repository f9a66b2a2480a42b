"""The object fast paths of streamkit, each beside its plain twin.

Building a :class:`~streamkit.events.StreamEvent` and validating a payload
run once per event on every read and catch-up, so two tricks pay for
themselves; each has a plain twin that gives the same object, and a
hypothesis test holds each pair to that (``tests/core/test_fast_paths.py``).
:data:`FAST` is the one switch.

- :func:`make_event` (positional constructor) and :func:`with_payload` (a copy
  with another payload): a frozen dataclass's ``__init__`` stores each field
  through ``object.__setattr__``; the slot descriptors fill the same storage
  without that detour, at about a third of the cost. Used only while
  ``StreamEvent`` has exactly the fields listed here as slots, else the plain
  constructor and :func:`dataclasses.replace`.
- :func:`payload_validator`: a model's core validator (what
  ``model_validate`` calls, minus a Python layer), for models fully built;
  else ``model_validate``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from streamkit.events import StreamEvent

__all__ = [
    "FAST",
    "EventMaker",
    "make_event",
    "make_event_plain",
    "payload_validator",
    "payload_validator_plain",
    "with_payload",
    "with_payload_plain",
]

FAST = True
"""The one switch of this module's fast paths (read once, at import)."""

EventMaker = Callable[
    [str, int, str, Any, dict[str, Any], dict[str, Any] | None, str | None, str, bool], StreamEvent
]

_FIELDS = (
    "path",
    "offset",
    "type",
    "payload",
    "metadata",
    "source",
    "idempotency_key",
    "created_at",
    "ephemeral",
)


def make_event_plain(
    path: str,
    offset: int,
    etype: str,
    payload: Any,
    metadata: dict[str, Any],
    source: dict[str, Any] | None,
    key: str | None,
    created_at: str,
    ephemeral: bool,
) -> StreamEvent:
    """The plain twin of :func:`make_event`: the dataclass constructor."""
    return StreamEvent(
        path=path,
        offset=offset,
        type=etype,
        payload=payload,
        metadata=metadata,
        source=source,
        idempotency_key=key,
        created_at=created_at,
        ephemeral=ephemeral,
    )


def with_payload_plain(event: StreamEvent, payload: Any) -> StreamEvent:
    """The plain twin of :func:`with_payload`: :func:`dataclasses.replace`."""
    return dataclasses.replace(event, payload=payload)


def _slot_tricks() -> tuple[EventMaker, Callable[[StreamEvent, Any], StreamEvent]] | None:
    names = tuple(f.name for f in dataclasses.fields(StreamEvent))
    if not FAST or names != _FIELDS or tuple(getattr(StreamEvent, "__slots__", ())) != _FIELDS:
        return None
    (s_path, s_offset, s_type, s_payload, s_metadata, s_source, s_key, s_created, s_eph) = (
        StreamEvent.__dict__[name].__set__ for name in _FIELDS
    )
    new = object.__new__

    def make(
        path: str,
        offset: int,
        etype: str,
        payload: Any,
        metadata: dict[str, Any],
        source: dict[str, Any] | None,
        key: str | None,
        created_at: str,
        ephemeral: bool,
    ) -> StreamEvent:
        event: StreamEvent = new(StreamEvent)
        s_path(event, path)
        s_offset(event, offset)
        s_type(event, etype)
        s_payload(event, payload)
        s_metadata(event, metadata)
        s_source(event, source)
        s_key(event, key)
        s_created(event, created_at)
        s_eph(event, ephemeral)
        return event

    def copy(event: StreamEvent, payload: Any) -> StreamEvent:
        return make(
            event.path,
            event.offset,
            event.type,
            payload,
            event.metadata,
            event.source,
            event.idempotency_key,
            event.created_at,
            event.ephemeral,
        )

    return make, copy


_TRICKS = _slot_tricks()
make_event: EventMaker = make_event_plain if _TRICKS is None else _TRICKS[0]
"""``make_event(path, offset, type, payload, metadata, source, key, created_at, ephemeral)``."""
with_payload: Callable[[StreamEvent, Any], StreamEvent] = (
    with_payload_plain if _TRICKS is None else _TRICKS[1]
)
"""A copy of ``event`` with ``payload`` in place of its own."""


def payload_validator_plain(schema: type[BaseModel]) -> Callable[[Any], BaseModel]:
    """The plain twin of :func:`payload_validator`: ``model_validate``."""
    return schema.model_validate


def payload_validator(schema: type[BaseModel]) -> Callable[[Any], BaseModel]:
    """The function that validates a payload into ``schema``, as cheaply as is safe."""
    if FAST and schema.__pydantic_complete__:
        validate: Callable[[Any], BaseModel] = schema.__pydantic_validator__.validate_python
        return validate
    return payload_validator_plain(schema)

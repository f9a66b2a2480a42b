"""How streamkit builds events and payload validators: fast paths, each beside its plain twin.

Building a :class:`~streamkit.events.StreamEvent` and validating a payload
run once per event on every read and catch-up, so two tricks pay for
themselves; each has a plain twin that gives the same object, and a
hypothesis test holds each pair to that (``tests/core/test_fast_paths.py``).
:data:`FAST` is the one switch.

- :func:`make_event` (positional constructor), :func:`with_payload` (a copy
  with another payload) and :func:`reshaped` (a copy under another type,
  payload and version): a frozen dataclass's ``__init__`` stores each field
  through ``object.__setattr__``; an unfrozen class of the same slots stores
  them directly and the instance then takes ``StreamEvent`` as its class, at
  about a quarter of the cost (see :class:`_Unfrozen`). Used only while
  ``StreamEvent`` has exactly the fields listed here as slots, else the plain
  constructor and :func:`dataclasses.replace`.
- :func:`payload_validator`: a model's core validator (what
  ``model_validate`` calls, minus a Python layer), for models fully built;
  else ``model_validate``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.errors import InvalidRequest
from streamkit.events import StreamEvent

__all__ = [
    "FAST",
    "EventMaker",
    "PayloadTypes",
    "failure_text",
    "make_event",
    "make_event_plain",
    "payload_validator",
    "payload_validator_plain",
    "payload_validators",
    "reshaped",
    "reshaped_plain",
    "with_payload",
    "with_payload_plain",
]

FAST = SPEED_TRICKS
"""Whether this module's fast paths are on: :data:`streamkit._speed.FAST`, the one switch."""

EventMaker = Callable[
    [str, int, str, Any, dict[str, Any], dict[str, Any] | None, str | None, str, bool, int],
    StreamEvent,
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
    "payload_version",
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
    version: int,
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
        payload_version=version,
    )


def with_payload_plain(event: StreamEvent, payload: Any) -> StreamEvent:
    """The plain twin of :func:`with_payload`: :func:`dataclasses.replace`."""
    return dataclasses.replace(event, payload=payload)


def reshaped_plain(event: StreamEvent, etype: str, payload: Any, version: int) -> StreamEvent:
    """The plain twin of :func:`reshaped`: :func:`dataclasses.replace`."""
    return dataclasses.replace(event, type=etype, payload=payload, payload_version=version)


class _Unfrozen:
    """StreamEvent's slot layout without its frozen ``__setattr__``: an event's scaffold.

    Its ``__init__`` stores each field with the interpreter's own slot store;
    :func:`make_event` then sets the instance's class to ``StreamEvent``, which
    Python allows between classes of one layout. The result is a
    ``StreamEvent`` in every respect (its type, fields, equality and
    frozenness), built at about 60% of the cost of nine slot descriptor calls.
    """

    __slots__ = _FIELDS

    def __init__(
        self,
        path: str,
        offset: int,
        type: str,
        payload: Any,
        metadata: dict[str, Any],
        source: dict[str, Any] | None,
        idempotency_key: str | None,
        created_at: str,
        ephemeral: bool,
        payload_version: int,
    ) -> None:
        self.path = path
        self.offset = offset
        self.type = type
        self.payload = payload
        self.metadata = metadata
        self.source = source
        self.idempotency_key = idempotency_key
        self.created_at = created_at
        self.ephemeral = ephemeral
        self.payload_version = payload_version


Reshaper = Callable[[StreamEvent, str, Any, int], StreamEvent]
"""``(event, type, payload, version) -> event``: what :data:`reshaped` is."""


def _slot_tricks() -> tuple[EventMaker, Callable[[StreamEvent, Any], StreamEvent], Reshaper] | None:
    names = tuple(f.name for f in dataclasses.fields(StreamEvent))
    if not FAST or names != _FIELDS or tuple(getattr(StreamEvent, "__slots__", ())) != _FIELDS:
        return None
    try:
        probe: Any = _Unfrozen("/", 1, "t", {}, {}, None, None, "", False, 1)
        probe.__class__ = StreamEvent
    except TypeError:  # a layout this Python will not swap: the plain twins
        return None
    scaffold = _Unfrozen

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
        version: int,
    ) -> StreamEvent:
        event: Any = scaffold(
            path, offset, etype, payload, metadata, source, key, created_at, ephemeral, version
        )
        event.__class__ = StreamEvent
        built: StreamEvent = event
        return built

    def reshape(event: StreamEvent, etype: str, payload: Any, version: int) -> StreamEvent:
        return make(
            event.path,
            event.offset,
            etype,
            payload,
            event.metadata,
            event.source,
            event.idempotency_key,
            event.created_at,
            event.ephemeral,
            version,
        )

    def copy(event: StreamEvent, payload: Any) -> StreamEvent:
        return reshape(event, event.type, payload, event.payload_version)

    return make, copy, reshape


_TRICKS = _slot_tricks()
make_event: EventMaker = make_event_plain if _TRICKS is None else _TRICKS[0]
"""``make_event(path, offset, type, payload, metadata, source, key, created_at, ephemeral,
version)``."""
with_payload: Callable[[StreamEvent, Any], StreamEvent] = (
    with_payload_plain if _TRICKS is None else _TRICKS[1]
)
"""A copy of ``event`` with ``payload`` in place of its own."""
reshaped: Reshaper = reshaped_plain if _TRICKS is None else _TRICKS[2]
"""``reshaped(event, type, payload, version)``: a copy under another type, payload and version
(an old event lifted to its current shape)."""


def payload_validator_plain(schema: type[BaseModel]) -> Callable[[Any], BaseModel]:
    """The plain twin of :func:`payload_validator`: ``model_validate``."""
    return schema.model_validate


def payload_validator(schema: type[BaseModel]) -> Callable[[Any], BaseModel]:
    """The function that validates a payload into ``schema``, as cheaply as is safe."""
    if FAST and schema.__pydantic_complete__:
        validate: Callable[[Any], BaseModel] = schema.__pydantic_validator__.validate_python
        return validate
    return payload_validator_plain(schema)


PayloadTypes = Mapping[str, Callable[[Any], Any]]
"""Event type -> the function that validates its decoded payload into its model.

What a backend's typed read is handed: each event whose type it names is
built once, with its payload already the model a processor's fold would make
of it. A payload its function refuses is left as decoded JSON; the fold
validates it again, meets the same refusal, and reports it as malformed, as
for an untyped read. The function runs on the thread the backend reads on.
"""


def payload_validators(types: object) -> PayloadTypes:
    """The :data:`PayloadTypes` of a typed read's ``types`` (event type -> model).

    Anything but a mapping of type strings to pydantic model classes is
    refused before anything is read.
    """
    if isinstance(types, Mapping) and all(
        isinstance(etype, str) and isinstance(schema, type) and issubclass(schema, BaseModel)
        for etype, schema in types.items()
    ):
        return {etype: payload_validator(schema) for etype, schema in types.items()}
    raise InvalidRequest(
        "types must map event type strings to pydantic model classes, got "
        f"{types!r:.200}; nothing was read",
        details={"types": repr(types)[:200]},
    )


def failure_text(exc: BaseException) -> str:
    """Why a payload was not read, in one line of at most 300 characters.

    A validation error gives its first field and problem (and how many more);
    anything else its message, whitespace folded.
    """
    if isinstance(exc, ValidationError) and exc.errors():
        errors = exc.errors()
        first = errors[0]
        where = ".".join(str(part) for part in first["loc"]) or "the payload"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"{where}: {first['msg']}{more}"[:300]
    text = " ".join(str(exc).split())
    return (text or repr(exc))[:300]

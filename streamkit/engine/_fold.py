"""The one fold: which events a processor reduces, and how one event is reduced.

Shared by the engine's live path, its version re-reduce and
``streamkit.testing.reduce_processor``, so a replay can never disagree with the
live fold (a coercion applied live but not on replay would make a version bump
rewrite state). Also the state's JSON form for checkpoints, and the structured
reports of failures the engine swallows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from typing import Any, Generic, TypeVar

import structlog
from pydantic import BaseModel

from streamkit.events import StreamEvent
from streamkit.live_state import LIVE_STATE_CHANGED
from streamkit.processor import StreamProcessor

__all__ = ["Fold", "reduces_predicate", "report"]

S = TypeVar("S")

_Validate = Callable[[Any], BaseModel]

_log = structlog.get_logger("streamkit.engine")


def report(what: str, exc: BaseException | None, *, slug: str, **fields: Any) -> None:
    """Report a failure the engine swallows (it keeps running), as one structured log line."""
    _log.warning(what, slug=slug, error=None if exc is None else repr(exc), **fields)


def reduces_predicate(consumes: tuple[str, ...] | None) -> Callable[[StreamEvent], bool]:
    """The consumes rule of :func:`~streamkit.processor.consumes_event`, compiled, minus deltas.

    A live-state delta is never reduced or reacted to, whatever ``consumes``
    says: it is a notification about state, and folding it back in would loop.
    """
    named = frozenset(consumes or ()) - {LIVE_STATE_CHANGED}
    if consumes is not None and "*" not in named:
        # Named types only: a named type is taken ephemeral or not, so the
        # type alone decides (this runs once per event on the catch-up path).
        def reduces_named(event: StreamEvent) -> bool:
            return event.type in named

        return reduces_named

    def reduces(event: StreamEvent) -> bool:
        etype = event.type
        if event.ephemeral:
            return etype in named
        return etype != LIVE_STATE_CHANGED

    return reduces


def _copy_with_payload_slow(event: StreamEvent, payload: BaseModel) -> StreamEvent:
    return replace(event, payload=payload)


_STREAM_EVENT_FIELDS = (
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


def _fast_copier() -> Callable[[StreamEvent, BaseModel], StreamEvent]:
    """A copy of an event with another payload, at about a third of the cost of replace().

    A frozen dataclass's ``__init__`` stores each field through
    ``object.__setattr__``; the slot descriptors hold the same storage without
    that detour, and this runs once per event on the catch-up path. Should
    StreamEvent ever gain or lose a field, the plain ``replace`` is used instead.
    """
    if tuple(f.name for f in fields(StreamEvent)) != _STREAM_EVENT_FIELDS:
        return _copy_with_payload_slow
    slots = vars(StreamEvent)
    set_path, set_offset, set_type, set_payload, set_metadata = (
        slots[name].__set__ for name in _STREAM_EVENT_FIELDS[:5]
    )
    set_source, set_key, set_created_at, set_ephemeral = (
        slots[name].__set__ for name in _STREAM_EVENT_FIELDS[5:]
    )
    new = object.__new__

    def copy_with_payload(event: StreamEvent, payload: BaseModel) -> StreamEvent:
        copy = new(StreamEvent)
        set_path(copy, event.path)
        set_offset(copy, event.offset)
        set_type(copy, event.type)
        set_payload(copy, payload)
        set_metadata(copy, event.metadata)
        set_source(copy, event.source)
        set_key(copy, event.idempotency_key)
        set_created_at(copy, event.created_at)
        set_ephemeral(copy, event.ephemeral)
        return copy

    return copy_with_payload


_with_payload = _fast_copier()


class Fold(Generic[S]):
    """Validate, normalize and reduce events for one processor, never raising.

    :meth:`apply` folds one event and returns the next state and the event as
    the hooks must see it (its payload the validated model when the type is
    declared), or ``None`` for the event when its payload is malformed: such an
    event is skipped for the reduce AND the effects, and reported. A reduce that
    raises keeps the previous state and is reported; it never wedges the
    processor. :meth:`fold_all` is the same fold over many events with no
    effects to run (catch-up, re-reduce, the test harness), in one loop.
    """

    __slots__ = (
        "_contract",
        "_on_error",
        "_reduce",
        "_slug",
        "_validators",
        "last_malformed",
        "last_reduce_failure",
        "malformed",
        "reduce_failures",
        "reduces",
    )

    def __init__(
        self,
        processor: StreamProcessor[S],
        *,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        contract = processor.contract
        self._contract = contract
        self._on_error = on_error
        self._slug = contract.slug
        self._reduce = processor.reduce
        # Per event type: its payload model and that model's validate function,
        # or None for an undeclared type. Filled on first sight of each type.
        self._validators: dict[str, tuple[type[BaseModel], _Validate] | None] = {}
        self.reduces = reduces_predicate(contract.consumes)
        # What operators see in `streamkit status`: counts, and the latest of each
        # as {offset, type, error}.
        self.malformed = 0
        self.reduce_failures = 0
        self.last_malformed: dict[str, Any] | None = None
        self.last_reduce_failure: dict[str, Any] | None = None

    def _validator_for(self, etype: str) -> tuple[type[BaseModel], _Validate] | None:
        schema = self._contract.payload_schema_for(etype)
        entry: tuple[type[BaseModel], _Validate] | None = None
        if schema is not None:
            # The core validator is what model_validate calls, minus a layer of
            # Python per event; a model not yet fully built keeps the safe path.
            validate: _Validate = (
                schema.__pydantic_validator__.validate_python
                if schema.__pydantic_complete__
                else schema.model_validate
            )
            entry = (schema, validate)
        self._validators[etype] = entry
        return entry

    def apply(self, event: StreamEvent, state: S) -> tuple[S, StreamEvent | None]:
        """Fold one event into ``state``; see the class docstring."""
        normalized = self._normalize(event)
        if normalized is None:
            return state, None
        try:
            next_state = self._reduce(normalized, state)
        except Exception as exc:
            self._reduce_failed(normalized, exc)
            return state, normalized
        return (state if next_state is None else next_state), normalized

    def fold_all(self, events: Iterable[StreamEvent], state: S) -> tuple[S, int]:
        """Fold every event this processor reduces; return the state and how many were folded.

        Exactly :meth:`apply` per event (filtered by :attr:`reduces`), in one loop.
        """
        reduces = self.reduces
        validators = self._validators
        reduce = self._reduce
        folded = 0
        for event in events:
            if not reduces(event):
                continue
            etype = event.type
            try:
                entry = validators[etype]
            except KeyError:
                entry = self._validator_for(etype)
            if entry is not None:
                payload = event.payload
                if type(payload) is not entry[0]:
                    try:
                        model = entry[1]({} if payload is None else payload)
                    except Exception as exc:
                        self._malformed(event, exc)
                        continue
                    event = _with_payload(event, model)
            folded += 1
            try:
                next_state = reduce(event, state)
            except Exception as exc:
                self._reduce_failed(event, exc)
                continue
            if next_state is not None:
                state = next_state
        return state, folded

    def _normalize(self, event: StreamEvent) -> StreamEvent | None:
        etype = event.type
        try:
            entry = self._validators[etype]
        except KeyError:
            entry = self._validator_for(etype)
        if entry is None:
            return event
        schema, validate = entry
        payload = event.payload
        if type(payload) is schema:
            return event
        try:
            # An absent payload is ``{}``, the same convention the log uses.
            model = validate({} if payload is None else payload)
        except Exception as exc:
            self._malformed(event, exc)
            return None
        return _with_payload(event, model)

    def _malformed(self, event: StreamEvent, exc: Exception) -> None:
        self.malformed += 1
        self.last_malformed = _incident(event, exc)
        if self._on_error is not None:
            self._on_error(exc)
        report(
            "processor.payload_malformed",
            exc,
            slug=self._slug,
            offset=event.offset,
            type=event.type,
            detail="skipped for reduce and effects",
        )

    def _reduce_failed(self, event: StreamEvent, exc: Exception) -> None:
        self.reduce_failures += 1
        self.last_reduce_failure = _incident(event, exc)
        if self._on_error is not None:
            self._on_error(exc)
        report(
            "processor.reduce_failed",
            exc,
            slug=self._slug,
            offset=event.offset,
            type=event.type,
            detail="previous state kept",
        )


def _incident(event: StreamEvent, exc: Exception) -> dict[str, Any]:
    return {"offset": event.offset, "type": event.type, "error": repr(exc)[:500]}

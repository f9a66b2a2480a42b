"""Each fast path gives what its plain twin gives, for any input (the faust rule)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from streamkit import StreamkitError, _event_builders, _json, _speed
from streamkit.events import (
    MAX_EVENT_BYTES,
    MAX_TYPE_LENGTH,
    StreamEvent,
    prepare_event,
    prepare_event_plain,
)

# JSON values as the log stores them: no NaN or infinities (the log refuses them).
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
objects = st.dictionaries(st.text(max_size=8), values, max_size=5)


@pytest.mark.skipif(not _speed.FAST, reason="STREAMKIT_PLAIN=1: the plain twins are exported")
def test_the_fast_paths_are_in_use_on_this_python() -> None:
    """On CPython with its C accelerators the fast twins are the ones exported."""
    assert _json.FAST
    assert _event_builders.FAST
    assert _json.decode is not _json.decode_plain
    assert _json._FROM_JSON is not None
    assert _json.encode_object is not _json.encode_object_plain
    assert _event_builders.make_event is not _event_builders.make_event_plain
    assert _event_builders.with_payload is not _event_builders.with_payload_plain
    assert _event_builders.reshaped is not _event_builders.reshaped_plain


def test_one_switch_turns_the_fast_paths_off() -> None:
    """Both modules follow streamkit._speed.FAST: STREAMKIT_PLAIN=1 is the one switch."""
    assert _json.FAST is _speed.FAST
    assert _event_builders.FAST is _speed.FAST


@given(objects)
def test_encode_object_is_the_plain_encoder(value: dict[str, Any]) -> None:
    """The C encoder writes exactly the text JSONEncoder.encode writes."""
    assert _json.encode_object(value) == _json.encode_object_plain(value)


def test_encode_object_refuses_nan_like_the_plain_encoder() -> None:
    """NaN is refused by both (ValueError), so no input that cannot be read back is written."""
    for encode in (_json.encode_object, _json.encode_object_plain):
        with pytest.raises(ValueError, match="JSON compliant"):
            encode({"x": math.nan})


@given(values)
def test_decode_is_json_loads(value: Any) -> None:
    """The scanner reads back what json.loads reads, for compact and spaced texts alike."""
    for text in (json.dumps(value, separators=(",", ":")), json.dumps(value)):
        assert _json.decode(text) == _json.decode_plain(text)


@pytest.mark.parametrize("text", ["", " ", "{} x", "[1,", "nul", '{"a":1} {"b":2}', "1 2"])
def test_decode_refuses_what_json_loads_refuses(text: str) -> None:
    """Malformed or trailing text is refused by both with json's own error."""
    with pytest.raises(json.JSONDecodeError):
        _json.decode_plain(text)
    with pytest.raises(json.JSONDecodeError):
        _json.decode(text)


@given(st.lists(objects, max_size=6), st.booleans())
def test_decode_many_is_one_loads_per_text(items: list[dict[str, Any]], spaced: bool) -> None:
    """One parser call over many texts gives each text's own value, as json reads it."""
    texts = [
        json.dumps(item) if spaced else json.dumps(item, separators=(",", ":")) for item in items
    ]
    many = _json.decode_many(texts)
    assert many == [json.loads(text) for text in texts] == _json.decode_many_plain(texts)
    # The same values down to their types (1 against 1.0, say) and key order.
    assert json.dumps(many) == json.dumps(_json.decode_many_plain(texts))


@pytest.mark.parametrize(
    "texts",
    [
        ['{"a":"\\ud800"}', '{"b":1}'],  # a lone surrogate escape (another writer stored it)
        ['{"a":"\\udc00x"}', "{}"],
        ["[" * 300 + "]" * 300, "{}"],  # deeper than pydantic-core parses
    ],
    ids=["lone-high-surrogate", "lone-low-surrogate", "deep"],
)
def test_decode_many_reads_what_json_reads_where_the_fast_parser_refuses(
    texts: list[str],
) -> None:
    """What the fast parser refuses and json reads comes back as json reads it."""
    assert _json.decode_many(texts) == _json.decode_many_plain(texts)


def test_decode_many_refuses_what_json_refuses() -> None:
    """A text json cannot read is refused with json's own error."""
    with pytest.raises(json.JSONDecodeError):
        _json.decode_many(['{"a":1}', "{nope"])


events = st.builds(
    StreamEvent,
    path=st.sampled_from(["/", "/a", "/a/b"]),
    offset=st.integers(min_value=1, max_value=2**63 - 1),
    type=st.text(min_size=1, max_size=10),
    payload=objects,
    metadata=objects,
    source=st.none() | objects,
    idempotency_key=st.none() | st.text(min_size=1, max_size=10),
    created_at=st.text(max_size=30),
    ephemeral=st.booleans(),
    payload_version=st.integers(min_value=1, max_value=32_767),
)


_FIELD_NAMES = [field.name for field in dataclasses.fields(StreamEvent)]


def _fields(event: StreamEvent) -> tuple[Any, ...]:
    """An event's fields in the order the event makers take them."""
    return (
        event.path,
        event.offset,
        event.type,
        event.payload,
        event.metadata,
        event.source,
        event.idempotency_key,
        event.created_at,
        event.ephemeral,
        event.payload_version,
    )


@given(events)
def test_make_event_is_the_dataclass_constructor(event: StreamEvent) -> None:
    """The fast constructor builds the dataclass's event: same type and fields, still frozen."""
    args = _fields(event)
    fast, plain = _event_builders.make_event(*args), _event_builders.make_event_plain(*args)
    assert fast == plain == event
    assert type(fast) is StreamEvent
    assert repr(fast) == repr(plain)
    assert all(getattr(fast, name) is getattr(plain, name) for name in _FIELD_NAMES)
    # Still frozen: the scaffold it was built on lends it nothing but its slots.
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.payload = {}  # type: ignore[misc]
    assert fast.payload is plain.payload


@given(events, objects)
def test_with_payload_is_replace(event: StreamEvent, payload: dict[str, Any]) -> None:
    """A copy with another payload equals dataclasses.replace and leaves the original alone."""
    before = _event_builders.make_event_plain(*_fields(event))
    assert _event_builders.with_payload(event, payload) == _event_builders.with_payload_plain(
        event, payload
    )
    assert event == before


@given(events, st.text(min_size=1, max_size=10), objects, st.integers(1, 32_767))
def test_reshaped_is_replace(
    event: StreamEvent, etype: str, payload: dict[str, Any], version: int
) -> None:
    """A copy under another type, payload and version equals dataclasses.replace."""
    before = _event_builders.make_event_plain(*_fields(event))
    fast = _event_builders.reshaped(event, etype, payload, version)
    assert fast == _event_builders.reshaped_plain(event, etype, payload, version)
    assert (fast.type, fast.payload, fast.payload_version) == (etype, payload, version)
    assert type(fast) is StreamEvent
    assert event == before


class Order(BaseModel):
    order: int
    note: str = ""


@given(st.dictionaries(st.sampled_from(["order", "note", "extra"]), values, max_size=3))
def test_payload_validator_is_model_validate(payload: dict[str, Any]) -> None:
    """The core validator accepts and refuses exactly what model_validate does, with equal models."""
    fast, plain = (
        _event_builders.payload_validator(Order),
        _event_builders.payload_validator_plain(Order),
    )
    assert fast is not plain
    try:
        expected = plain(payload)
    except ValidationError:
        with pytest.raises(ValidationError):
            fast(payload)
        return
    assert fast(payload) == expected


# Types as callers write them, and the ones the fast path must hand on: empty, blank,
# reserved, non-ASCII, a lone surrogate, at and over the length limit, not a string.
event_types = (
    st.text(max_size=12)
    | st.sampled_from(
        ["", " ", "\t", "streamkit.skip", "order.placed", "é", "\ud800", "x" * MAX_TYPE_LENGTH]
    )
    | st.just("y" * (MAX_TYPE_LENGTH + 1))
    | st.integers()
    | st.none()
)
payloads = (
    objects
    | st.none()
    | st.just({"x": math.nan})
    | st.just({"s": "\ud800"})
    | st.just({"big": "z" * MAX_EVENT_BYTES})
    | values
    | st.builds(Order, order=st.integers(), note=st.text(max_size=4))
)
inputs = (
    st.fixed_dictionaries({"type": event_types, "payload": payloads})
    | st.fixed_dictionaries({"type": event_types, "metadata": objects})
    | st.fixed_dictionaries(
        {"type": event_types, "payload": payloads},
        optional={"metadata": objects, "idempotency_key": st.text(max_size=4)},
    )
    # What a processor appends: a key and a source, each also of every wrong kind.
    | st.fixed_dictionaries(
        {"type": event_types, "payload": payloads},
        optional={
            "idempotency_key": st.text(max_size=4)
            | st.sampled_from(["", " ", "é", "\ud800", "k" * 1024, "k" * 1025])
            | st.integers()
            | st.none(),
            "source": objects | st.none() | values | st.just({"s": "\ud800"}),
            "metadata": objects | st.none() | values,
        },
    )
)


def _outcome(prepare: Any, raw: Any, control: bool) -> Any:
    try:
        return prepare(raw, 3, control=control)
    except StreamkitError as exc:
        return type(exc), str(exc), exc.code, exc.details


@given(inputs, st.booleans())
# The refusals a keyed shortcut could miss: a key no reader could decode, a source
# likewise, and a key that takes the event past the size ceiling.
@example({"type": "t", "payload": {}, "idempotency_key": "\ud800"}, False)
@example({"type": "t", "payload": {}, "source": {"s": "\ud800"}}, False)
@example(
    {"type": "t", "payload": {"z": "z" * (MAX_EVENT_BYTES - 20)}, "idempotency_key": "k" * 20},
    False,
)
def test_prepare_event_is_its_plain_twin(raw: dict[str, Any], control: bool) -> None:
    """The common-input shortcut prepares the same event, or refuses with the same error."""
    assert _outcome(prepare_event, raw, control) == _outcome(prepare_event_plain, raw, control)

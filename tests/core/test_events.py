"""The event envelope: validation, serialization, the idempotent body, paths, timestamps."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from streamkit import InvalidEvent, InvalidRequest, open_log
from streamkit._json_size import utf8_json_size
from streamkit._timestamps import now_timestamp
from streamkit.events import (
    MAX_EVENT_BYTES,
    MAX_NESTING,
    EventInput,
    ReadPage,
    ScannedRange,
    StreamEvent,
    format_timestamp,
    prepare_event,
    prepare_events,
    same_body,
    validate_path,
)


class Order(BaseModel):
    order: int
    note: str = ""


def test_a_mapping_and_an_event_input_prepare_alike() -> None:
    """A plain mapping and an EventInput with the same fields prepare to the same thing."""
    fields: dict[str, Any] = {
        "type": "order.placed",
        "payload": {"order": 7},
        "metadata": {"trace": "t"},
        "source": {"processor": {"slug": "intake"}},
        "idempotency_key": "order-7",
        "offset": 3,
    }
    assert prepare_event(fields, 2) == prepare_event(EventInput(**fields), 2)
    prepared = prepare_event(fields, 2)
    assert prepared.index == 2
    assert prepared.payload_json == '{"order":7}'
    assert prepared.source_json == '{"processor":{"slug":"intake"}}'
    assert (prepared.idempotency_key, prepared.offset, prepared.ephemeral) == ("order-7", 3, False)


def test_absent_payload_and_metadata_serialize_as_empty_objects() -> None:
    """Missing payload and metadata are stored as {}; a missing source stays None."""
    prepared = prepare_event({"type": "t"})
    assert (prepared.payload_json, prepared.metadata_json, prepared.source_json) == (
        "{}",
        "{}",
        None,
    )


def test_a_pydantic_payload_is_dumped_in_json_mode() -> None:
    """A BaseModel payload is serialized with model_dump(mode='json')."""
    prepared = prepare_event(EventInput(type="t", payload=Order(order=1, note="n")))
    assert json.loads(prepared.payload_json) == {"order": 1, "note": "n"}


def _nested(depth: int) -> list[Any]:
    """A list nesting ``depth`` levels deep (built without recursion)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


def test_nesting_up_to_the_limit_is_accepted_and_reads_back() -> None:
    """An object nesting exactly MAX_NESTING levels is accepted; one more level is not."""
    prepared = prepare_event({"type": "t", "payload": {"a": _nested(MAX_NESTING - 1)}})
    assert json.loads(prepared.payload_json)["a"] == _nested(MAX_NESTING - 1)
    brackets = {"s": "[{" * 500}  # brackets inside strings are not nesting
    assert json.loads(prepare_event({"type": "t", "payload": brackets}).payload_json) == brackets
    with pytest.raises(InvalidEvent, match=f"nests deeper than {MAX_NESTING} levels"):
        prepare_event({"type": "t", "payload": {"a": _nested(MAX_NESTING)}})


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"type": None}, "type"),
        ({"type": None, "payload": {}}, "type"),
        ({"type": " ", "payload": {"a": 1}}, "type"),
        ({"type": "t", "payload": ["a"]}, "payload"),
        ({"type": "x" * 257}, "type"),
        ({"type": "t", "payload": "text"}, "payload"),
        ({"type": "t", "payload": {1j: 1}}, "payload"),
        ({"type": "t", "metadata": {"x": float("inf")}}, "metadata"),
        ({"type": "t", "source": ["me"]}, "source"),
        ({"type": "t", "idempotency_key": "k" * 1025}, "idempotency_key"),
        ({"type": "t", "offset": 0}, "offset"),
        ({"type": "t", "offset": False}, "offset"),
        ({"type": "t", "ephemeral": 1}, "ephemeral"),
        ({"type": "t", "ephemeral": True, "idempotency_key": "k"}, "idempotency_key"),
        ({"type": "t", "payload": {"a": _nested(MAX_NESTING)}}, "payload"),
        ({"type": "t", "payload": {"a": _nested(100_000)}}, "payload"),
        ({"type": "t", "metadata": _cyclic()}, "metadata"),
        ({"type": "t", "source": {"a": [_nested(MAX_NESTING)]}}, "source"),
    ],
)
def test_bad_fields_are_refused_by_name(raw: dict[str, Any], field: str) -> None:
    """Each bad field is an INVALID_EVENT whose details and message name that field."""
    with pytest.raises(InvalidEvent) as refused:
        prepare_event(raw, 4)
    assert refused.value.details["field"] == field
    assert refused.value.details["index"] == 4
    assert f"event #4: field {field!r}" in str(refused.value)
    assert str(refused.value).endswith("nothing was appended")


def test_unknown_fields_are_refused() -> None:
    """A mapping with keys outside the envelope is refused, listing them."""
    with pytest.raises(InvalidEvent) as refused:
        prepare_event({"type": "t", "colour": "red", "size": 2})
    assert refused.value.details["fields"] == ["colour", "size"]
    with pytest.raises(InvalidEvent) as refused:  # two keys, but not type and payload
        prepare_event({"type": "t", "colour": "red"})
    assert refused.value.details["fields"] == ["colour"]


@pytest.mark.parametrize("payload", [{"order": 7, "lines": [1, 2]}, None, {}])
def test_a_type_and_payload_dict_prepares_like_any_input(payload: dict[str, Any] | None) -> None:
    """The commonest shape, {type, payload}, has a short path with the same outcome."""
    fast = prepare_event({"type": "order.placed", "payload": payload}, 3)
    assert fast == prepare_event(EventInput(type="order.placed", payload=payload), 3)
    assert fast == prepare_event(MappingProxyType({"type": "order.placed", "payload": payload}), 3)
    assert fast.payload_json == json.dumps(payload or {}, separators=(",", ":"))


def test_something_that_is_not_an_event_is_refused() -> None:
    """A value that is neither a mapping nor an EventInput is refused."""
    with pytest.raises(InvalidEvent, match="expected an EventInput or a mapping"):
        prepare_event(["t"])  # type: ignore[arg-type]


def test_the_size_ceiling_counts_every_serialized_part() -> None:
    """An event over 1 MiB serialized is refused; one just under the ceiling is accepted."""
    overhead = len('{"b":""}') + len("t") + len("{}")
    prepare_event({"type": "t", "payload": {"b": "x" * (MAX_EVENT_BYTES - overhead)}})
    with pytest.raises(InvalidEvent) as refused:
        prepare_event({"type": "t", "payload": {"b": "x" * (MAX_EVENT_BYTES - overhead + 1)}})
    assert refused.value.details["limit"] == MAX_EVENT_BYTES
    with pytest.raises(InvalidEvent):
        prepare_event({"type": "t", "metadata": {"b": "x" * MAX_EVENT_BYTES}})


def test_the_size_ceiling_counts_utf8_not_escapes() -> None:
    """200,000 é (400 KB of UTF-8, 1.2 MB escaped) fit; the ceiling falls on the UTF-8 byte."""
    accepted = prepare_event({"type": "t", "payload": {"b": "\u00e9" * 200_000}})
    assert len(accepted.payload_json) > MAX_EVENT_BYTES  # stored escaped, measured as UTF-8
    overhead = len('{"b":""}') + len("t") + len("{}")
    fits = (MAX_EVENT_BYTES - overhead) // 2
    prepare_event({"type": "t", "payload": {"b": "\u00e9" * fits}})
    with pytest.raises(InvalidEvent, match="bytes as UTF-8 JSON") as refused:
        prepare_event({"type": "t", "payload": {"b": "\u00e9" * (fits + 1)}})
    assert refused.value.details["size"] == overhead + 2 * (fits + 1)


@given(
    st.dictionaries(
        st.text(max_size=8), st.text() | st.lists(st.text(max_size=30), max_size=5), max_size=6
    )
)
def test_utf8_json_size_is_the_size_of_the_json_in_utf8(value: dict[str, object]) -> None:
    """Whatever the characters (controls, quotes, backslashes, 2-4 byte ones): exact."""
    escaped = json.dumps(value, separators=(",", ":"))
    utf8 = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert utf8_json_size(escaped) == len(utf8)


def test_prepare_events_refuses_on_the_first_bad_event() -> None:
    """prepare_events numbers events from 0 and refuses the whole call at the first bad one."""
    assert [p.index for p in prepare_events([{"type": "a"}, {"type": "b"}])] == [0, 1]
    with pytest.raises(InvalidEvent) as refused:
        prepare_events([{"type": "a"}, {"type": ""}, {"type": 5}])
    assert refused.value.details["index"] == 1


def test_decoded_equals_what_a_read_would_return() -> None:
    """decoded() builds the committed event from the serialized JSON, not the input objects."""
    prepared = prepare_event({"type": "t", "payload": {"pair": (1, 2)}, "ephemeral": True})
    event = prepared.decoded(path="/p", offset=9, created_at="2026-01-01T00:00:00.000000Z")
    assert event.payload == {"pair": [1, 2]}
    assert (event.path, event.offset, event.ephemeral) == ("/p", 9, True)


def test_same_body_compares_type_payload_and_metadata_as_json() -> None:
    """same_body ignores key order, source and offset, and treats absent parts as {}."""
    committed = StreamEvent(path="/", offset=1, type="t", payload={"a": 1, "b": [1]})
    assert same_body(prepare_event({"type": "t", "payload": {"b": (1,), "a": 1}}), committed)
    assert same_body(
        prepare_event({"type": "t", "payload": {"a": 1, "b": [1]}, "source": {"x": 1}}),
        committed,
    )
    assert not same_body(prepare_event({"type": "u", "payload": {"a": 1, "b": [1]}}), committed)
    assert not same_body(
        prepare_event({"type": "t", "payload": {"a": 1, "b": [1]}, "metadata": {"m": 1}}),
        committed,
    )
    assert same_body(prepare_event({"type": "t"}), StreamEvent(path="/", offset=1, type="t"))


def test_same_body_accepts_a_model_payload_on_the_committed_side() -> None:
    """A committed event whose payload an engine turned into a model still compares as JSON."""
    committed = StreamEvent(path="/", offset=1, type="t", payload=Order(order=3))
    assert same_body(prepare_event({"type": "t", "payload": {"order": 3, "note": ""}}), committed)


def test_to_dict_is_json_ready() -> None:
    """to_dict dumps model payloads and includes source, key and ephemeral only when set."""
    plain = StreamEvent(path="/", offset=1, type="t", created_at="c")
    assert plain.to_dict() == {
        "path": "/",
        "offset": 1,
        "type": "t",
        "payload": {},
        "metadata": {},
        "created_at": "c",
    }
    full = StreamEvent(
        path="/",
        offset=2,
        type="t",
        payload=Order(order=1),
        source={"s": 1},
        idempotency_key="k",
        ephemeral=True,
    )
    data = full.to_dict()
    assert data["payload"] == {"order": 1, "note": ""}
    assert (data["source"], data["idempotency_key"], data["ephemeral"]) == ({"s": 1}, "k", True)
    json.dumps(data)


def test_stream_events_are_immutable() -> None:
    """A committed event cannot be reassigned."""
    event = StreamEvent(path="/", offset=1, type="t")
    with pytest.raises(AttributeError):
        event.offset = 2  # type: ignore[misc]


@pytest.mark.parametrize("path", ["/", "/a", "/a/b-c/d_e.f", "/A1/" + "x" * 100])
def test_valid_paths(path: str) -> None:
    """/ and slash-separated segments of letters, digits, '-', '_', '.' are valid."""
    assert validate_path(path) == path


@pytest.mark.parametrize(
    "path", ["", "a", "/a/", "//", "/a//b", "/./a", "/a/..", "/a b", "/é", "/" + "x" * 600, None]
)
def test_invalid_paths(path: Any) -> None:
    """Anything else is an INVALID_REQUEST that says nothing was read or written."""
    with pytest.raises(InvalidRequest, match="nothing was read or written"):
        validate_path(path)


def test_format_timestamp_is_utc_with_microseconds() -> None:
    """Timestamps are UTC ISO-8601 with six fractional digits and a Z."""
    assert format_timestamp(0) == "1970-01-01T00:00:00.000000Z"
    assert format_timestamp(1_800_000_000.123456) == "2027-01-15T08:00:00.123456Z"


def _datetime_text(epoch: float) -> str:
    return (
        datetime.fromtimestamp(epoch, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    )


@given(st.floats(min_value=-1e10, max_value=2.5e11, allow_nan=False))
def test_format_timestamp_matches_datetime_for_any_epoch(epoch: float) -> None:
    """The per-second cache gives exactly datetime's text, rounding included."""
    assert format_timestamp(epoch) == _datetime_text(epoch)


@pytest.mark.parametrize(
    "epoch", [0.9999995, 0.0000005, 0.0000015, 1_764_435_600.9999996, 1_764_435_601.0]
)
def test_format_timestamp_rounds_half_to_even_across_seconds(epoch: float) -> None:
    """A fraction that rounds up to the next second carries into it, as datetime does."""
    assert format_timestamp(epoch) == _datetime_text(epoch)
    assert format_timestamp(epoch - 1) == _datetime_text(epoch - 1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _exact_text(ns: int) -> str:
    """Nanoseconds rounded half up to the microsecond, in integers only: the oracle."""
    stamp = _EPOCH + timedelta(microseconds=(ns + 500) // 1000)
    return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")


@given(
    st.integers(min_value=0, max_value=253402300799 * 10**9 - 1)
    | st.integers(min_value=1_764_435_600 * 10**9 - 10**6, max_value=1_764_435_601 * 10**9)
)
def test_now_timestamp_formats_the_clock_nanoseconds_exactly(ns: int) -> None:
    """The commit stamp: integer nanoseconds, half up to the microsecond, carries included."""
    with mock.patch.object(time, "time_ns", return_value=ns):
        assert now_timestamp() == _exact_text(ns)


def test_now_timestamp_outside_the_years_it_formats_falls_back() -> None:
    """Before 1970 (a clock set wrong) the float formatter's slow path answers."""
    with mock.patch.object(time, "time_ns", return_value=-1_500_000_000):
        assert now_timestamp() == "1969-12-31T23:59:58.500000Z"


def test_now_timestamp_reads_the_wall_clock() -> None:
    """Without a patched clock it is now, to the microsecond."""
    before = _exact_text(time.time_ns() - 1000)
    stamp = now_timestamp()
    after = _exact_text(time.time_ns() + 1000)
    assert before <= stamp <= after


def test_read_page_and_scanned_range_shapes() -> None:
    """ScannedRange is a (after, through) tuple; ReadPage carries events and the proof."""
    scanned = ScannedRange(3, 7)
    assert tuple(scanned) == (3, 7)
    assert (scanned.after, scanned.through) == (3, 7)
    page = ReadPage([], 7, True)
    assert (list(page.events), page.scanned_through_offset, page.at_head) == ([], 7, True)


LONE = ["\ud800", "\udcff", "a\udbffb"]


@pytest.mark.parametrize("lone", LONE)
@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("type", lambda s: {"type": f"t{s}"}),
        ("idempotency_key", lambda s: {"type": "t", "idempotency_key": f"k{s}"}),
        ("payload", lambda s: {"type": "t", "payload": {"v": s}}),
        ("payload", lambda s: {"type": "t", "payload": {s: 1}}),
        ("payload", lambda s: {"type": "t", "payload": {"deep": [{"x": [s]}]}}),
        ("metadata", lambda s: {"type": "t", "metadata": {"v": s}}),
        ("metadata", lambda s: {"type": "t", "metadata": {s: "v"}}),
        ("source", lambda s: {"type": "t", "source": {"v": s}}),
    ],
)
def test_a_string_that_cannot_be_utf8_is_refused_naming_its_field(
    lone: str, field: str, build: Any
) -> None:
    """A lone surrogate anywhere in an event is INVALID_EVENT naming the field, never encoded."""
    with pytest.raises(InvalidEvent) as caught:
        prepare_event(build(lone))
    assert caught.value.code == "INVALID_EVENT"
    assert f"field {field!r}" in caught.value.message
    assert "cannot be encoded as UTF-8" in caught.value.message
    assert "nothing was appended" in caught.value.message


def test_emoji_and_escaped_backslashes_are_not_mistaken_for_lone_surrogates() -> None:
    """A real astral character (a surrogate pair once escaped) and a literal "\\ud800" pass."""
    prepared = prepare_event({"type": "t😀", "payload": {"e": "😀", "text": "\\ud800"}})
    assert json.loads(prepared.payload_json) == {"e": "😀", "text": "\\ud800"}


async def test_a_lone_surrogate_is_refused_by_append_and_nothing_is_written() -> None:
    """Through the log's append: refused, and the log stays readable and empty."""
    async with open_log(":memory:") as log:
        with pytest.raises(InvalidEvent, match="cannot be encoded as UTF-8"):
            await log.stream("/").append({"type": "t", "payload": {"half": "\ud83d"}})
        page = await log.stream("/").read()
        assert page.events == []

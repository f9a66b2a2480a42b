"""The log contract: what every backend's log keeps (SPEC section 2), one suite for all.

The ``log`` fixture of ``tests/contract/conftest.py`` opens a fresh log of each
backend in turn; nothing here reaches past the public Log and Stream API.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel
from support.log import offsets, order

from streamkit import (
    IdempotencyConflict,
    InvalidEvent,
    InvalidRequest,
    OffsetConflict,
    ProcessorStream,
)
from streamkit.backends import host_store
from streamkit.events import (
    Appended,
    EventInput,
    appended_to_dicts,
    format_timestamp,
    replayed_offsets,
)
from streamkit.log import Log

BAD_EVENTS: list[tuple[Any, str]] = [
    ({"payload": {}}, "type"),
    ({"type": ""}, "type"),
    ({"type": "   "}, "type"),
    ({"type": 5}, "type"),
    ({"type": "x" * 257}, "type"),
    ({"type": "t", "payload": [1, 2]}, "payload"),
    ({"type": "t", "payload": {"when": object()}}, "payload"),
    ({"type": "t", "payload": {"x": float("nan")}}, "payload"),
    ({"type": "t", "metadata": ["m"]}, "metadata"),
    ({"type": "t", "source": "me"}, "source"),
    ({"type": "t", "payload": {"blob": "x" * (1024 * 1024)}}, "payload"),
    ({"type": "t", "colour": "red"}, "fields"),
    ({"type": "t", "ephemeral": True, "idempotency_key": "k"}, "idempotency_key"),
    ({"type": "t", "ephemeral": "yes"}, "ephemeral"),
    ({"type": "t", "idempotency_key": ""}, "idempotency_key"),
    ({"type": "t", "idempotency_key": 5}, "idempotency_key"),
    ({"type": "t", "offset": 0}, "offset"),
    ({"type": "t", "offset": -1}, "offset"),
    ({"type": "t", "offset": True}, "offset"),
    ({"type": "t", "offset": "3"}, "offset"),
    ({"type": "t", "offset": 1.0}, "offset"),
    ({"type": "t", "payload_version": 0}, "payload_version"),
    ({"type": "t", "payload_version": True}, "payload_version"),
    ({"type": "t", "payload_version": "2"}, "payload_version"),
    ({"type": "t", "payload_version": 32_768}, "payload_version"),
    (["type", "t"], "index"),
]


async def test_offsets_start_at_1_and_are_per_path(log: Log) -> None:
    """Each stream path numbers its events from 1, independently of other paths."""
    a = await log.stream("/a").append(order(1), order(2))
    b = await log.stream("/b").append(order(3))
    c = await log.stream("/a").append(order(4))
    assert [e.offset for e in a + c] == [1, 2, 3]
    assert [e.offset for e in b] == [1]
    assert all(e.path == "/a" for e in a + c)


async def test_append_returns_what_a_read_returns(log: Log) -> None:
    """The committed events an append returns equal the events a later read returns."""

    class Placed(BaseModel):
        order: int
        note: str

    stream = log.stream("/orders")
    appended = await stream.append(
        EventInput(
            type="order.placed",
            payload=Placed(order=7, note="rush"),
            metadata={"trace": "t-1"},
            source={"processor": {"slug": "intake"}},
            idempotency_key="order-7",
        ),
        {"type": "order.noted", "payload": {"tuple": (1, 2), "nested": {"x": [None]}}},
    )
    page = await stream.read()
    assert list(page.events) == appended
    assert appended[0].payload == {"order": 7, "note": "rush"}
    assert appended[1].payload == {"tuple": [1, 2], "nested": {"x": [None]}}
    assert appended[0].source == {"processor": {"slug": "intake"}}
    assert appended[0].metadata == {"trace": "t-1"}


async def test_every_event_keeps_the_version_of_its_payload(log: Log) -> None:
    """A payload's version is stored with it and read back; none given is version 1.

    Lone calls, one call of several events and concurrent calls (grouped
    into one commit) all keep each event's own version.
    """
    stream = log.stream("/versions")
    lone = await stream.append({"type": "t", "payload_version": 3})
    several = await stream.append(
        EventInput(type="t", payload_version=2), {"type": "t"}, {"type": "u", "payload_version": 7}
    )
    grouped = await asyncio.gather(
        *(
            stream.append({"type": "t", "payload": {"i": i}, "payload_version": i})
            for i in (1, 5, 9)
        )
    )
    appended = lone + several + [event for call in grouped for event in call]
    assert [e.payload_version for e in appended] == [3, 2, 1, 7, 1, 5, 9]
    assert list((await stream.read()).events) == appended
    assert "payload_version" not in appended[2].to_dict()
    assert appended[0].to_dict()["payload_version"] == 3


async def test_created_at_with_the_default_clock_is_the_commit_time(log: Log) -> None:
    """With the default clock every path stamps the wall time of the commit, in order."""
    stream = log.stream()
    before = format_timestamp(time.time() - 0.001)
    (lone,) = await stream.append(order(1))
    several = await stream.append(order(2), order(3))
    grouped = await asyncio.gather(stream.append(order(4)), stream.append(order(5)))
    (keyed,) = await stream.append(order(6, idempotency_key="k"))
    after = format_timestamp(time.time() + 0.001)
    stamps = [e.created_at for e in [lone, *several, *(g[0] for g in grouped), keyed]]
    assert stamps == sorted(stamps)
    assert before <= stamps[0]
    assert stamps[-1] <= after
    assert stamps == [e.created_at for e in (await stream.read()).events]


async def test_an_empty_append_writes_nothing(log: Log) -> None:
    """append() with no events returns [] and touches nothing."""
    assert await log.stream().append() == []
    assert await log.stream().head() == 0


async def test_an_append_is_atomic(log: Log) -> None:
    """A call whose last event is bad writes none of its events."""
    stream = log.stream()
    with pytest.raises(InvalidEvent):
        await stream.append(order(1), order(2), {"type": ""})
    assert await stream.head() == 0
    assert (await stream.append(order(3)))[0].offset == 1


async def test_an_offset_precondition_mismatch_refuses_the_whole_call(log: Log) -> None:
    """One wrong offset precondition refuses every event of the call with OFFSET_CONFLICT."""
    stream = log.stream()
    await stream.append(order(1))
    with pytest.raises(OffsetConflict) as refused:
        await stream.append(order(2, offset=2), order(3, offset=4))
    assert refused.value.details["expected"] == 4
    assert refused.value.details["actual"] == 3
    assert "nothing was appended" in str(refused.value)
    assert await offsets(log) == [1]
    # The refusal left no hole, and a right precondition holds.
    assert [e.offset for e in await stream.append(order(2, offset=2), order(3, offset=3))] == [
        2,
        3,
    ]


async def test_an_idempotent_retry_returns_the_committed_event(log: Log) -> None:
    """The same key and body again returns the committed event and appends nothing."""
    stream = log.stream()
    (first,) = await stream.append(order(7, idempotency_key="order-7"))
    await stream.append(order(8))
    appended_before = log.stats.appended
    (again,) = await stream.append(order(7, idempotency_key="order-7"))
    assert again == first
    assert log.stats.appended == appended_before
    assert await offsets(log) == [1, 2]


async def test_an_append_says_which_of_its_events_an_earlier_call_committed(log: Log) -> None:
    """replayed_offsets names the idempotent hits of a result; new events and plain calls: none."""
    stream = log.stream()
    plain = await stream.append(order(1))
    assert replayed_offsets(plain) == frozenset()
    first = await stream.append(order(7, idempotency_key="order-7"))
    assert replayed_offsets(first) == frozenset()
    again = await stream.append(order(7, idempotency_key="order-7"))
    assert isinstance(again, Appended)
    assert replayed_offsets(again) == {first[0].offset}
    mixed = await stream.append(
        order(7, idempotency_key="order-7"), order(9, idempotency_key="order-9")
    )
    assert [e.offset for e in mixed] == [first[0].offset, 3]
    assert replayed_offsets(mixed) == {first[0].offset}
    # Twice in one call, new: the second names the first, committed by this very call.
    twice = await stream.append(
        order(10, idempotency_key="order-10"), order(10, idempotency_key="order-10")
    )
    assert replayed_offsets(twice) == frozenset()
    assert appended_to_dicts(again)[0]["replayed"] is True
    assert "replayed" not in appended_to_dicts(twice)[0]


async def test_a_different_body_under_a_used_key_is_refused(log: Log) -> None:
    """A key that names an event with another body is an IDEMPOTENCY_CONFLICT; nothing lands."""
    stream = log.stream()
    for n in range(40):
        await stream.append(order(n)) if n != 40 else None
    await stream.append(order(7, idempotency_key="order-7"))
    with pytest.raises(IdempotencyConflict) as refused:
        await stream.append(order(9), order(8, idempotency_key="order-7"))
    assert str(refused.value).startswith(
        'idempotency key "order-7" already names a different event at offset 41; '
        "nothing was appended"
    )
    assert refused.value.details == {"key": "order-7", "offset": 41, "path": "/"}
    assert await stream.head() == 41


async def test_metadata_is_part_of_the_idempotent_body(log: Log) -> None:
    """A retry with the same payload but other metadata is a conflict; absent equals {}."""
    stream = log.stream()
    await stream.append({"type": "t", "idempotency_key": "k"})
    (same,) = await stream.append(
        {"type": "t", "payload": {}, "metadata": {}, "idempotency_key": "k"}
    )
    assert same.offset == 1
    with pytest.raises(IdempotencyConflict):
        await stream.append({"type": "t", "metadata": {"m": 1}, "idempotency_key": "k"})


async def test_a_key_twice_in_one_call_lands_once(log: Log) -> None:
    """The same key and body twice in one call appends once; both results are that event."""
    stream = log.stream()
    a, b, c = await stream.append(
        order(1, idempotency_key="k"), order(2), order(1, idempotency_key="k")
    )
    assert a == c
    assert (a.offset, b.offset) == (1, 2)
    assert await offsets(log) == [1, 2]
    with pytest.raises(IdempotencyConflict):
        await stream.append(order(5, idempotency_key="j"), order(6, idempotency_key="j"))
    assert await offsets(log) == [1, 2]


async def test_an_idempotent_match_must_meet_its_offset_precondition(log: Log) -> None:
    """A retry whose offset precondition disagrees with the existing event's offset is refused."""
    stream = log.stream()
    await stream.append(order(0), order(1, idempotency_key="k"))
    (same,) = await stream.append(order(1, idempotency_key="k", offset=2))
    assert same.offset == 2
    with pytest.raises(OffsetConflict) as refused:
        await stream.append(order(1, idempotency_key="k", offset=3))
    assert refused.value.details["actual"] == 2


async def test_keys_are_scoped_to_their_path(log: Log) -> None:
    """The same idempotency key on two paths names two events."""
    (a,) = await log.stream("/a").append(order(1, idempotency_key="k"))
    (b,) = await log.stream("/b").append(order(2, idempotency_key="k"))
    assert (a.path, b.path, a.offset, b.offset) == ("/a", "/b", 1, 1)


@pytest.mark.parametrize(("bad", "field"), BAD_EVENTS)
async def test_bad_input_is_refused_naming_the_field(log: Log, bad: Any, field: str) -> None:
    """Each kind of bad event is an INVALID_EVENT naming the field; nothing is written; the log serves on."""
    stream = log.stream()
    await stream.append(order(1))
    with pytest.raises(InvalidEvent) as refused:
        await stream.append(order(2), bad)
    error = refused.value
    assert error.code == "INVALID_EVENT"
    assert "nothing was appended" in str(error)
    assert error.details["index"] == 1
    if field not in ("fields", "index"):
        assert error.details["field"] == field
    elif field == "fields":
        assert error.details["fields"] == ["colour"]
    assert await offsets(log) == [1]
    assert (await stream.append(order(3)))[0].offset == 2


@pytest.mark.parametrize("path", ["orders", "/a//b", "/a/../b", "/a b", "/a/", "", 5])
async def test_a_bad_stream_path_is_refused(log: Log, path: Any) -> None:
    """Paths other than / or /a/b are refused with INVALID_REQUEST before anything is written."""
    with pytest.raises(InvalidRequest):
        log.stream(path)
    assert await log.paths() == []


async def test_stream_objects_are_cached_per_path(log: Log) -> None:
    """log.stream(path) returns the same object for the same path."""
    assert log.stream("/a") is log.stream("/a")
    assert log.stream() is log.stream("/")


async def test_a_short_page_proves_through_the_head(log: Log) -> None:
    """A short page proves through max(after_offset, durable head) and is at the head."""
    stream = log.stream()
    empty = await stream.read()
    assert (list(empty.events), empty.scanned_through_offset, empty.at_head) == ([], 0, True)
    await stream.append(order(1), order(2), order(3))
    page = await stream.read(1, 10)
    assert ([e.offset for e in page.events], page.scanned_through_offset, page.at_head) == (
        [2, 3],
        3,
        True,
    )
    beyond = await stream.read(9, 10)
    assert (list(beyond.events), beyond.scanned_through_offset, beyond.at_head) == ([], 9, True)


async def test_a_read_never_proves_past_the_durable_head(log: Log) -> None:
    """Offsets handed to ephemerals above the durable head are never covered by a read."""
    stream = log.stream()
    await stream.append(order(1), {"type": "tick", "ephemeral": True})
    page = await stream.read()
    assert ([e.offset for e in page.events], page.scanned_through_offset) == ([1], 1)
    assert await stream.head() == 1


@pytest.mark.parametrize(
    ("after", "limit"),
    [(-1, 10), (True, 10), ("1", 10), (0, 0), (0, 10_001), (0, True), (0, 2.5)],
)
async def test_read_arguments_out_of_range_are_refused(log: Log, after: Any, limit: Any) -> None:
    """after_offset below 0, limit outside 1..10000, bools and non-integers are INVALID_REQUEST."""
    with pytest.raises(InvalidRequest):
        await log.stream().read(after, limit)


async def test_head_and_paths(log: Log) -> None:
    """head() is the highest durable offset; paths() lists paths holding durable events, sorted."""
    await log.stream("/b").append(order(1), order(2))
    await log.stream("/a/x").append(order(1))
    await log.stream("/c").append({"type": "tick", "ephemeral": True})
    assert await log.stream("/b").head() == 2
    assert await log.stream("/c").head() == 0
    assert await log.paths() == ["/a/x", "/b"]


async def test_claims_upsert_release_and_stay_out_of_the_log(log: Log) -> None:
    """claim(at) sets or moves a claimant's claim, claim(None) releases it, no event is written."""
    stream = log.stream("/jobs")
    await stream.claim(100.0, claimant="mailer")
    await stream.claim(50, claimant="billing")
    await stream.claim(75.5, claimant="mailer")
    await log.stream("/other").claim(1.0, claimant="mailer")
    assert await stream.claims() == {"billing": 50.0, "mailer": 75.5}
    await stream.claim(None, claimant="mailer")
    await stream.claim(None, claimant="nobody")
    assert await stream.claims() == {"billing": 50.0}
    assert await log.stream("/other").claims() == {"mailer": 1.0}
    assert await log.paths() == []


async def test_a_processor_view_claims_under_its_slug(log: Log) -> None:
    """for_processor(slug) satisfies ProcessorStream; its claim(at) is the slug's claim."""
    view = log.stream("/jobs").for_processor("mailer")
    assert isinstance(view, ProcessorStream)
    assert view.path == "/jobs"
    (event,) = await view.append(order(1))
    assert (await view.read()).events == [event]
    await view.claim(42.0)
    assert await log.stream("/jobs").claims() == {"mailer": 42.0}
    await view.claim(None)
    assert await log.stream("/jobs").claims() == {}


@pytest.mark.parametrize("at", [True, float("nan"), float("inf"), "soon"])
async def test_a_bad_claim_time_is_refused(log: Log, at: Any) -> None:
    """A claim time that is not a finite number (or None) is INVALID_REQUEST."""
    with pytest.raises(InvalidRequest):
        await log.stream().claim(at, claimant="p")
    with pytest.raises(InvalidRequest):
        log.stream().for_processor("")


async def test_stats_count_appends_and_reservations(log: Log) -> None:
    """stats counts committed durable events, ephemerals and ephemeral block reservations."""
    stream = log.stream()
    await stream.append(order(1), {"type": "tick", "ephemeral": True}, order(2))
    stats = log.stats
    assert (stats.appended, stats.ephemeral, stats.ephemeral_reservations) == (2, 1, 1)


async def test_memory_stream_honours_expect_head_like_the_log() -> None:
    """streamkit.testing's memory stream refuses a stale expect_head with the same error."""
    from streamkit.testing import memory_stream

    memory = memory_stream()
    (first,) = await memory.stream.append(order(1))
    await memory.stream.append({"type": "tick", "ephemeral": True})
    await memory.stream.append(order(2), expect_head=first.offset)
    with pytest.raises(OffsetConflict, match="expected the durable head"):
        await memory.stream.append(order(3), expect_head=first.offset)


async def test_the_host_store_lists_every_path_with_its_durable_head(log: Log) -> None:
    """stream_heads: each path holding a durable event, sorted by path, with its head."""
    store = host_store(log)
    await store.prepare()
    assert await store.stream_heads() == []
    await log.stream("/b").append(order(1), order(2))
    await log.stream("/").append(order(3))
    await log.stream("/a/x").append(order(4))
    assert await store.stream_heads() == [("/", 1), ("/a/x", 1), ("/b", 2)]


async def test_an_event_is_measured_as_utf8_and_reads_back_whole(log: Log) -> None:
    """200,000 é (400 KB as UTF-8, 1.2 MB escaped) are appended, read back equal, retried once."""
    wide = {"type": "wide", "payload": {"text": "\u00e9" * 200_000}, "idempotency_key": "w"}
    (committed,) = await log.stream("/").append(wide)
    page = await log.stream("/").read(0, 10)
    assert [e.payload for e in page.events] == [{"text": "\u00e9" * 200_000}]
    (again,) = await log.stream("/").append(wide)
    assert again.offset == committed.offset
    assert replayed_offsets(await log.stream("/").append(wide)) == {committed.offset}

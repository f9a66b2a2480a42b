"""The stream contract every ProcessorStream must keep, over the memory stream and every backend.

One suite, parametrized over ``streamkit.testing.memory_stream`` and the real
log's processor view (``log.stream(path).for_processor(slug)``), so the test
double cannot drift from the log it stands in for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel
from streamkit.testing import memory_storage, memory_stream
from support.backends import BACKENDS

from streamkit import (
    IdempotencyConflict,
    InvalidEvent,
    InvalidRequest,
    OffsetConflict,
    ProcessorEngine,
    ProcessorStream,
    StreamProcessor,
)
from streamkit.contract import ProcessorContract
from streamkit.events import StreamEvent

PATH = "/orders"


@pytest.fixture(params=["memory", *sorted(BACKENDS)])
async def stream(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """The memory stream, then a processor's view of a log of each backend."""
    if request.param == "memory":
        yield memory_stream(PATH)
        return
    target = BACKENDS[request.param].fresh()
    log = target.open()
    try:
        yield log.stream(PATH).for_processor("contract-suite")
    finally:
        await log.aclose()
        target.remove()


def order(n: int, **extra: Any) -> dict[str, Any]:
    return {"type": "order.placed", "payload": {"n": n}, **extra}


async def read_all(stream: Any) -> list[StreamEvent]:
    return list((await stream.read(0, 10_000)).events)


async def test_it_is_a_processor_stream(stream: Any) -> None:
    """The stream satisfies the ProcessorStream protocol and names its path."""
    assert isinstance(stream, ProcessorStream)
    assert stream.path == PATH


async def test_offsets_start_at_one_and_increase_in_commit_order(stream: Any) -> None:
    """Durable appends get 1, 2, 3... and come back as committed events."""
    first = await stream.append(order(1), order(2))
    second = await stream.append(order(3))
    assert [e.offset for e in [*first, *second]] == [1, 2, 3]
    assert all(e.path == PATH and e.created_at.endswith("Z") for e in first)
    assert [e.payload for e in await read_all(stream)] == [{"n": 1}, {"n": 2}, {"n": 3}]


async def test_an_empty_append_appends_nothing(stream: Any) -> None:
    """append() with no events returns an empty list and takes no offset."""
    assert await stream.append() == []
    assert [e.offset for e in await stream.append(order(1))] == [1]


async def test_an_append_is_all_or_nothing(stream: Any) -> None:
    """One bad event refuses the whole call; nothing lands and no offset is lost."""
    await stream.append(order(1))
    with pytest.raises(InvalidEvent, match="nothing was appended"):
        await stream.append(order(2), {"type": "order.placed", "colour": "red"})
    with pytest.raises(InvalidEvent):
        await stream.append(order(2), {"type": ""})
    assert [e.offset for e in await read_all(stream)] == [1]
    assert [e.offset for e in await stream.append(order(2))] == [2]


async def test_an_offset_precondition_refuses_the_whole_batch(stream: Any) -> None:
    """A wrong expected offset refuses every event of the call; a right one lands."""
    await stream.append(order(1))
    with pytest.raises(OffsetConflict) as caught:
        await stream.append(order(2), order(3, offset=9))
    assert caught.value.code == "OFFSET_CONFLICT"
    assert [e.offset for e in await read_all(stream)] == [1]
    landed = await stream.append(order(2, offset=2), order(3, offset=3))
    assert [e.offset for e in landed] == [2, 3]


async def test_an_idempotent_retry_returns_the_existing_event(stream: Any) -> None:
    """Same key and body returns the committed event and appends nothing."""
    (first,) = await stream.append(order(1, idempotency_key="k1"))
    (again,) = await stream.append(order(1, idempotency_key="k1"))
    assert again.offset == first.offset == 1
    assert again.payload == first.payload
    both = await stream.append(order(2, idempotency_key="k2"), order(2, idempotency_key="k2"))
    assert [e.offset for e in both] == [2, 2]
    assert [e.offset for e in await read_all(stream)] == [1, 2]


async def test_a_reused_key_with_another_body_is_a_conflict(stream: Any) -> None:
    """A different body under a used key is refused and nothing is appended."""
    await stream.append(order(1, idempotency_key="k"))
    with pytest.raises(IdempotencyConflict, match="already names a different event at offset 1"):
        await stream.append(order(5), order(2, idempotency_key="k"))
    assert [e.offset for e in await read_all(stream)] == [1]


async def test_ephemerals_take_an_offset_and_are_never_read(stream: Any) -> None:
    """An ephemeral gets an offset; reads never return it; later durables land above it."""
    (durable,) = await stream.append(order(1))
    (flash,) = await stream.append({"type": "order.viewed", "ephemeral": True})
    (later,) = await stream.append(order(2))
    assert flash.ephemeral
    assert durable.offset < flash.offset < later.offset
    assert [e.offset for e in await read_all(stream)] == [durable.offset, later.offset]


async def test_the_read_proof_never_passes_the_durable_head(stream: Any) -> None:
    """A short page proves through max(after, durable head), even past a trailing ephemeral."""
    await stream.append(order(1), order(2))
    await stream.append({"type": "order.viewed", "ephemeral": True})
    page = await stream.read(0)
    assert (page.scanned_through_offset, page.at_head) == (2, True)
    page = await stream.read(2)
    assert (list(page.events), page.scanned_through_offset, page.at_head) == ([], 2, True)
    page = await stream.read(7)
    assert (page.scanned_through_offset, page.at_head) == (7, True)


async def test_full_pages_prove_through_their_last_event(stream: Any) -> None:
    """A full page proves through its last event; at_head says whether that is the head."""
    await stream.append(*(order(n) for n in range(5)))
    page = await stream.read(0, 2)
    assert ([e.offset for e in page.events], page.scanned_through_offset, page.at_head) == (
        [1, 2],
        2,
        False,
    )
    page = await stream.read(3, 2)
    assert ([e.offset for e in page.events], page.scanned_through_offset, page.at_head) == (
        [4, 5],
        5,
        True,
    )


@pytest.mark.parametrize(("after", "limit"), [(-1, 10), (0, 0), (0, 10_001), ("0", 5)])
async def test_bad_read_arguments_are_refused(stream: Any, after: Any, limit: Any) -> None:
    """A negative after, a limit outside 1..10000, or a non-integer is refused."""
    with pytest.raises(InvalidRequest, match="nothing was read"):
        await stream.read(after, limit)


class Order(BaseModel):
    n: int


async def test_a_typed_read_gives_the_named_types_models_and_the_rest_as_read(
    stream: Any,
) -> None:
    """read(types=) types the payloads of the named types; others, and refused ones, stay decoded."""
    await stream.append(
        order(1),
        {"type": "order.noted", "payload": {"text": "hi"}},
        {"type": "order.placed", "payload": {"n": "not a number"}},
        order(4, metadata={"via": "api"}),
    )
    plain = await stream.read(0, 10)
    typed = await stream.read(0, 10, types={"order.placed": Order})
    assert [e.payload for e in typed.events] == [
        Order(n=1),
        {"text": "hi"},
        {"n": "not a number"},
        Order(n=4),
    ]
    # Everything but the typed payloads is what a plain read gives.
    untyped = [
        dataclasses.replace(
            e, payload=e.payload.model_dump() if isinstance(e.payload, Order) else e.payload
        )
        for e in typed.events
    ]
    assert untyped == list(plain.events)
    assert (typed.scanned_through_offset, typed.at_head) == (plain.scanned_through_offset, True)
    # Whatever sequence holds them, it answers like the list of its events.
    events = list(typed.events)
    assert len(typed.events) == 4
    assert [typed.events[i] for i in range(-4, 0)] == events
    assert typed.events[1:3] == events[1:3]
    assert typed.events == events


@pytest.mark.parametrize("types", [{"order.placed": dict}, {1: Order}, [("order.placed", Order)]])
async def test_a_typed_read_refuses_types_that_are_not_models(stream: Any, types: Any) -> None:
    """Types must map type strings to pydantic models; anything else is refused before reading."""
    await stream.append(order(1))
    with pytest.raises(InvalidRequest, match="nothing was read"):
        await stream.read(0, 10, types=types)


async def test_claims_are_accepted_and_released(stream: Any) -> None:
    """claim(at) and claim(None) are accepted."""
    await stream.claim(1_700_000_000.0)
    await stream.claim(None)


class _Counter(StreamProcessor[dict[str, int]]):
    contract = ProcessorContract(
        slug="counter", version="1", initial=lambda: {"n": 0}, consumes=("order.placed",)
    )

    def reduce(self, event: StreamEvent, state: dict[str, int]) -> dict[str, int]:
        return {"n": state["n"] + event.payload["n"]}


async def test_an_engine_catches_up_over_the_stream(stream: Any) -> None:
    """An engine over the stream reduces every durable event and checkpoints the head."""
    await stream.append(*(order(n) for n in range(1, 11)))
    await stream.append({"type": "order.viewed", "ephemeral": True})
    with memory_storage() as storage:
        engine = ProcessorEngine(_Counter(), stream=stream, storage=storage)
        snapshot = await engine.snapshot()
        assert snapshot == (10, {"n": 55})
        await engine.aclose()
        checkpoint = storage.read("counter")
        assert checkpoint is not None
        assert checkpoint.reduced_through_offset == 10

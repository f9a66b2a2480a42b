"""A typed page builds each event as it is taken and keeps none (backends/_stored.py).

A catch-up folds each event of a typed page once and drops it. Held as a
list, the events of a page outlived the garbage collector's young
generations and were promoted and scanned again; a typed page therefore
holds only its rows and their decoded JSON, and is otherwise an ordinary
read-only sequence.
"""

from __future__ import annotations

import gc

import pytest
from pydantic import BaseModel

from streamkit import ReadPage, StreamEvent
from streamkit.log._log import Log


class Tick(BaseModel):
    n: int


async def typed_page(log: Log, *values: object) -> tuple[ReadPage, ReadPage]:
    """The typed and the plain page of ``values`` appended as ticks."""
    stream = log.stream("/")
    await stream.append(*({"type": "tick", "payload": {"n": n}} for n in values))
    await stream.append({"type": "note", "payload": {"text": "untyped"}})
    return await stream.read(0, 100, types={"tick": Tick}), await stream.read(0, 100)


async def test_a_typed_page_is_a_sequence_like_its_list(log: Log) -> None:
    """Length, indexes (negative too), slices and iteration agree with the list of its events."""
    page, plain = await typed_page(log, 1, 2, 3, 4)
    events = list(page.events)
    assert len(page.events) == len(events) == 5
    assert [page.events[i] for i in range(5)] == events
    assert page.events[-1] == events[-1] == plain.events[-1]
    assert page.events[1:3] == events[1:3]
    assert page.events[::-2] == events[::-2]
    assert page.events == events
    assert page.events != events[:-1]
    assert [e.offset for e in reversed(page.events)] == [5, 4, 3, 2, 1]
    with pytest.raises(IndexError):
        page.events[5]
    with pytest.raises(IndexError):
        page.events[-6]
    ticks: list[object] = [Tick(n=n) for n in (1, 2, 3, 4)]
    assert [e.payload for e in events] == [*ticks, {"text": "untyped"}]


async def test_each_take_builds_the_event_afresh(log: Log) -> None:
    """Two takes of one index are equal events, not one kept event."""
    page, _ = await typed_page(log, 1, 2)
    first, again = page.events[0], page.events[0]
    assert first == again
    assert first is not again
    assert first.payload is not again.payload
    assert [a is b for a, b in zip(page.events, page.events, strict=True)] == [False] * 3


async def test_a_folded_page_holds_no_event(log: Log) -> None:
    """After a pass over it, nothing reachable from the page is an event or a model."""
    page, _ = await typed_page(log, *range(50))
    total = sum(event.payload.n for event in page.events if event.type == "tick")
    assert total == sum(range(50))
    held = gc.get_referents(page.events)
    reachable = held + [item for part in held for item in gc.get_referents(part)]
    assert reachable, "the page holds its rows and decoded JSON"
    assert not any(isinstance(item, StreamEvent | Tick) for item in reachable)


async def test_a_payload_the_model_refuses_stays_decoded_on_every_take(log: Log) -> None:
    """A refused payload is the decoded JSON each time, never half-typed."""
    page, plain = await typed_page(log, 1, "one")
    assert page.events[1].payload == {"n": "one"}
    assert page.events[1] == plain.events[1]
    assert list(page.events)[1] == plain.events[1]

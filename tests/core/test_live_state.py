"""Tests for streamkit.live_state: revision chains, JSON-patch deltas, ordered lossy delivery."""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import json
import math
import random
from collections.abc import Mapping
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from streamkit import LIVE_STATE_CHANGED, InvalidRequest, LiveSnapshot, LiveState, apply_delta
from streamkit.live_state import MAX_PATCH_BYTES


class ListSink:
    """A synchronous sink: append returns a plain value."""

    def __init__(self) -> None:
        self.events: list[Mapping[str, Any]] = []

    def append(self, *events: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        self.events.extend(events)
        return list(events)

    @property
    def payloads(self) -> list[dict[str, Any]]:
        return [dict(event["payload"]) for event in self.events]


class SlowSink:
    """An async sink whose appends take a random number of loop turns and short sleeps."""

    def __init__(self, seed: int) -> None:
        self.events: list[Mapping[str, Any]] = []
        self.active = 0
        self.most_active = 0
        self._random = random.Random(seed)

    async def append(self, *events: Mapping[str, Any]) -> None:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            for _ in range(self._random.randrange(4)):
                await asyncio.sleep(self._random.choice([0, 0, 0.0005]))
            self.events.extend(events)
        finally:
            self.active -= 1


class GatedSink:
    """An async sink that holds every append until the gate opens."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = 0
        self.events: list[Mapping[str, Any]] = []

    async def append(self, *events: Mapping[str, Any]) -> None:
        self.started += 1
        await self.gate.wait()
        self.events.extend(events)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=False)


def follow(seed: Any, payloads: list[dict[str, Any]], seed_rev: int) -> tuple[int, Any]:
    """What a client does: apply each delta whose ``from`` matches; stop at a gap."""
    rev, state = seed_rev, seed
    for payload in payloads:
        assert payload["from"] == rev, "a gap where the test expected a contiguous chain"
        state = apply_delta(state, payload["patch"])
        rev = payload["to"]
    return rev, state


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(initial=json_values, values=st.lists(json_values, max_size=12))
def test_patches_replayed_on_the_seed_reproduce_every_value(
    initial: Any, values: list[Any]
) -> None:
    """Applying every emitted patch in order to the seed reproduces each value set, exactly as JSON."""
    sink = ListSink()
    live = LiveState(sink, "k", initial, epoch=1000)
    seed = json.loads(json.dumps(initial))
    rev, client, seen = 1000, seed, 0
    for value in values:
        live.set(value)
        fresh, seen = sink.payloads[seen:], len(sink.events)
        assert len(fresh) <= 1
        for payload in fresh:
            assert payload["from"] == rev
            assert payload["to"] == rev + 1
            client = apply_delta(client, payload["patch"])
            rev = payload["to"]
        assert canonical(client) == canonical(value)
        assert live.snapshot() == LiveSnapshot(rev, value)
    assert follow(seed, sink.payloads, 1000) == (rev, client)
    assert live.snapshot().rev == 1000 + len(sink.events)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(json_values, max_size=10))
def test_rev_is_contiguous_from_the_epoch(values: list[Any]) -> None:
    """Deltas go epoch -> epoch+1 -> ...; each rev is minted once and never skipped."""
    sink = ListSink()
    live = LiveState(sink, "k", None, epoch=77)
    for value in values:
        live.set(value)
    chain = [(p["from"], p["to"]) for p in sink.payloads]
    assert chain == [(77 + i, 78 + i) for i in range(len(chain))]
    assert live.snapshot().rev == 77 + len(chain)


def test_default_epoch_is_large_positive_and_not_zero() -> None:
    """The default epoch is derived from the clock: far from 0, so no fresh client matches it."""
    live = LiveState(ListSink(), "k", {})
    assert live.snapshot().rev > 4096 * 1_600_000_000_000


def test_new_incarnation_never_reuses_an_old_rev() -> None:
    """A new LiveState's rev is above every rev an earlier one minted, so a stale ``from`` never matches."""
    minted: set[int] = set()
    for generation in range(50):
        live = LiveState(ListSink(), "same-key", {"g": generation})
        start = live.snapshot().rev
        assert all(start > rev for rev in minted)
        for step in range(generation % 7):
            live.set({"g": generation, "step": step})
        minted.update(range(start, live.snapshot().rev + 1))


@pytest.mark.parametrize("epoch", [0, -5, True, 1.5, "9"])
def test_epoch_must_be_a_positive_integer(epoch: object) -> None:
    """An epoch that a fresh client could hold (0) or that is not an int is refused."""
    with pytest.raises(InvalidRequest, match="epoch"):
        LiveState(ListSink(), "k", {}, epoch=epoch)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["", None, 3])
def test_key_must_be_a_non_empty_string(key: object) -> None:
    """A delta must name its value, so an empty or non-string key is refused."""
    with pytest.raises(InvalidRequest, match="key"):
        LiveState(ListSink(), key, {})  # type: ignore[arg-type]


def test_delta_event_shape() -> None:
    """A change appends one ephemeral live-state-changed event with key, from, to and patch."""
    sink = ListSink()
    live = LiveState(sink, "task-board", {"open": 1}, epoch=10)
    live.set({"open": 2})
    assert sink.events == [
        {
            "type": LIVE_STATE_CHANGED,
            "ephemeral": True,
            "payload": {
                "key": "task-board",
                "from": 10,
                "to": 11,
                "patch": [{"op": "replace", "path": "/open", "value": 2}],
            },
        }
    ]
    assert LIVE_STATE_CHANGED == "streamkit.live-state-changed"


def test_same_object_is_no_change_even_if_mutated() -> None:
    """Setting the held object again emits nothing, even after an in-place mutation."""
    sink = ListSink()
    state = {"n": 1}
    live = LiveState(sink, "k", state, epoch=5)
    state["n"] = 2
    live.set(state)
    assert sink.events == []
    assert live.snapshot() == LiveSnapshot(5, {"n": 2})


def test_equal_json_is_no_change() -> None:
    """A new object with the same JSON, even in a different key order, moves nothing."""
    sink = ListSink()
    live = LiveState(sink, "k", {"a": 1, "b": [1, 2]}, epoch=5)
    replacement = {"b": [1, 2], "a": 1}
    live.set(replacement)
    live.set((lambda: {"a": 1, "b": (1, 2)})())
    assert sink.events == []
    assert live.snapshot().rev == 5
    assert live.get() == {"a": 1, "b": (1, 2)}


def test_json_distinct_values_are_changes() -> None:
    """Values Python calls equal but JSON does not (1 vs true vs 1.0) each emit a delta."""
    sink = ListSink()
    live = LiveState(sink, "k", {"v": 1}, epoch=5)
    live.set({"v": True})
    live.set({"v": 1.0})
    assert [p["patch"] for p in sink.payloads] == [
        [{"op": "replace", "path": "/v", "value": True}],
        [{"op": "replace", "path": "/v", "value": 1.0}],
    ]


class Task(BaseModel):
    id: int
    title: str
    due: dt.datetime | None = None


class Board(BaseModel):
    tasks: list[Task] = []
    counts: dict[str, int] = {}


def test_pydantic_state_is_diffed_as_its_json_form() -> None:
    """A pydantic model (and lists of them) diff through model_dump(mode='json')."""
    sink = ListSink()
    first = Board(tasks=[Task(id=1, title="a")], counts={"open": 1})
    live: LiveState[Board] = LiveState(sink, "board", first, epoch=1)
    due = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    second = Board(tasks=[Task(id=1, title="a", due=due)], counts={"open": 1})
    live.set(second)
    live.set(Board(tasks=[Task(id=1, title="a", due=due)], counts={"open": 1}))
    assert sink.payloads[0]["patch"] == [
        {"op": "replace", "path": "/tasks/0/due", "value": "2030-01-02T03:04:05Z"}
    ]
    assert len(sink.events) == 1
    client = apply_delta(first.model_dump(mode="json"), sink.payloads[0]["patch"])
    assert client == second.model_dump(mode="json")
    assert live.get() is not second  # the equal third value was adopted
    live.set([second, Task(id=2, title="b")])  # type: ignore[arg-type]
    client = apply_delta(client, sink.payloads[1]["patch"])
    assert client == [second.model_dump(mode="json"), {"id": 2, "title": "b", "due": None}]


def test_big_patch_goes_as_none() -> None:
    """A patch that would push the delta past 1 MiB is sent as patch None, and the rev moves."""
    sink = ListSink()
    live = LiveState(sink, "k", {"blob": ""}, epoch=1)
    live.set({"blob": "x" * 1000})
    live.set({"blob": "y" * MAX_PATCH_BYTES})
    live.set({"blob": "z"})
    patches = [p["patch"] for p in sink.payloads]
    assert patches[0] == [{"op": "replace", "path": "/blob", "value": "x" * 1000}]
    assert patches[1] is None
    assert patches[2] == [{"op": "replace", "path": "/blob", "value": "z"}]
    assert [(p["from"], p["to"]) for p in sink.payloads] == [(1, 2), (2, 3), (3, 4)]


def test_patch_just_under_the_ceiling_is_sent() -> None:
    """A delta whose whole event fits in MAX_PATCH_BYTES carries its patch."""
    sink = ListSink()
    live = LiveState(sink, "k", {"b": ""}, epoch=1)
    envelope = len(LIVE_STATE_CHANGED) + len(
        json.dumps(
            {
                "key": "k",
                "from": 1,
                "to": 2,
                "patch": [{"op": "replace", "path": "/b", "value": ""}],
            },
            separators=(",", ":"),
        )
    )
    live.set({"b": "q" * (MAX_PATCH_BYTES - envelope)})
    assert sink.payloads[0]["patch"] is not None
    live.set({"b": "r" * (MAX_PATCH_BYTES - envelope + 1)})
    assert sink.payloads[1]["patch"] is None


def test_patch_sent_is_a_copy_the_sink_cannot_corrupt() -> None:
    """A sink that mutates the patch it got does not change the base of the next diff."""
    sink = ListSink()
    live = LiveState(sink, "k", {"items": []}, epoch=1)
    live.set({"items": [{"id": 1}]})
    sink.payloads[0]["patch"][0]["value"]["id"] = 999
    live.set({"items": [{"id": 1}, {"id": 2}]})
    assert sink.payloads[1]["patch"] == [{"op": "add", "path": "/items/1", "value": {"id": 2}}]


def test_unserializable_value_is_adopted_and_moves_the_rev_without_a_delta() -> None:
    """An unserializable value is held, the rev moves, and the next value diffs from what clients saw."""
    sink = ListSink()
    live = LiveState(sink, "k", {"a": 1}, epoch=100)
    odd = {"a": object()}
    with structlog.testing.capture_logs() as logs:
        live.set(odd)
        live.set({"a": float("nan")})
    assert sink.events == []
    nan = live.get()["a"]
    assert math.isnan(nan)  # the latest value is held all the same
    assert live.snapshot().rev == 102
    assert [entry["event"] for entry in logs] == ["live_state.unserializable"] * 2
    # Each with its traceback: the state's serialization is the user's code.
    assert all(isinstance(entry["exc_info"], TypeError | ValueError) for entry in logs)
    live.set({"a": 2})
    (payload,) = sink.payloads
    assert (payload["from"], payload["to"]) == (102, 103)
    # The patch is computed against {"a": 1}, the value every client last received.
    assert apply_delta({"a": 1}, payload["patch"]) == {"a": 2}
    # A client still holding rev 100 sees a gap (from is 102) and re-seeds instead.
    assert payload["from"] != 100


def test_rebase_moves_the_rev_without_a_delta_and_later_deltas_diff_from_it() -> None:
    """rebase adopts a value as a new revision with no delta; set then diffs from that value."""
    sink = ListSink()
    live = LiveState(sink, "k", {"a": 1}, epoch=10)
    seed = live.rebase({"a": 1, "b": [1, 2]})
    assert sink.events == []
    assert seed == LiveSnapshot(11, {"a": 1, "b": [1, 2]})
    live.set({"a": 1, "b": [1, 2, 3]})
    (payload,) = sink.payloads
    assert (payload["from"], payload["to"]) == (11, 12)
    assert apply_delta(seed.state, payload["patch"]) == {"a": 1, "b": [1, 2, 3]}


def test_rebase_to_equal_json_keeps_the_rev() -> None:
    """Rebasing onto a value whose JSON did not change keeps every client's chain intact."""
    live = LiveState(ListSink(), "k", {"a": 1}, epoch=10)
    assert live.rebase({"a": 1}).rev == 10


def test_rebase_to_an_unserializable_value_moves_the_rev_and_reseeds_next() -> None:
    """An unserializable rebase is held and reported; the next delta carries patch None."""
    sink = ListSink()
    live = LiveState(sink, "k", {"a": 1}, epoch=10)
    with structlog.testing.capture_logs() as logs:
        assert live.rebase({"a": object()}).rev == 11
    assert [entry["event"] for entry in logs] == ["live_state.unserializable"]
    live.set({"a": 2})
    assert [(p["from"], p["to"], p["patch"]) for p in sink.payloads] == [(11, 12, None)]


class Gauge(BaseModel):
    reading: float = 0.0


def test_a_model_is_published_as_its_checkpoint_json() -> None:
    """A pydantic value is diffed in the JSON its checkpoint holds: a NaN field is null there."""
    sink = ListSink()
    live = LiveState(sink, "gauge", Gauge(reading=1.5), epoch=5)
    live.set(Gauge(reading=float("nan")))
    (payload,) = sink.payloads
    assert payload["patch"] == [{"op": "replace", "path": "/reading", "value": None}]
    assert json.loads(Gauge(reading=float("nan")).model_dump_json()) == {"reading": None}


def test_unserializable_initial_makes_the_first_delta_a_reseed() -> None:
    """With no serializable value ever sent, the first real delta carries patch None."""
    sink = ListSink()
    live = LiveState(sink, "k", {1, 2}, epoch=1)
    live.set({"ok": True})
    live.set({"ok": False})
    assert [p["patch"] for p in sink.payloads] == [
        None,
        [{"op": "replace", "path": "/ok", "value": False}],
    ]


def test_set_never_raises_when_the_sink_raises_synchronously() -> None:
    """A sink whose append raises costs that delta only; set returns and the chain goes on."""

    class Flaky(ListSink):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def append(self, *events: Mapping[str, Any]) -> list[Mapping[str, Any]]:
            self.calls += 1
            if self.calls == 1:
                raise ConnectionError("sink down")
            return super().append(*events)

    sink = Flaky()
    live = LiveState(sink, "k", 0, epoch=1)
    with structlog.testing.capture_logs() as logs:
        live.set(1)
        live.set(2)
    assert [p["from"] for p in sink.payloads] == [2]  # the client sees a gap at 1 and re-seeds
    assert live.snapshot() == LiveSnapshot(3, 2)
    (lost,) = [entry for entry in logs if entry["event"] == "live_state.delta_lost"]
    assert lost["from_rev"] == 1
    assert "ConnectionError" in lost["error"]


async def test_set_never_raises_when_the_sink_fails_asynchronously() -> None:
    """An awaitable append that fails is reported, swallowed, and later deltas still go out."""

    class Failing:
        def __init__(self) -> None:
            self.events: list[Mapping[str, Any]] = []

        async def append(self, *events: Mapping[str, Any]) -> None:
            await asyncio.sleep(0)
            if events[0]["payload"]["to"] == 2:
                raise RuntimeError("append refused")
            self.events.extend(events)

    sink = Failing()
    live = LiveState(sink, "k", 0, epoch=1)
    with structlog.testing.capture_logs() as logs:
        live.set(1)
        live.set(2)
        await live.drain()
    assert [e["payload"]["to"] for e in sink.events] == [3]
    assert live.pending == 0
    assert any(
        entry["event"] == "live_state.delta_lost" and "append refused" in entry["error"]
        for entry in logs
    )


async def test_a_delta_cancelled_before_it_ran_closes_the_sinks_append() -> None:
    """The sink's append, begun at once, is closed (never left unawaited) and reported lost.

    A delta with nothing in flight calls the sink at once and awaits its
    coroutine in a task; an engine closing can cancel that task before its
    first step. The coroutine must not be left for the collector to warn about.
    """
    sink = SlowSink(0)
    live = LiveState(sink, "k", 0, epoch=1)
    with structlog.testing.capture_logs() as logs:
        live.set(1)
        tail = live._tail
        assert tail is not None
        tail.cancel()  # before the loop ever ran it
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()  # a coroutine never awaited would warn here, failing the test
    assert tail.cancelled()
    assert live.pending == 0
    assert sink.events == []
    assert [e["reason"] for e in logs if e["event"] == "live_state.delta_lost"] == [
        "the append was cancelled before it started"
    ]
    live.set(2)  # the chain goes on
    await live.drain()
    assert [e["payload"]["to"] for e in sink.events] == [3]


def test_exploding_diff_never_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """A diff that raises costs a notification: the value is adopted and set returns."""
    import streamkit.live_state as module

    def explode(*args: object) -> object:
        raise RecursionError("too deep")

    sink = ListSink()
    live = LiveState(sink, "k", {"a": 1}, epoch=1)
    monkeypatch.setattr(module, "diff", explode)
    live.set({"a": 2})
    monkeypatch.undo()
    assert live.get() == {"a": 2}
    assert [p["patch"] for p in sink.payloads] == [None]  # sent as a re-seed, not lost
    live.set({"a": 3})
    assert [p["patch"] for p in sink.payloads][1] is None  # still no base clients hold


def test_async_sink_without_a_running_loop_drops_and_reports() -> None:
    """Outside an event loop an awaitable append is closed and reported, never raised or leaked."""

    class AsyncSink:
        async def append(self, *events: Mapping[str, Any]) -> None:
            raise AssertionError("never awaited")

    live = LiveState(AsyncSink(), "k", 0, epoch=1)
    with structlog.testing.capture_logs() as logs:
        live.set(1)
    assert live.snapshot() == LiveSnapshot(2, 1)
    assert live.pending == 0
    assert [entry["reason"] for entry in logs] == [
        "the sink returned an awaitable outside an event loop"
    ]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), bursts=st.lists(st.integers(1, 6), min_size=1, max_size=6))
def test_deltas_reach_a_slow_sink_in_rev_order_one_at_a_time(seed: int, bursts: list[int]) -> None:
    """However the appends interleave with other work, the sink sees deltas in rev order, never two at once."""

    async def scenario() -> tuple[SlowSink, LiveState[list[int]]]:
        sink = SlowSink(seed)
        live: LiveState[list[int]] = LiveState(sink, "k", [], epoch=1)
        counter = 0
        rng = random.Random(seed)
        for burst in bursts:
            for _ in range(burst):
                counter += 1
                live.set([*live.get(), counter])
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
        await live.drain()
        return sink, live

    sink, live = asyncio.run(scenario())
    payloads = [dict(e["payload"]) for e in sink.events]
    assert [p["from"] for p in payloads] == list(range(1, sum(bursts) + 1))
    assert sink.most_active == 1
    assert follow([], payloads, 1) == (live.snapshot().rev, live.get())
    assert live.pending == 0


async def test_drain_waits_for_pending_appends() -> None:
    """drain returns only after every issued append settled; pending counts them meanwhile."""
    sink = GatedSink()
    live = LiveState(sink, "k", 0, epoch=1)
    live.set(1)
    live.set(2)
    assert live.pending == 2
    drained = asyncio.ensure_future(live.drain())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not drained.done()
    assert sink.started == 1  # the second append waits for the first to settle
    sink.gate.set()
    await drained
    assert live.pending == 0
    assert [e["payload"]["to"] for e in sink.events] == [2, 3]


async def test_cancelled_drain_does_not_cancel_the_appends() -> None:
    """Giving up on drain leaves the deltas in flight; they still arrive."""
    sink = GatedSink()
    live = LiveState(sink, "k", 0, epoch=1)
    live.set(1)
    waiter = asyncio.ensure_future(live.drain())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    sink.gate.set()
    await live.drain()
    assert [e["payload"]["to"] for e in sink.events] == [2]


async def test_drain_with_nothing_pending_returns_at_once() -> None:
    """drain on a LiveState that sent nothing, or only through a sync sink, returns immediately."""
    live = LiveState(ListSink(), "k", 0, epoch=1)
    await live.drain()
    live.set(1)
    assert live.pending == 0
    await live.drain()


async def test_sync_sink_inside_a_loop_is_called_before_set_returns() -> None:
    """With nothing queued, a synchronous sink has the delta as soon as set returns."""
    sink = ListSink()
    live = LiveState(sink, "k", 0, epoch=1)
    live.set(1)
    assert [p["to"] for p in sink.payloads] == [2]
    assert live.pending == 0


async def test_sync_sink_queues_behind_an_async_append_in_flight() -> None:
    """A sink that is sometimes slow keeps rev order: a quick append waits for the slow one."""

    class Mixed:
        def __init__(self) -> None:
            self.gate = asyncio.Event()
            self.tos: list[int] = []

        def append(self, *events: Mapping[str, Any]) -> object:
            to = events[0]["payload"]["to"]
            if to == 2:

                async def slow() -> None:
                    await self.gate.wait()
                    self.tos.append(to)

                return slow()
            self.tos.append(to)
            return None

    sink = Mixed()
    live = LiveState(sink, "k", 0, epoch=1)
    live.set(1)
    live.set(2)
    live.set(3)
    await asyncio.sleep(0)
    assert sink.tos == []
    sink.gate.set()
    await live.drain()
    assert sink.tos == [2, 3, 4]


def test_apply_delta_does_not_mutate_its_input() -> None:
    """apply_delta returns a new value and leaves the client's copy as it was."""
    seed = {"items": [1, 2], "meta": {"n": 2}}
    patch = [
        {"op": "add", "path": "/items/-", "value": 3},
        {"op": "replace", "path": "/meta/n", "value": 3},
    ]
    result = apply_delta(seed, patch)
    assert result == {"items": [1, 2, 3], "meta": {"n": 3}}
    assert seed == {"items": [1, 2], "meta": {"n": 2}}


def test_apply_delta_refuses_a_reseed_delta() -> None:
    """A None patch says re-seed: apply_delta refuses it rather than guessing."""
    with pytest.raises(InvalidRequest, match="re-seed"):
        apply_delta({"a": 1}, None)


def test_apply_delta_refuses_a_patch_for_another_base() -> None:
    """A patch that does not fit the copy is an InvalidRequest telling the client to re-seed."""
    with pytest.raises(InvalidRequest, match="re-seed"):
        apply_delta({"a": 1}, [{"op": "remove", "path": "/missing"}])
    with pytest.raises(InvalidRequest, match="re-seed"):
        apply_delta([1], [{"op": "replace", "path": "/5", "value": 0}])


def test_a_loop_that_ends_mid_append_leaves_no_stale_chain() -> None:
    """Appends cut off by the loop's shutdown are reported lost, and later sets are not blocked."""

    async def scenario(live: LiveState[int]) -> None:
        live.set(1)
        live.set(2)
        assert live.pending == 2

    sink = GatedSink()
    live = LiveState(sink, "k", 0, epoch=1)
    with structlog.testing.capture_logs() as logs:
        asyncio.run(scenario(live))
        assert live.pending == 0
        live.set(3)  # no loop now: dropped as any awaitable outside a loop, not queued forever
    reasons = [entry["reason"] for entry in logs if entry["event"] == "live_state.delta_lost"]
    assert reasons == [
        "the append was cancelled",
        "the append was cancelled",
        "the sink returned an awaitable outside an event loop",
    ]
    assert live.snapshot() == LiveSnapshot(4, 3)


async def test_a_delta_is_never_larger_than_replacing_the_value() -> None:
    """A change that rewrites every item goes out as one root replace, and a move as one op."""
    sink = ListSink()
    before = [{"n": i} for i in range(300)]
    live = LiveState(sink, "k", before, epoch=10)
    live.set([{"m": i} for i in range(300)])
    await live.drain()
    (payload,) = sink.payloads
    assert payload["patch"] == [
        {"op": "replace", "path": "", "value": [{"m": i} for i in range(300)]}
    ]
    live.set([{"m": 299}] + [{"m": i} for i in range(299)])
    await live.drain()
    assert sink.payloads[-1]["patch"] == [{"op": "move", "from": "/299", "path": "/0"}]

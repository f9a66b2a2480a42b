"""The author's surface: the consumes rule, the hooks' defaults, and what ``args`` can do."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from streamkit.testing import settle
from support.engine import CATALOG, Echo, Recorder, Rig, Tally, item

from streamkit import (
    LIVE_STATE_CHANGED,
    EventDefinition,
    EventInput,
    InvalidEvent,
    StreamEvent,
    StreamProcessor,
    UndeclaredEmit,
    consumes_event,
    define_processor_contract,
)
from streamkit.engine import Fold
from streamkit.processor import Delivery, ProcessEventArgs


class _Nothing(BaseModel):
    pass


class _ConsumesOnly(StreamProcessor[_Nothing]):
    """A processor that is only a consumes list (for the filter's rule)."""

    def __init__(self, consumes: list[str] | None) -> None:
        self.contract = define_processor_contract(
            slug="filter", version="1", state_schema=_Nothing, consumes=consumes
        )


def _event(etype: str, ephemeral: bool = False) -> StreamEvent:
    return StreamEvent(path="/", offset=1, type=etype, ephemeral=ephemeral)


@pytest.mark.parametrize(
    ("consumes", "etype", "ephemeral", "expected"),
    [
        (None, "a", False, True),
        (None, "a", True, False),
        (["*"], "a", False, True),
        (["*"], "a", True, False),
        (["a"], "a", False, True),
        (["a"], "a", True, True),
        (["a"], "b", False, False),
        (["*", "a"], "a", True, True),
        (["*", "a"], "b", True, False),
        ([], "a", False, False),
    ],
)
def test_the_consumes_rule(
    consumes: list[str] | None, etype: str, ephemeral: bool, expected: bool
) -> None:
    """None or "*" takes every durable event; a named type opts in, ephemeral or not."""
    assert consumes_event(consumes, _event(etype, ephemeral)) is expected
    assert consumes_event(consumes, {"type": etype, "ephemeral": ephemeral}) is expected


class _Seen(StreamProcessor[_Nothing]):
    """Records the events its fold reduces."""

    def __init__(self, consumes: list[str] | None) -> None:
        self.contract = define_processor_contract(
            slug="seen", version="1", state_schema=_Nothing, consumes=consumes
        )
        self.reduced: list[StreamEvent] = []

    def reduce(self, event: StreamEvent, state: _Nothing) -> _Nothing:
        self.reduced.append(event)
        return state


@given(
    consumes=st.none() | st.lists(st.sampled_from(["a", "b", "*"]), max_size=3),
    events=st.lists(
        st.tuples(st.sampled_from(["a", "b", LIVE_STATE_CHANGED]), st.booleans()), max_size=12
    ),
)
def test_the_fold_reduces_what_the_consumes_rule_takes_in_any_order(
    consumes: list[str] | None, events: list[tuple[str, bool]]
) -> None:
    """The fold's per-type cache never changes the rule, whichever kind of event comes first."""
    processor = _Seen(consumes)
    fold = Fold(processor)
    stream = [_event(etype, ephemeral) for etype, ephemeral in events]
    for event in stream:  # one by one, and then all at once through the filled cache
        fold.apply(event, _Nothing())
    fold.fold_all(stream, _Nothing())
    taken = [event for event in stream if fold.reduces(event)]
    assert processor.reduced == taken + taken
    for etype, _ in events:  # an ephemeral taken would be taken durable too
        if fold.reduces(_event(etype, ephemeral=True)):
            assert fold.reduces(_event(etype))


def test_the_consumes_rule_itself_lets_subscribers_watch_deltas() -> None:
    """consumes_event is the subscription rule: a named live-state type is watched (engines never reduce it)."""
    assert consumes_event([LIVE_STATE_CHANGED], _event(LIVE_STATE_CHANGED, ephemeral=True))


def test_idempotency_keys_are_namespaced_by_slug() -> None:
    """idempotency_key gives "slug/key", or "slug/key@offset" for one event."""
    processor = Recorder()
    assert processor.idempotency_key("send") == "recorder/send"
    event = StreamEvent(path="/", offset=41, type="item.added")
    assert processor.idempotency_key("send", event) == "recorder/send@41"


def test_the_hooks_default_to_no_change() -> None:
    """The base reduce keeps the state, process_event does nothing, the projection is the state."""

    class Bare(StreamProcessor[Tally]):
        contract = Recorder.contract

    bare = Bare()
    state = Tally(total=1)
    assert bare.reduce(_event("item.added"), state) is None
    assert bare.project_live_state(state) is state
    assert repr(Delivery(True)) == "Delivery(caught_up=True)"


# -- args.append ------------------------------------------------------------------------


async def test_append_stamps_the_source_and_starts_at_once(rig: Rig) -> None:
    """An emitted event carries source.processor (slug, version, the event being processed)."""
    tasks: list[Any] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            tasks.append(
                args.append(
                    {
                        "type": "item.echoed",
                        "payload": {"n": args.event.payload.n},
                        "source": {"principal": "alice"},
                    }
                )
            )

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(7))
    await settle()
    (echoed,) = await tasks[0]
    assert echoed.type == "item.echoed"
    assert echoed.source == {
        "principal": "alice",
        "processor": {
            "slug": "recorder",
            "version": "1",
            "while_processing": {"offset": 1, "type": "item.added"},
        },
    }


async def test_append_in_the_eventless_pass_has_no_while_processing(rig: Rig) -> None:
    """An append from the eventless at-head pass is stamped with slug and version only."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is None:
            args.append(
                EventInput(
                    type="item.echoed",
                    payload=Echo(n=0),
                    idempotency_key=Recorder().idempotency_key("hello"),
                )
            )

    rig.engine(Recorder(on_event))
    await rig.stream.append({"type": "note.made"})
    await settle()
    echoed = [e for e in rig.stream.events if e.type == "item.echoed"]
    assert [e.source for e in echoed] == [{"processor": {"slug": "recorder", "version": "1"}}]
    assert echoed[0].payload == {"n": 0}


async def test_append_refuses_an_undeclared_type(rig: Rig) -> None:
    """Appending a type the contract does not emit raises UNDECLARED_EMIT before anything starts."""
    errors: list[UndeclaredEmit] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        try:
            args.append({"type": "item.echoed", "payload": {"n": 1}}, {"type": "item.added"})
        except UndeclaredEmit as exc:
            errors.append(exc)

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    (error,) = errors
    assert error.code == "UNDECLARED_EMIT"
    assert "item.added" in str(error)
    assert "nothing was appended" in str(error)
    assert [e.type for e in rig.stream.events] == ["item.added"]


class Loose(BaseModel):
    """A model whose field takes anything, so its JSON form can fail."""

    n: Any


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ({"n": "many"}, "does not match its declared schema Echo"),
        (Loose(n=object()), "cannot be serialized to JSON"),
    ],
    ids=["breaks-its-schema", "model-not-json"],
)
async def test_append_refuses_a_payload_it_cannot_write(rig: Rig, payload: Any, why: str) -> None:
    """A payload that breaks its declared schema, or a model whose JSON form fails, is refused
    with INVALID_EVENT before anything is written."""
    errors: list[InvalidEvent] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        try:
            args.append({"type": "item.echoed", "payload": payload})
        except InvalidEvent as exc:
            errors.append(exc)

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    (error,) = errors
    assert error.code == "INVALID_EVENT"
    assert why in str(error)
    assert "nothing was appended" in str(error)
    assert [e.type for e in rig.stream.events] == ["item.added"]


async def test_a_model_payload_of_the_declared_schema_is_appended_as_its_json(rig: Rig) -> None:
    """The declared schema's own model goes in as its JSON form, read back as a plain dict."""
    tasks: list[Any] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            tasks.append(args.append({"type": "item.echoed", "payload": Echo(n=5)}))

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    (echoed,) = await tasks[0]
    assert echoed.payload == {"n": 5}
    assert rig.stream.events[-1].payload == {"n": 5}


class VersionedRecorder(Recorder):
    """The recorder, its emitted type at version 2 of its payload."""

    contract = define_processor_contract(
        slug="recorder",
        version="1",
        state_schema=Tally,
        events={
            **CATALOG,
            "item.echoed": EventDefinition(
                description="what the recorder emits",
                payload_schema=Echo,
                version=2,
                upcasters={1: lambda payload: {"n": 0, **payload}},
            ),
        },
        consumes=["item.added", "ping"],
        emits=["item.echoed"],
    )


async def test_an_emitted_event_is_stamped_with_its_definition_s_version(rig: Rig) -> None:
    """What a processor appends is of its current model, so it carries that model's version;
    naming another version is refused, nothing written."""
    tasks: list[Any] = []
    refused: list[InvalidEvent] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is None:
            return
        tasks.append(args.append({"type": "item.echoed", "payload": Echo(n=5)}))
        try:
            args.append({"type": "item.echoed", "payload": {"n": 6}, "payload_version": 1})
        except InvalidEvent as exc:
            refused.append(exc)

    rig.engine(VersionedRecorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    (echoed,) = await tasks[0]
    assert echoed.payload_version == 2
    assert [(e.type, e.payload_version) for e in rig.stream.events] == [
        ("item.added", 1),
        ("item.echoed", 2),
    ]
    (error,) = refused
    assert error.details["field"] == "payload_version"
    assert "nothing was appended" in str(error)


async def test_a_failed_append_nobody_awaits_is_reported(rig: Rig) -> None:
    """An append the stream refuses later is reported through structlog with its context."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            args.append({"type": "item.echoed", "payload": {"n": 1}, "metadata": {"x": {1, 2}}})

    rig.engine(Recorder(on_event))
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1))
        await settle()
    (entry,) = [e for e in logs if e["event"] == "processor.append_failed"]
    assert (entry["slug"], entry["offset"], entry["type"]) == ("recorder", 1, "item.added")
    assert "metadata" in entry["error"]


async def test_args_carry_state_and_previous_state(rig: Rig) -> None:
    """process_event sees the state after this event and the state before it."""
    seen: list[tuple[int, int]] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            seen.append((args.previous_state.total, args.state.total))

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(2), item(3))
    await settle()
    assert seen == [(0, 2), (2, 5)]


@pytest.mark.parametrize("consumes", [None, ["*"], ["a"], ["a", "*"], [], ["b", "a"]])
@pytest.mark.parametrize("etype", ["a", "b", LIVE_STATE_CHANGED])
@pytest.mark.parametrize("ephemeral", [False, True])
def test_the_engine_filter_is_the_consumes_rule_minus_deltas(
    consumes: list[str] | None, etype: str, ephemeral: bool
) -> None:
    """The engine's compiled filter agrees with consumes_event, except it never takes a delta."""
    event = _event(etype, ephemeral)
    expected = etype != LIVE_STATE_CHANGED and consumes_event(consumes, event)
    fold = Fold(_ConsumesOnly(consumes))
    assert fold.reduces(event) is expected
    assert consumes_event(consumes, {"type": etype, "ephemeral": ephemeral}) is consumes_event(
        consumes, event
    )

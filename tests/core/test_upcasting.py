"""Versioned event definitions: the chain an old payload takes, and every shape refused when defined."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from streamkit.testing import reduce_processor
from support.upcasting import (
    CREATED,
    Board,
    TaskBoard,
    Tasks,
    TaskV3,
    stored_at,
    v1_to_v2,
    v2_to_v3,
)

from streamkit import (
    DROP,
    EventDefinition,
    InvalidContract,
    InvalidEvent,
    PayloadMalformed,
    SchemaAhead,
    StreamEvent,
    define_processor_contract,
)
from streamkit.engine import Fold
from streamkit.events import prepare_event
from streamkit.lifting import as_read_by
from streamkit.upcasting import MAX_VERSION, upcast


def test_a_definition_defaults_to_version_one_with_no_chain() -> None:
    plain = EventDefinition(description="x", payload_schema=TaskV3)
    assert (plain.version, dict(plain.upcasters), plain.renamed_from) == (1, {}, ())


def test_the_chain_is_kept_in_version_order_and_cannot_be_changed_afterwards() -> None:
    assert list(CREATED.upcasters) == [1, 2]
    with pytest.raises(TypeError):
        CREATED.upcasters[3] = v1_to_v2  # type: ignore[index]


def test_an_old_payload_walks_the_chain_to_the_current_model() -> None:
    stored = {"title": "write docs", "assignee": "ana"}
    lifted = upcast("task.created", stored, 1, CREATED.version, CREATED.upcasters)
    assert lifted == {"title": "write docs", "priority": 0, "owner": "ana"}
    assert TaskV3.model_validate(lifted).owner == "ana"
    assert stored == {"title": "write docs", "assignee": "ana"}  # the stored dict is untouched


def test_a_current_payload_is_returned_as_it_is() -> None:
    payload = {"title": "t", "priority": 1, "owner": "o"}
    assert upcast("task.created", payload, 3, 3, CREATED.upcasters) is payload


def test_a_step_that_returns_drop_drops_the_event() -> None:
    retired = EventDefinition(
        description="x", payload_schema=TaskV3, version=2, upcasters={1: lambda p: DROP}
    )
    assert upcast("t", {"title": "x"}, 1, 2, retired.upcasters) is DROP
    assert repr(DROP) == "DROP"


def test_a_version_newer_than_the_code_is_refused_not_guessed() -> None:
    with pytest.raises(InvalidEvent, match="newer than this code knows") as caught:
        upcast("task.created", {}, 4, 3, CREATED.upcasters)
    assert caught.value.details == {"type": "task.created", "stored": 4, "version": 3}


def test_a_version_older_than_the_chain_is_refused() -> None:
    short = EventDefinition(
        description="x", payload_schema=TaskV3, version=3, upcasters={2: v2_to_v3}
    )
    with pytest.raises(InvalidEvent, match="no upcaster from version 1"):
        upcast("task.created", {"title": "x"}, 1, 3, short.upcasters)


def test_a_step_that_returns_no_dict_is_refused() -> None:
    broken = EventDefinition(
        description="x", payload_schema=TaskV3, version=2, upcasters={1: lambda p: [p]}
    )
    with pytest.raises(InvalidEvent, match="returned list, not a dict or DROP"):
        upcast("t", {}, 1, 2, broken.upcasters)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"version": 0}, "version must be an int from 1"),
        ({"version": True}, "version must be an int from 1"),
        ({"version": "2"}, "version must be an int from 1"),
        ({"version": MAX_VERSION + 1}, "version must be an int from 1"),
        ({"version": 2, "upcasters": [v1_to_v2]}, "upcasters must map"),
        ({"version": 2, "upcasters": {2: v1_to_v2}}, "the key 2"),
        ({"version": 2, "upcasters": {0: v1_to_v2}}, "the key 0"),
        ({"upcasters": {1: v1_to_v2}}, "the key 1"),
        ({"version": 2, "upcasters": {"1": v1_to_v2}}, "the key '1'"),
        ({"version": 2, "upcasters": {1: "v1_to_v2"}}, r"upcasters\[1\] must be a function"),
        ({"version": 4, "upcasters": {1: v1_to_v2, 3: v2_to_v3}}, "miss the step from 2"),
        ({"version": 4, "upcasters": {1: v1_to_v2, 2: v2_to_v3}}, "miss the step from 3"),
        ({"renamed_from": "task.opened"}, "renamed_from must be a list"),
        ({"renamed_from": ("",)}, "not an event type"),
    ],
)
def test_malformed_versions_are_refused_when_defined(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidContract, match=words):
        EventDefinition(description="x", payload_schema=TaskV3, **fields)


def contract(events: dict[str, EventDefinition], **more: Any) -> Any:
    return define_processor_contract(
        slug="board", version="1", state_schema=Board, events=events, **more
    )


def test_a_contract_knows_which_old_names_read_as_which_type() -> None:
    assert contract({"task.created": CREATED}).renames() == {"task.opened": "task.created"}


def test_a_type_renamed_from_itself_is_refused() -> None:
    looped = EventDefinition(description="x", payload_schema=TaskV3, renamed_from=("a",))
    with pytest.raises(InvalidContract, match="renamed from itself"):
        contract({"a": looped})


def test_a_rename_cycle_is_refused() -> None:
    a = EventDefinition(description="x", payload_schema=TaskV3, renamed_from=("b",))
    b = EventDefinition(description="x", payload_schema=TaskV3, renamed_from=("a",))
    with pytest.raises(InvalidContract, match="still defined as a type of its own"):
        contract({"a": a, "b": b})


def test_a_renamed_name_still_defined_by_a_dependency_is_refused() -> None:
    owner = contract({"task.opened": EventDefinition(description="x", payload_schema=TaskV3)})
    with pytest.raises(InvalidContract, match=r'renamed from "task.opened", which is still'):
        define_processor_contract(
            slug="other",
            version="1",
            state_schema=Board,
            events={"task.created": CREATED},
            processor_deps=[owner],
        )


def test_one_old_name_renamed_into_two_types_is_refused() -> None:
    other = EventDefinition(description="x", payload_schema=TaskV3, renamed_from=("task.opened",))
    with pytest.raises(InvalidContract, match="renamed into both") as caught:
        contract({"task.created": CREATED, "task.filed": other})
    assert caught.value.details["renamed_from"] == "task.opened"


def test_a_dependency_s_renames_are_read_by_its_consumers() -> None:
    owner = contract({"task.created": CREATED})
    consumer = define_processor_contract(
        slug="consumer",
        version="1",
        state_schema=Board,
        processor_deps=[owner],
        consumes=["task.created"],
    )
    assert consumer.renames() == {"task.opened": "task.created"}


@given(
    start=st.integers(min_value=1, max_value=6),
    extra=st.integers(min_value=0, max_value=6),
    payload=st.dictionaries(st.text(max_size=5), st.integers(), max_size=5),
)
def test_each_step_of_a_chain_runs_once_in_order(
    start: int, extra: int, payload: dict[str, int]
) -> None:
    version = start + extra
    ran: list[int] = []

    def step(k: int) -> Any:
        def lift(p: dict[str, Any]) -> dict[str, Any]:
            ran.append(k)
            return {**p, f"v{k + 1}": k}

        return lift

    definition = EventDefinition(
        description="x",
        payload_schema=TaskV3,
        version=version,
        upcasters={k: step(k) for k in range(start, version)},
    )
    lifted = upcast("t", payload, start, version, definition.upcasters)
    assert ran == list(range(start, version))
    assert lifted == {**payload, **{f"v{k + 1}": k for k in range(start, version)}}


# -- the fold: every path that reduces reads old events alike ------------------------------


def test_the_fold_reads_renamed_and_older_events_as_the_current_model() -> None:
    events = [
        stored_at(1, "a", 0, "ana"),
        stored_at(2, "b", 2, "bo"),
        # Stored by an old release: named v1 (an unnamed one is stamped current, as a host does).
        {"type": "task.retired", "payload": {"why": "gone"}, "payload_version": 1},
        stored_at(3, "c", 3, "cy"),
    ]
    assert reduce_processor(TaskBoard(), events) == Tasks(
        titles=["a", "b", "c"], owners=["ana", "bo", "cy"], priorities=[0, 2, 3]
    )


def test_a_dropped_event_is_counted_never_reduced() -> None:
    fold = Fold(TaskBoard())
    state, folded = fold.fold_all(
        [
            StreamEvent(path="/", offset=1, type="task.retired"),
            StreamEvent(path="/", offset=2, type="task.retired", payload_version=2),
        ],
        Tasks(),
    )
    # The dropped v1 event never reaches the reduce; the v2 one does, and this board's
    # reduce refuses it, which stalls the fold before it (the default).
    assert (folded, fold.tally.dropped, fold.tally.malformed) == (0, 1, 0)
    assert fold.stopped_at == 2
    assert state == Tasks()


def test_an_upcaster_that_raises_makes_the_event_malformed_not_a_crash() -> None:
    broken = EventDefinition(
        description="x", payload_schema=TaskV3, version=2, upcasters={1: lambda p: p["missing"]}
    )

    class Broken(TaskBoard):
        contract = define_processor_contract(
            slug="broken", version="1", state_schema=Tasks, events={"task.created": broken}
        )

    stored = [StreamEvent(path="/", offset=1, type="task.created", payload={})]
    fold = Fold(Broken())
    fold.fold_all(stored, Tasks())
    assert isinstance(fold.stopped, PayloadMalformed)  # the default: stall before it
    assert "missing" in fold.stopped.details["error"]
    fold = Fold(Broken(), on_malformed="skip")
    fold.fold_all(stored, Tasks())
    assert fold.tally.malformed == 1
    assert fold.tally.last_malformed is not None
    assert "missing" in fold.tally.last_malformed["error"]


def test_a_version_newer_than_the_contract_stops_the_fold_before_it() -> None:
    events = [stored_at(3, "a", 1, "x"), {**stored_at(3, "b", 1, "y"), "payload_version": 4}]
    with pytest.raises(SchemaAhead) as caught:
        reduce_processor(TaskBoard(), [*events, stored_at(3, "c", 1, "z")])
    assert caught.value.code == "SCHEMA_AHEAD"
    assert caught.value.retryable
    assert caught.value.details["offset"] == 2
    assert "nothing was skipped" in str(caught.value)
    fold = Fold(TaskBoard())
    prepared = [
        prepare_event(e, i).decoded(path="/", offset=i + 1, created_at="")
        for i, e in enumerate(events)
    ]
    state, folded = fold.fold_all(prepared, Tasks())
    assert (state.titles, folded) == (["a"], 1)
    assert fold.fold_all(prepared, state) == (state, 0)  # it stays stopped


def test_a_typed_read_types_only_payloads_of_the_model_s_version() -> None:
    """A processor's typed reads leave versioned types to the fold, which lifts them first."""
    assert "task.created" not in Fold(TaskBoard()).payload_types()


@given(
    st.lists(
        st.tuples(
            st.sampled_from([1, 2, 3]),
            st.text(max_size=4),
            st.integers(min_value=-5, max_value=5),
            st.text(max_size=4),
        ),
        max_size=20,
    )
)
def test_a_mixed_version_log_folds_as_the_same_log_written_at_the_current_version(
    tasks: list[tuple[int, str, int, str]],
) -> None:
    mixed = [stored_at(v, title, prio if v > 1 else 0, owner) for v, title, prio, owner in tasks]
    current = [stored_at(3, title, prio if v > 1 else 0, owner) for v, title, prio, owner in tasks]
    assert reduce_processor(TaskBoard(), mixed) == reduce_processor(TaskBoard(), current)


def _stored(offset: int, raw: dict[str, Any]) -> StreamEvent:
    return prepare_event(raw, 0).decoded(path="/", offset=offset, created_at="t")


def test_an_event_as_a_contract_reads_it_now_says_what_was_lifted_and_what_cannot_be() -> None:
    contract = TaskBoard.contract
    current = _stored(1, stored_at(3, "a", 1, "ana"))
    assert as_read_by(contract, current) == (current, None)
    other = _stored(2, {"type": "note", "payload": {"x": 1}})
    assert as_read_by(contract, other) == (other, None)
    lifted, note = as_read_by(contract, _stored(3, stored_at(1, "b", 0, "bo")))
    assert note == {"from_type": "task.opened", "from_version": 1}
    assert (lifted.type, lifted.payload_version, lifted.offset) == ("task.created", 3, 3)
    assert lifted.payload == {"title": "b", "priority": 0, "owner": "bo"}
    for raw, why in (
        ({"type": "task.retired", "payload": {}}, "drop version-1 events"),
        ({**stored_at(3, "c", 1, "cy"), "payload_version": 4}, "newer than this code"),
        ({"type": "task.created", "payload": {"title": 1}, "payload_version": 2}, "title"),
    ):
        event = _stored(4, raw)
        kept, unreadable = as_read_by(contract, event)
        assert kept is event
        assert unreadable is not None
        assert why in unreadable["unreadable"]

"""Processor contracts: what define_processor_contract builds, and every shape it refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, Field

from streamkit import (
    LIVE_STATE_CHANGED,
    EventDefinition,
    InvalidContract,
    ProcessorContract,
    define_processor_contract,
)


class Created(BaseModel):
    title: str


class Closed(BaseModel):
    reason: str = ""


class Board(BaseModel):
    open: list[str] = Field(default_factory=list)


TASKS = define_processor_contract(
    slug="tasks",
    version="1",
    state_schema=Board,
    events={"task.created": EventDefinition(description="a task", payload_schema=Created)},
    consumes=["task.created"],
    emits=["task.created"],
)
CLOSER = define_processor_contract(
    slug="closer",
    version="1",
    state_schema=Board,
    events={"task.closed": EventDefinition(description="closed", payload_schema=Closed)},
)


def define(**overrides: Any) -> ProcessorContract[Any]:
    fields: dict[str, Any] = {
        "slug": "board",
        "version": "1",
        "description": "open tasks",
        "state_schema": Board,
        "events": {"board.changed": EventDefinition(description="x", payload_schema=Board)},
        "processor_deps": [TASKS, CLOSER],
        "consumes": ["task.created", "task.closed"],
        "emits": ["board.changed"],
    }
    fields.update(overrides)
    return define_processor_contract(**fields)


def test_a_defined_contract_carries_its_parts() -> None:
    """The contract keeps its fields, builds fresh initial states, and resolves payload schemas."""
    contract = define()
    assert (contract.slug, contract.version, contract.description) == ("board", "1", "open tasks")
    assert contract.consumes == ("task.created", "task.closed")
    assert contract.emits == ("board.changed",)
    first, second = contract.initial_state(), contract.initial_state()
    assert first == Board()
    assert first is not second
    assert contract.payload_schema_for("board.changed") is Board
    assert contract.payload_schema_for("task.created") is Created
    assert contract.payload_schema_for("task.closed") is Closed
    assert contract.payload_schema_for("unknown") is None


def test_consumes_none_means_every_durable_event() -> None:
    """Leaving consumes out keeps None (every durable event); "*" is accepted as a name."""
    assert define(consumes=None).consumes is None
    assert define(consumes=["*"]).consumes == ("*",)


def test_a_contract_without_a_catalog_accepts_any_names() -> None:
    """With no events catalog, consumes and emits may name anything and payloads stay raw."""
    contract = define_processor_contract(
        slug="raw", version="1", state_schema=Board, consumes=["x.y"], emits=["z"]
    )
    assert contract.events is None
    assert contract.payload_schema_for("x.y") is None


def test_a_hand_built_contract_keeps_a_raw_state() -> None:
    """ProcessorContract with an `initial` factory and no schema keeps a plain JSON state."""
    contract: ProcessorContract[dict[str, int]] = ProcessorContract(
        slug="counter", version="7", initial=lambda: {"n": 0}, consumes=("tick",)
    )
    assert contract.initial_state() == {"n": 0}
    assert contract.state_schema is None
    assert contract.payload_schema_for("tick") is None


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"slug": ""}, "slug"),
        ({"slug": "has space"}, "slug"),
        ({"slug": "-leading"}, "slug"),
        ({"slug": "x" * 129}, "slug"),
        ({"slug": 7}, "slug"),
        ({"version": ""}, "version"),
        ({"version": 2}, "version"),
        ({"description": None}, "description"),
        ({"consumes": "task.created"}, "list of event types"),
        ({"emits": "board.changed"}, "list of event types"),
        ({"consumes": ["task.created", ""]}, "not an event type"),
        ({"consumes": ["task.deleted"]}, "task.deleted"),
        ({"emits": ["board.moved"]}, "board.moved"),
        ({"emits": ["*"]}, "emits cannot"),
        ({"consumes": [LIVE_STATE_CHANGED]}, "live-state"),
        (
            {"events": {LIVE_STATE_CHANGED: EventDefinition(description="", payload_schema=Board)}},
            "live-state",
        ),
        ({"events": {"a": "not a definition"}}, "EventDefinition"),
        ({"events": ["a"]}, "map event types"),
        ({"processor_deps": ["tasks"]}, "not a contract"),
        ({"processor_deps": [TASKS, TASKS]}, "twice"),
        ({"state_schema": dict}, "pydantic model"),
    ],
)
def test_malformed_contracts_are_refused(overrides: dict[str, Any], words: str) -> None:
    """Each malformed field is refused with INVALID_CONTRACT naming what broke."""
    with pytest.raises(InvalidContract) as caught:
        define(**overrides)
    assert caught.value.code == "INVALID_CONTRACT"
    assert words in str(caught.value)


def test_a_state_schema_that_needs_arguments_is_refused() -> None:
    """A state schema that does not construct from {} is refused."""

    class Needy(BaseModel):
        owner: str

    with pytest.raises(InvalidContract, match=r"constructs from \{\}"):
        define(state_schema=Needy)


def test_a_state_that_does_not_survive_json_is_refused() -> None:
    """An initial state that changes through JSON (checkpoints store JSON) is refused."""

    class Lossy(BaseModel):
        ratio: float = float("nan")

    with pytest.raises(InvalidContract, match="JSON"):
        define(state_schema=Lossy)
    with pytest.raises(InvalidContract, match="JSON"):
        ProcessorContract(slug="raw", version="1", initial=lambda: {"pair": (1, 2)})
    with pytest.raises(InvalidContract, match="JSON"):
        ProcessorContract(slug="raw", version="1", initial=lambda: {"when": object()})


def test_an_event_owned_locally_and_by_a_dep_is_refused() -> None:
    """An event type in the local catalog that a dependency also owns is refused."""
    events = {"task.created": EventDefinition(description="mine too", payload_schema=Created)}
    with pytest.raises(InvalidContract, match="also owned by its dependency") as caught:
        define(events=events, emits=[])
    assert caught.value.details["event"] == "task.created"


def test_an_event_declared_by_two_deps_is_refused() -> None:
    """Two dependencies declaring the same event type are refused."""
    twin = define_processor_contract(
        slug="twin",
        version="1",
        state_schema=Board,
        events={"task.created": EventDefinition(description="again", payload_schema=Created)},
    )
    with pytest.raises(InvalidContract, match="declared by two dependencies") as caught:
        define(processor_deps=[TASKS, twin])
    assert caught.value.details["deps"] == ["tasks", "twin"]


def test_a_contract_cannot_depend_on_itself() -> None:
    """A dependency with the contract's own slug is refused."""
    with pytest.raises(InvalidContract, match="itself"):
        define(slug="tasks", processor_deps=[TASKS])


def test_event_definitions_check_their_fields() -> None:
    """EventDefinition refuses a payload schema that is not a pydantic model."""
    with pytest.raises(InvalidContract, match="pydantic model"):
        EventDefinition(description="x", payload_schema=dict)  # type: ignore[arg-type]
    with pytest.raises(InvalidContract, match="description"):
        EventDefinition(description=None, payload_schema=Board)  # type: ignore[arg-type]
    with pytest.raises(InvalidContract, match="ephemeral"):
        EventDefinition(description="", payload_schema=Board, ephemeral="yes")  # type: ignore[arg-type]


def test_duplicate_names_in_consumes_collapse() -> None:
    """A type listed twice in consumes is kept once, in first-seen order."""
    assert define(consumes=["task.closed", "task.created", "task.closed"]).consumes == (
        "task.closed",
        "task.created",
    )


class Entry(BaseModel):
    name: str
    tries: int = 0
    tags: list[str] = Field(default_factory=list)


class Queue(BaseModel):
    entries: dict[str, Entry] = Field(default_factory=dict)
    paused: bool = False


def test_a_compact_state_leaves_defaults_out_at_any_depth_and_restores() -> None:
    """compact_state drops every field at its default from the checkpoint; loading restores them."""
    compact = define_processor_contract(
        slug="queue", version="1", state_schema=Queue, compact_state=True
    )
    plain = define_processor_contract(slug="queue", version="1", state_schema=Queue)
    state = Queue(entries={"a": Entry(name="a"), "b": Entry(name="b", tries=2, tags=["x"])})
    text = compact.dump_state(state)
    assert json.loads(text) == {
        "entries": {"a": {"name": "a"}, "b": {"name": "b", "tries": 2, "tags": ["x"]}}
    }
    assert compact.load_state(text) == state
    assert json.loads(plain.dump_state(state))["entries"]["a"] == {
        "name": "a",
        "tries": 0,
        "tags": [],
    }


@pytest.mark.parametrize("start", ["beginning", "start", "head", None])
def test_a_contract_may_declare_where_its_processor_starts(start: Any) -> None:
    contract = define_processor_contract(slug="s", version="1", state_schema=Board, start=start)
    assert contract.start == start


def test_a_start_that_is_not_one_of_the_three_is_refused() -> None:
    with pytest.raises(InvalidContract, match='start must be "beginning", "start" or "head"'):
        define_processor_contract(slug="s", version="1", state_schema=Board, start="now")  # type: ignore[arg-type]

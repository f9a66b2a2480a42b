"""JSON forms walked beside the previous value: the fast twin of serialize, parse and diff."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, computed_field, field_serializer

from streamkit import LiveState, apply_delta, live_state
from streamkit._json_walk import ABSENT, Unplanned, fresh_form, plain_form_of, step


class Tag(BaseModel):
    label: str
    weight: float = 1.0


class Item(BaseModel):
    name: str
    count: int = 0
    ratio: float = 0.0
    done: bool = False
    note: str | None = None
    kind: Literal["a", "b", 3] = "a"
    tags: list[Tag] = Field(default_factory=list)
    limits: dict[str, int] = Field(default_factory=dict)
    size: int = Field(default=0, ge=0)


class Board(BaseModel):
    title: str
    items: dict[str, Item] = Field(default_factory=dict)
    order: list[Item] = Field(default_factory=list)
    pinned: Item | None = None
    nested: list[list[int]] = Field(default_factory=list)


def text(form: Any) -> str:
    """Strict JSON equality as text: 1 and 1.0, true and 1, 0.0 and -0.0 all differ.

    Keys are sorted: a patch's ``add`` puts a new key last in a client's copy,
    and JSON objects are unordered.
    """
    return json.dumps(form, separators=(",", ":"), sort_keys=True)


def ordered_text(form: Any) -> str:
    """As :func:`text`, and the keys in pydantic's order too."""
    return json.dumps(form, separators=(",", ":"))


floats = st.floats(allow_nan=True, allow_infinity=True)
names = st.text(max_size=6)
tags = st.builds(Tag, label=names, weight=floats)
items = st.builds(
    Item,
    name=names,
    count=st.integers(-(2**70), 2**70),
    ratio=floats,
    done=st.booleans(),
    note=st.none() | names,
    kind=st.sampled_from(["a", "b", 3]),
    tags=st.lists(tags, max_size=3),
    limits=st.dictionaries(names, st.integers(), max_size=3),
    size=st.integers(0, 10),
)


@st.composite
def board_histories(draw: st.DrawFn) -> list[Board]:
    """Boards in a row, each reusing some of the previous one's items as the same objects."""
    pool = draw(st.lists(items, min_size=1, max_size=6))
    boards = []
    for _ in range(draw(st.integers(1, 5))):
        keep = draw(st.lists(st.sampled_from(pool), max_size=6))
        fresh = draw(st.lists(items, max_size=2))
        chosen = keep + fresh
        pool = pool + fresh
        boards.append(
            Board(
                title=draw(names),
                items={f"k{i}": item for i, item in enumerate(chosen)},
                order=list(reversed(chosen)),
                pinned=draw(st.none() | st.sampled_from(pool)),
                nested=draw(st.lists(st.lists(st.integers(), max_size=2), max_size=2)),
            )
        )
    return boards


@settings(max_examples=100, deadline=None)
@given(board_histories())
def test_a_walked_form_and_its_ops_equal_the_plain_twin(history: list[Board]) -> None:
    """Through any history of kept and fresh parts: pydantic's JSON, and ops that reach it."""
    previous: Any = ABSENT
    form: Any = ABSENT
    for board in history:
        walked = step(board, previous, form)
        assert text(walked.form) == text(plain_form_of(board))
        if form is not ABSENT:
            assert text(apply_delta(plain_form_of(previous), walked.ops)) == text(walked.form)
            assert walked.floor <= len(ordered_text(walked.form))
        previous, form = board, walked.form


@settings(max_examples=60, deadline=None)
@given(items)
def test_a_fresh_form_is_pydantic_s_own(item: Item) -> None:
    """With nothing before it, the walk writes what pydantic writes, key order included."""
    board = Board(title="t", items={"a": item}, order=[item, item], pinned=item)
    assert ordered_text(fresh_form(board)) == ordered_text(plain_form_of(board))


def test_an_unchanged_part_keeps_its_form_object_and_costs_no_op() -> None:
    """A part that is the same object as before keeps the same form object; the ops name the rest."""
    kept, changed = Item(name="kept"), Item(name="old")
    first = Board(title="t", items={"a": kept, "b": changed})
    before = fresh_form(first)
    second = Board(title="t", items={"a": kept, "b": Item(name="new")})
    walked = step(second, first, before)
    assert walked.form["items"]["a"] is before["items"]["a"]
    assert walked.form["items"]["b"]["name"] == "new"
    assert walked.ops == [{"op": "replace", "path": "/items/b/name", "value": "new"}]
    assert before["items"]["b"]["name"] == "old"  # the previous form is never edited


def test_keys_added_and_removed_are_add_and_remove_ops() -> None:
    """A dict that lost one key and gained another: one remove, one add, each at its pointer."""
    a, b = Item(name="a"), Item(name="b")
    first = Board(title="t", items={"a/1": a, "b": b})
    second = Board(title="t", items={"b": b, "c~": Item(name="c")})
    walked = step(second, first, fresh_form(first))
    assert sorted((op["op"], op["path"]) for op in walked.ops) == [
        ("add", "/items/c~0"),
        ("remove", "/items/a~11"),
    ]


class WithSerializer(BaseModel):
    at: int

    @field_serializer("at")
    def shown(self, value: int) -> str:
        return f"#{value}"


class WithComputed(BaseModel):
    n: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return self.n * 2


class WithDatetime(BaseModel):
    at: datetime


class WithExtra(BaseModel):
    model_config = ConfigDict(extra="allow")
    n: int


class WithAny(BaseModel):
    value: Any


class Sub(Tag):
    secret: str = "hidden"


def _unplanned_values() -> list[BaseModel]:
    return [
        WithSerializer(at=1),
        WithComputed(n=2),
        WithDatetime(at=datetime(2026, 1, 1)),
        WithExtra(n=1, more=2),
        WithAny(value={"a": 1}),
        # pydantic converts these by the declared type; the walk does not guess.
        Item.model_construct(name="x", count=True),
        Item.model_construct(name="x", ratio=1),
        Board(title="t", order=[Item(name="x", tags=[Sub(label="s")])]),
    ]


@pytest.mark.parametrize("value", _unplanned_values(), ids=lambda v: type(v).__name__)
def test_what_the_walk_does_not_copy_pydantic_for_is_refused(value: BaseModel) -> None:
    """Serializers, computed fields, other types, extras and converted values take the plain path."""
    with pytest.raises(Unplanned):
        fresh_form(value)


@pytest.mark.parametrize("value", _unplanned_values(), ids=lambda v: type(v).__name__)
def test_live_state_still_publishes_what_the_walk_refuses(value: BaseModel) -> None:
    """A value the walk refuses is published by the plain path: a client's copy matches it."""
    sent: list[dict[str, Any]] = []

    class Sink:
        def append(self, *events: dict[str, Any]) -> None:
            sent.extend(events)

    live: LiveState[Any] = LiveState(Sink(), "k", {"start": True})
    seed = live.snapshot()
    copy = json.loads(json.dumps(seed.state))
    live.set(value)
    (delta,) = sent
    copy = apply_delta(copy, delta["payload"]["patch"])
    assert text(copy) == text(plain_form_of(value))


def _client_follows(history: list[Any], *, reuse: bool) -> list[str]:
    """The copies a client holds after each delta, as text, following a LiveState."""
    sent: list[dict[str, Any]] = []

    class Sink:
        def append(self, *events: dict[str, Any]) -> None:
            sent.extend(events)

    with mock.patch.object(live_state, "REUSE_FORMS", reuse):
        live: LiveState[Any] = LiveState(Sink(), "k", history[0])
    copy = json.loads(json.dumps(plain_form_of(history[0])))
    held = []
    for value in history[1:]:
        sent.clear()
        live.set(value)
        for delta in sent:
            copy = apply_delta(copy, delta["payload"]["patch"])
        assert text(copy) == text(plain_form_of(value))
        held.append(text(copy))
    return held


@settings(max_examples=60, deadline=None)
@given(board_histories())
def test_a_client_follows_the_reused_forms_as_it_follows_the_plain_ones(
    history: list[Board],
) -> None:
    """Deltas built from reused forms bring a client's copy to each value, as the plain twin's do."""
    assert _client_follows(history, reuse=True) == _client_follows(history, reuse=False)


def test_a_patch_larger_than_the_value_goes_as_a_replace_with_reused_forms() -> None:
    """The size rule holds without the text: a rewrite of every entry is one root replace."""
    sent: list[dict[str, Any]] = []

    class Sink:
        def append(self, *events: dict[str, Any]) -> None:
            sent.extend(events)

    before = Board(title="t", items={f"old-{i}": Item(name="") for i in range(40)})
    after = Board(title="t", items={f"new-{i}": Item(name="") for i in range(40)})
    live: LiveState[Board] = LiveState(Sink(), "k", before)
    live.set(after)
    (delta,) = sent
    (op,) = delta["payload"]["patch"]
    assert (op["op"], op["path"]) == ("replace", "")
    assert text(op["value"]) == text(plain_form_of(after))


def test_a_small_change_to_a_large_value_is_a_small_patch() -> None:
    """One entry of ten thousand changed: the patch names that entry alone."""
    sent: list[dict[str, Any]] = []

    class Sink:
        def append(self, *events: dict[str, Any]) -> None:
            sent.extend(events)

    entries = {f"e{i}": Item(name=f"entry {i}") for i in range(10_000)}
    live: LiveState[Board] = LiveState(Sink(), "k", Board(title="t", items=entries))
    live.set(Board(title="t", items={**entries, "e7": Item(name="entry 7", count=1)}))
    (delta,) = sent
    assert delta["payload"]["patch"] == [{"op": "replace", "path": "/items/e7/count", "value": 1}]

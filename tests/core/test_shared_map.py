"""SharedMap: an immutable str-keyed mapping whose changed copies share what did not change."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from streamkit import LiveState, SharedMap, apply_delta
from streamkit._json_walk import ABSENT, plain_form_of, step
from streamkit.shared_map import BUCKETS


class Entry(BaseModel):
    name: str
    count: int = 0
    tags: list[str] = Field(default_factory=list)


class Shared(BaseModel):
    entries: SharedMap[str, Entry] = Field(default_factory=SharedMap)


class Plain(BaseModel):
    entries: dict[str, Entry] = Field(default_factory=dict)


def text(form: Any) -> str:
    return json.dumps(form, separators=(",", ":"), sort_keys=True)


keys = st.text(max_size=4)
changes = st.lists(st.tuples(st.sampled_from(["set", "delete"]), keys, st.integers()), max_size=40)


@settings(max_examples=200, deadline=None)
@given(changes)
def test_it_behaves_as_a_dict_and_no_version_ever_changes(ops: list[tuple[str, str, int]]) -> None:
    """Every version equals its dict twin, then and after every later change."""
    current: SharedMap[str, int] = SharedMap()
    twin: dict[str, int] = {}
    versions: list[tuple[SharedMap[str, int], dict[str, int]]] = [(current, {})]
    for op, key, value in ops:
        if op == "set":
            current = current.set(key, value)
            twin[key] = value
        else:
            current = current.delete(key)
            twin.pop(key, None)
        versions.append((current, dict(twin)))
        assert current == twin
        assert len(current) == len(twin)
        assert set(current) == set(twin)
        assert all(current[k] == v and k in current for k, v in twin.items())
        assert dict(current.items()) == twin
        assert sorted(current.values()) == sorted(twin.values())
        assert set(current.keys()) == set(twin)
        assert list(current.items()) == list(current.to_dict().items())
        assert current == SharedMap(dict(reversed(list(twin.items()))))  # any insertion order
    for version, snapshot in versions:
        assert version == snapshot
        assert version.to_dict() == snapshot


def test_a_change_copies_one_bucket_and_shares_the_rest() -> None:
    """One entry of 10,000 changed: every bucket but one is the very same object."""
    big: SharedMap[str, int] = SharedMap({f"t{i}": i for i in range(10_000)})
    changed = big.set("t7", -1)
    shared = sum(a is b for a, b in zip(changed.buckets, big.buckets, strict=True))
    assert shared == BUCKETS - 1
    assert big["t7"] == 7
    assert changed["t7"] == -1
    removed = changed.delete("t8")
    assert sum(a is b for a, b in zip(removed.buckets, changed.buckets, strict=True)) >= (
        BUCKETS - 1
    )
    assert "t8" not in removed
    assert len(removed) == 9_999
    assert big.set("t7", 7) is big  # setting the same object changes nothing
    assert big.delete("absent") is big


def test_equality_needs_the_same_items_and_a_map_is_not_hashable() -> None:
    m: SharedMap[str, int] = SharedMap({"a": 1, "b": 2})
    assert m == {"b": 2, "a": 1}
    assert m != {"a": 1}
    assert m != {"a": 1, "b": 3}
    assert m != SharedMap({"a": 1, "b": 3})
    assert m != [("a", 1), ("b", 2)]
    assert SharedMap() == {}
    with pytest.raises(TypeError):
        hash(m)


def test_only_str_keys() -> None:
    with pytest.raises(TypeError, match="keys are str"):
        SharedMap({1: "a"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="keys are str"):
        SharedMap[str, int]().set(1, 2)  # type: ignore[arg-type]
    m: SharedMap[str, int] = SharedMap({"a": 1})
    assert m.get(1, "none") == "none"  # type: ignore[call-overload]
    assert 1 not in m
    with pytest.raises(KeyError):
        m[1]  # type: ignore[index]


def test_its_order_is_the_same_in_every_process() -> None:
    """The order is a checksum's, not str's per-process hash: the same under any seed."""
    code = "from streamkit import SharedMap;print(list(SharedMap({f'k{i}': i for i in range(50)})))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(seen) == 1


def test_as_a_pydantic_field_it_is_a_json_object() -> None:
    """It validates from JSON or a dict, and writes what dict[str, Model] writes."""
    raw = {"b": {"name": "B", "count": 2}, "a": {"name": "A"}}
    shared = Shared.model_validate({"entries": raw})
    plain = Plain.model_validate({"entries": raw})
    assert isinstance(shared.entries, SharedMap)
    assert shared.entries == plain.entries
    assert json.loads(shared.model_dump_json()) == json.loads(plain.model_dump_json())
    compact = json.loads(shared.model_dump_json(exclude_defaults=True))
    assert compact == json.loads(plain.model_dump_json(exclude_defaults=True))
    assert compact == {"entries": {"a": {"name": "A"}, "b": {"name": "B", "count": 2}}}
    assert shared.model_dump() == plain.model_dump()
    again = Shared.model_validate_json(shared.model_dump_json())
    assert again.entries == shared.entries
    assert Shared.model_validate({"entries": shared.entries}).entries is shared.entries
    assert Shared.model_json_schema()["properties"]["entries"]["type"] == "object"
    with pytest.raises(ValueError, match="name"):
        Shared.model_validate({"entries": {"x": {"count": 1}}})
    assert pickle.loads(pickle.dumps(shared.entries)) == shared.entries


@st.composite
def histories(draw: st.DrawFn) -> list[Shared]:
    """States in a row, each a set or delete away from the one before, some kept as they were."""
    entries: SharedMap[str, Entry] = SharedMap()
    pool = draw(st.lists(st.builds(Entry, name=keys, count=st.integers()), min_size=1))
    out = []
    for _ in range(draw(st.integers(1, 8))):
        for _ in range(draw(st.integers(0, 4))):
            key = draw(keys)
            if draw(st.booleans()):
                entries = entries.set(key, draw(st.sampled_from(pool)))
            else:
                entries = entries.delete(key)
        out.append(Shared(entries=entries))
    return out


@settings(max_examples=150, deadline=None)
@given(histories())
def test_the_live_state_walk_gives_pydantic_s_json_and_ops_that_reach_it(
    history: list[Shared],
) -> None:
    previous: Any = ABSENT
    form: Any = ABSENT
    for state in history:
        walked = step(state, previous, form)
        assert text(walked.form) == text(plain_form_of(state))
        if form is not ABSENT:
            assert text(apply_delta(plain_form_of(previous), walked.ops)) == text(walked.form)
        previous, form = state, walked.form


def test_a_watched_change_of_one_entry_in_ten_thousand_is_one_op() -> None:
    sent: list[dict[str, Any]] = []

    class Sink:
        def append(self, *events: dict[str, Any]) -> None:
            sent.extend(events)

    entries: SharedMap[str, Entry] = SharedMap(
        {f"e{i}": Entry(name=f"entry {i}") for i in range(10_000)}
    )
    live: LiveState[Shared] = LiveState(Sink(), "k", Shared(entries=entries))
    live.set(Shared(entries=entries.set("e7", Entry(name="entry 7", count=1))))
    live.set(Shared(entries=entries.delete("e8")))
    first, second = sent
    assert first["payload"]["patch"] == [{"op": "replace", "path": "/entries/e7/count", "value": 1}]
    ops = second["payload"]["patch"]
    assert {"op": "remove", "path": "/entries/e8"} in ops
    assert len(ops) == 2  # e7 back as it was, e8 gone


def test_the_walk_keeps_the_forms_of_the_buckets_that_did_not_change() -> None:
    """Walked, not serialized: an unchanged entry keeps its very form object."""
    entries: SharedMap[str, Entry] = SharedMap({f"e{i}": Entry(name=str(i)) for i in range(500)})
    first = Shared(entries=entries)
    before = step(first, ABSENT, ABSENT).form
    walked = step(Shared(entries=entries.set("e3", Entry(name="new"))), first, before)
    assert walked.ops == [{"op": "replace", "path": "/entries/e3/name", "value": "new"}]
    assert all(
        walked.form["entries"][k] is before["entries"][k] for k in before["entries"] if k != "e3"
    )

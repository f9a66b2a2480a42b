"""Tests for streamkit._json_diff: correct, strict, compact RFC 6902 patches."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamkit import LiveState, apply_delta, diff_json
from streamkit._json_diff import diff


def canonical(value: Any) -> str:
    """The JSON text, keys sorted: tells true from 1, 1 from 1.0 and -0.0 from 0.0."""
    return json.dumps(value, sort_keys=True)


def fresh(value: Any) -> Any:
    return json.loads(json.dumps(value))


def applied(a: Any, patch: list[dict[str, Any]]) -> Any:
    return jsonpatch.apply_patch(fresh(a), patch, in_place=False)


keys = st.sampled_from(
    ["", "/", "~", "~0", "~1", "a/b", "~/", "/~", "0", "-", "é", "中"]
) | st.text(max_size=4)
scalars = (
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, -1, 0.0, -0.0, 1.0])
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(keys, children, max_size=5),
    max_leaves=30,
)


def _new_leaf(draw: st.DrawFn, old: Any) -> Any:
    """A leaf Python may call equal to ``old`` (bool <-> 0/1, int <-> float, -0.0) or any other."""
    near: list[Any] = [None]
    if isinstance(old, bool):
        near += [int(old), float(old), not old]
    elif isinstance(old, int):
        near += [float(old), old == 1, old + 1]
    elif isinstance(old, float):
        near += [-old, int(old) if old.is_integer() and abs(old) < 2**60 else 0, old == 1.0]
    elif isinstance(old, str):
        near += [old + "x", old[:-1]]
    return draw(st.sampled_from(near) | json_values)


def _edit(draw: st.DrawFn, value: Any) -> Any:
    """One small edit somewhere inside ``value`` (mutated in place where it is a container)."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        value[key] = _edit(draw, value[key])
        return value
    if isinstance(value, list) and value and draw(st.booleans()):
        index = draw(st.integers(0, len(value) - 1))
        value[index] = _edit(draw, value[index])
        return value
    if isinstance(value, dict):
        action = draw(st.sampled_from(["add", "remove", "replace"]))
        if action == "add" or not value:
            value[draw(keys)] = draw(json_values)
        elif action == "remove":
            del value[draw(st.sampled_from(sorted(value)))]
        else:
            return draw(json_values)
        return value
    if isinstance(value, list):
        action = draw(
            st.sampled_from(["insert", "remove", "pop-front-push-back", "push-front-pop-back"])
        )
        where = draw(st.sampled_from(["front", "middle", "end"]))
        at = {"front": 0, "middle": len(value) // 2, "end": len(value)}[where]
        count = draw(st.integers(1, 3))
        if action == "insert" or not value:
            value[at:at] = draw(st.lists(json_values, min_size=count, max_size=count))
        elif action == "remove":
            at = min(at, len(value) - 1)
            del value[at : at + count]
        elif action == "pop-front-push-back":
            del value[:count]
            value.extend(draw(st.lists(json_values, min_size=count, max_size=count)))
        else:
            del value[len(value) - count :]
            value[:0] = draw(st.lists(json_values, min_size=count, max_size=count))
        return value
    return _new_leaf(draw, value)


@st.composite
def edited_pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    """A value and a copy of it after a few small edits: the pairs diffs mostly see."""
    a = draw(json_values)
    b = fresh(a)
    for _ in range(draw(st.integers(1, 4))):
        b = _edit(draw, b)
    return a, b


def check(a: Any, b: Any) -> list[dict[str, Any]]:
    """Diff a to b and assert the patch is correct, strict, and leaves both untouched."""
    a_text, b_text = canonical(a), canonical(b)
    patch = diff(a, b)
    assert canonical(applied(a, patch)) == b_text
    assert canonical(a) == a_text
    assert canonical(b) == b_text
    if a_text == b_text:
        assert patch == []
    return patch


@settings(max_examples=150, deadline=None)
@given(a=json_values, b=json_values)
def test_patch_turns_any_value_into_any_other(a: Any, b: Any) -> None:
    """For arbitrary JSON values, applying diff(a, b) to a gives b, exactly as JSON."""
    check(a, b)


@settings(max_examples=200, deadline=None)
@given(pair=edited_pairs())
def test_patch_turns_a_value_into_its_edit(pair: tuple[Any, Any]) -> None:
    """For b a small edit of a (shared structure, near-equal leaves), diff(a, b) gives b exactly."""
    check(*pair)


@settings(max_examples=50, deadline=None)
@given(pair=edited_pairs())
def test_patch_values_share_nothing_with_the_inputs(pair: tuple[Any, Any]) -> None:
    """Mutating every container a patch carries changes neither a nor b."""
    a, b = pair
    a_text, b_text = canonical(a), canonical(b)
    for op in diff(a, b):
        value = op.get("value")
        if isinstance(value, dict):
            value.clear()
            value["poison"] = True
        elif isinstance(value, list):
            value.append("poison")
    assert (canonical(a), canonical(b)) == (a_text, b_text)


def test_equal_values_give_no_ops() -> None:
    value = {"a": [1, 2.5, {"b": None, "c": "x"}], "d": True, "": {}}
    assert diff(value, fresh(value)) == []
    assert diff(value, value) == []
    assert diff(3, 3) == []
    assert diff([], []) == []


@pytest.mark.parametrize(
    ("before", "after"),
    [(True, 1), (1, True), (False, 0), (0, False), (True, 1.0), (0.0, False)],
)
def test_bool_and_number_are_different_values(before: Any, after: Any) -> None:
    """Python calls them equal; JSON does not, so a nested change is a replace."""
    a = {"same": [1, {"k": "v"}], "deep": {"x": [before, 2]}, "other": "z"}
    b = {"same": [1, {"k": "v"}], "deep": {"x": [after, 2]}, "other": "z"}
    assert a == b  # the trap
    patch = diff(a, b)
    assert patch == [{"op": "replace", "path": "/deep/x/0", "value": after}]
    assert type(patch[0]["value"]) is type(after)
    assert canonical(applied(a, patch)) == canonical(b)


def test_int_and_float_of_equal_value_differ() -> None:
    """1 and 1.0 are written differently, so the change is a replace (and so is -0.0 vs 0.0)."""
    assert diff({"n": 1}, {"n": 1.0}) == [{"op": "replace", "path": "/n", "value": 1.0}]
    assert diff({"n": 1.0}, {"n": 1}) == [{"op": "replace", "path": "/n", "value": 1}]
    assert diff([0.0], [-0.0]) == [{"op": "replace", "path": "/0", "value": -0.0}]
    assert diff(-0.0, 0.0) == [{"op": "replace", "path": "", "value": 0.0}]
    assert diff([1.5, -0.0], [1.5, -0.0]) == []


def test_front_pop_is_one_remove() -> None:
    """A queue losing its head is one remove at /0, not a replace per item."""
    a = [{"id": i, "state": "due"} for i in range(100)]
    assert diff({"q": a}, {"q": a[1:]}) == [{"op": "remove", "path": "/q/0"}]
    assert diff(a, a[3:]) == [{"op": "remove", "path": f"/{i}"} for i in (2, 1, 0)]


def test_front_insert_is_adds_at_the_front() -> None:
    a = [{"id": i} for i in range(50)]
    assert diff(a, [{"id": -1}, *a]) == [{"op": "add", "path": "/0", "value": {"id": -1}}]


def test_append_is_one_add() -> None:
    a = [{"id": i} for i in range(100)]
    assert diff(a, [*a, {"id": 100}]) == [{"op": "add", "path": "/100", "value": {"id": 100}}]


def test_tail_removal_goes_highest_index_first() -> None:
    assert diff([1, 2, 3, 4, 5], [1, 2]) == [
        {"op": "remove", "path": "/4"},
        {"op": "remove", "path": "/3"},
        {"op": "remove", "path": "/2"},
    ]


def test_bounded_queue_shift_is_a_remove_and_an_add() -> None:
    """Drop the head, push a new tail (a bounded recent-items list): two ops, not one per item."""
    a = [{"id": i} for i in range(50)]
    b = [*a[1:], {"id": 50}]
    assert diff(a, b) == [
        {"op": "remove", "path": "/0"},
        {"op": "add", "path": "/49", "value": {"id": 50}},
    ]
    b = [{"id": -1}, *a[:-1]]
    assert diff(a, b) == [
        {"op": "add", "path": "/0", "value": {"id": -1}},
        {"op": "remove", "path": "/50"},
    ]


def test_shifted_items_are_still_diffed_strictly() -> None:
    """An alignment chosen by Python equality still catches true vs 1 inside aligned items."""
    a = [{"v": 0}, {"v": 1}, {"v": 2}]
    b = [{"v": True}, {"v": 2}, {"v": 3}]
    assert canonical(applied(a, diff(a, b))) == canonical(b)
    assert diff(a, b) == [
        {"op": "remove", "path": "/0"},
        {"op": "add", "path": "/2", "value": {"v": 3}},
        {"op": "replace", "path": "/0/v", "value": True},
    ]


def test_middle_insert_and_remove() -> None:
    a = list(range(10))
    assert diff(a, [*a[:5], "x", "y", *a[5:]]) == [
        {"op": "add", "path": "/5", "value": "x"},
        {"op": "add", "path": "/6", "value": "y"},
    ]
    assert diff(a, a[:4] + a[6:]) == [
        {"op": "remove", "path": "/5"},
        {"op": "remove", "path": "/4"},
    ]


def test_dict_keys_added_removed_and_recursed() -> None:
    a = {"keep": {"n": 1, "gone": 2}, "old": [1]}
    b = {"keep": {"n": 2, "new": [3]}, "fresh": None}
    patch = diff(a, b)
    assert sorted(patch, key=lambda op: op["path"]) == [
        {"op": "add", "path": "/fresh", "value": None},
        {"op": "remove", "path": "/keep/gone"},
        {"op": "replace", "path": "/keep/n", "value": 2},
        {"op": "add", "path": "/keep/new", "value": [3]},
        {"op": "remove", "path": "/old"},
    ]
    assert applied(a, patch) == b


def test_keys_are_escaped_per_rfc_6901() -> None:
    assert diff({}, {"a/b~c": 1}) == [{"op": "add", "path": "/a~1b~0c", "value": 1}]
    assert diff({"~1": {"/": 0}}, {"~1": {"/": 1}}) == [
        {"op": "replace", "path": "/~01/~1", "value": 1}
    ]
    assert diff({"": 1}, {"": 2}) == [{"op": "replace", "path": "/", "value": 2}]
    assert applied({"": 1}, diff({"": 1}, {"": 2})) == {"": 2}


@pytest.mark.parametrize(
    ("a", "b"),
    [({"a": 1}, [1]), ([1], {"0": 1}), ({}, None), ("x", ["x"]), (1, "1"), (None, False)],
)
def test_root_type_change_is_one_replace(a: Any, b: Any) -> None:
    assert diff(a, b) == [{"op": "replace", "path": "", "value": b}]


def test_nested_type_change_is_a_replace_at_that_path() -> None:
    assert diff({"x": {"y": [1]}}, {"x": {"y": {"0": 1}}}) == [
        {"op": "replace", "path": "/x/y", "value": {"0": 1}}
    ]


def test_patch_values_do_not_alias_the_inputs() -> None:
    a = {"items": [{"id": 1, "tags": ["t"]}], "meta": {"n": 1}}
    b = {"items": [{"id": 1, "tags": ["t"]}, {"id": 2, "tags": ["u"]}], "meta": {"n": [1, 2]}}
    b_text = canonical(b)
    patch = diff(a, b)
    assert patch == [
        {"op": "add", "path": "/items/1", "value": {"id": 2, "tags": ["u"]}},
        {"op": "replace", "path": "/meta/n", "value": [1, 2]},
    ]
    patch[0]["value"]["tags"].append("mutated")
    patch[1]["value"].append(3)
    assert canonical(b) == b_text
    # A root replace copies too, so the patch cannot reach into a later value either.
    root = diff(a, [a])
    root[0]["value"][0]["items"].clear()
    assert a["items"] == [{"id": 1, "tags": ["t"]}]


def test_live_state_sends_diff_patches() -> None:
    """LiveState's deltas come from diff and replay on the seed, strictly."""

    class Sink:
        def __init__(self) -> None:
            self.patches: list[Any] = []

        def append(self, *events: Any) -> None:
            self.patches.extend(event["payload"]["patch"] for event in events)

    sink = Sink()
    queue = [{"id": i, "state": "due"} for i in range(20)]
    live = LiveState(sink, "k", {"queue": queue, "flag": 1}, epoch=1)
    live.set({"queue": queue[1:], "flag": True})
    assert sink.patches == [
        [
            {"op": "remove", "path": "/queue/0"},
            {"op": "replace", "path": "/flag", "value": True},
        ]
    ]
    client = apply_delta({"queue": queue, "flag": 1}, sink.patches[0])
    assert canonical(client) == canonical({"queue": queue[1:], "flag": True})


def test_live_state_exploding_diff_is_sent_as_a_reseed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A diff that raises costs the patch (sent as None), never the caller or the value."""
    import streamkit.live_state as module

    def explode(*args: object) -> object:
        raise RecursionError("too deep")

    payloads: list[Any] = []

    class Sink:
        def append(self, *events: Any) -> None:
            payloads.extend(event["payload"] for event in events)

    live = LiveState(Sink(), "k", {"a": 1}, epoch=1)
    monkeypatch.setattr(module, "diff", explode)
    live.set({"a": 2})
    monkeypatch.undo()
    assert live.get() == {"a": 2}
    assert [p["patch"] for p in payloads] == [None]


# -- moves, rotations, and the size rule ------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([1, 2, 3], [3, 1, 2]),
        ([1, 2, 3], [2, 3, 1]),
        (list(range(1000)), [999, *range(999)]),
        (list(range(1000)), [500, *range(500), *range(501, 1000)]),
        (list(range(1000)), [*range(10), *range(11, 1000), 10]),
        (
            [{"id": i, "v": [i]} for i in range(50)],
            [{"id": 49, "v": [49]}] + [{"id": i, "v": [i]} for i in range(49)],
        ),
    ],
)
def test_moving_one_item_is_one_move_op(a: list[Any], b: list[Any]) -> None:
    """One item moved to the front or back (of the changed span) costs one move, any length."""
    patch = check(a, b)
    assert len(patch) == 1
    assert patch[0]["op"] == "move"


def test_a_moved_item_that_is_only_python_equal_is_still_diffed_strictly() -> None:
    """Python's 1 == True chose the move; the moved pairs are then compared as JSON."""
    a = [True, 2, 3, 1]
    b = [1, True, 2, 3]
    check(a, b)
    check([1.0, "x", "y", 1], [1, 1.0, "x", "y"])


@st.composite
def rotated_pairs(draw: st.DrawFn) -> tuple[list[Any], list[Any]]:
    """A list and the same list with one item moved somewhere else, or rotated by a few."""
    a = draw(st.lists(json_values, min_size=2, max_size=30))
    b = fresh(a)
    if draw(st.booleans()):
        item = b.pop(draw(st.integers(0, len(b) - 1)))
        b.insert(draw(st.integers(0, len(b))), item)
    else:
        k = draw(st.integers(1, len(b) - 1))
        b = b[k:] + b[:k]
    return a, b


@settings(max_examples=200, deadline=None)
@given(pair=rotated_pairs())
def test_moves_and_rotations_round_trip(pair: tuple[list[Any], list[Any]]) -> None:
    """A list with an item moved or rotated: the patch turns a into b exactly."""
    check(*pair)


@settings(max_examples=200, deadline=None)
@given(a=json_values, b=json_values)
def test_diff_json_is_never_larger_than_a_replace(a: Any, b: Any) -> None:
    """diff_json's patch applies exactly and is never larger than replacing the whole value."""
    patch = diff_json(a, b)
    assert canonical(applied(a, patch)) == canonical(b)
    replace = [{"op": "replace", "path": "", "value": b}]
    compact = (",", ":")
    assert len(json.dumps(patch, separators=compact)) <= len(
        json.dumps(replace, separators=compact)
    )


def test_a_patch_larger_than_the_value_is_sent_as_a_replace() -> None:
    """Rewriting every item of a list gives one replace, not an op per item."""
    a = [{"n": i} for i in range(200)]
    b = [{"m": i} for i in range(200)]
    assert diff_json(a, b) == [{"op": "replace", "path": "", "value": b}]
    assert len(diff(a, b)) > 1  # the raw differ's patch, which the rule replaces

"""The body hash a key keeps once its event's row is gone: equal exactly when the bodies are.

A retry is judged by this hash after retention removed the row, so it must
agree with how a retry is judged while the row is there (``same_body``:
type, and payload and metadata compared as JSON values): the order of an
object's keys, whitespace and an integral float written as an int do not
change it; any other difference does.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from streamkit.backends._keys import body_sha256

_scalars = st.none() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_objects = st.dictionaries(st.text(max_size=6), _json, max_size=5)


def _reordered(value: Any) -> Any:
    """The same JSON value with every object's keys in reverse order and ints as floats."""
    if isinstance(value, dict):
        return {key: _reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


@given(_objects, _objects)
def test_a_body_written_another_way_hashes_alike(
    payload: dict[str, Any], metadata: dict[str, Any]
) -> None:
    plain = body_sha256("t", json.dumps(payload), json.dumps(metadata))
    other = body_sha256(
        "t", json.dumps(_reordered(payload), indent=1), json.dumps(_reordered(metadata))
    )
    assert plain == other


@given(_objects, _objects)
def test_different_bodies_hash_differently(a: dict[str, Any], b: dict[str, Any]) -> None:
    same = body_sha256("t", json.dumps(a), "{}") == body_sha256("t", json.dumps(b), "{}")
    assert same == (a == b)


def test_type_payload_and_metadata_each_count() -> None:
    base = body_sha256("paid", '{"amount": 12.0}', '{"by": "web"}')
    assert base == body_sha256("paid", '{"amount": 12}', '{"by":"web"}')
    assert base != body_sha256("refunded", '{"amount": 12}', '{"by": "web"}')
    assert base != body_sha256("paid", '{"amount": 12.5}', '{"by": "web"}')
    assert base != body_sha256("paid", '{"amount": 12}', '{"by": "cli"}')
    assert base != body_sha256("paid", '{"amount": "12"}', '{"by": "web"}')

"""The next JSON form of a pydantic value and its patch, walking only what changed.

A *form* is what ``json.loads(model.model_dump_json())`` returns. Given the
previous value and its form, :func:`step` builds the form of the next value
and the RFC 6902 ops that turn the previous form into it, side by side with
the previous value: a part that is the very object it was (same field, same
dict key, same list item) keeps its form, the same Python object, and costs
no op. A dict of 10,000 models in which one changed costs one pass at C speed
over its values and the walk of that one model, where serializing, parsing and
diffing the whole form would visit every entry.

This is the fast twin of the plain path (serialize, parse, diff): a hypothesis
test pins that both give equal forms (as JSON: a kept dict keeps its key
order, where pydantic would follow the new dict's) and patches that bring the
previous form to the same value. The walk copies pydantic's rules only where
they are simple, and gives up (:class:`Unplanned`) everywhere else, so the
caller takes the plain path:

- a model class qualifies when it has no serializers of its own, no computed
  fields, no extra fields, no ``serialize_by_alias`` and no ``ser_json_inf_nan``
  setting, and every field's type is ``str``, ``int``, ``float``, ``bool``,
  ``None``, a ``Literal`` of those, a qualifying model, ``list[X]``,
  ``dict[str, X]``, ``SharedMap[str, X]`` (walked bucket by bucket) or
  ``X | None`` of these (constraints such as ``ge`` are
  allowed: they do not change the JSON);
- at run time each value the walk builds must have exactly the declared type
  (a subclass of the declared model, an ``int`` in a ``float`` field, an
  ``Enum`` in a ``str`` field: pydantic would convert them);
- a float that is NaN or infinite becomes ``null``, as ``model_dump_json``
  writes it.

Sameness by identity holds because a value handed on is never mutated in place
(the reduce contract: "never mutate its arguments"): a part changed in place
would keep its old form.
"""

from __future__ import annotations

import json
import math
import operator
import types
import typing
from collections.abc import Callable
from itertools import repeat
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, RootModel

from streamkit._json_diff import Op, copy_form, diff_under, pointer_token
from streamkit.shared_map import SharedMap

__all__ = ["ABSENT", "Step", "Unplanned", "fresh_form", "plain_form_of", "step"]


class Unplanned(Exception):
    """The value holds something the walk does not copy pydantic for; take the plain path."""


class Step(NamedTuple):
    """The next form, the ops from the previous form to it, and a floor on its JSON size.

    ``floor`` never exceeds the length of the form's compact JSON: it counts
    the punctuation of the containers the walk met (4 characters per dict
    entry beside its key, 1 per list item), so a large value shows it is
    larger than a small patch without being measured.
    """

    form: Any
    ops: list[Op]
    floor: int


_ABSENT: Any = object()  # no previous value at this place

ABSENT: Any = _ABSENT
"""What :func:`step` takes for "no previous value" (its form is built with no ops)."""


class _Walk:
    """The ops and the size floor gathered by one step."""

    __slots__ = ("floor", "ops")

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.floor = 0


# A plan turns a value declared with one type into its form, side by side with
# the value and form that were at the same place before (``_ABSENT`` if none),
# appending the ops between the two forms at ``pointer``.
_Plan = Callable[[Any, Any, Any, str, _Walk], Any]

_PLANS: dict[type[BaseModel], tuple[tuple[str, str, _Plan], ...] | None] = {}


def step(value: BaseModel, previous: Any, previous_form: Any) -> Step:
    """The form of ``value`` and the ops from ``previous_form`` (the form of ``previous``).

    Raises :class:`Unplanned` for a value the walk does not handle.
    """
    if not isinstance(value, BaseModel):
        raise Unplanned
    walk = _Walk()
    form = _model(type(value))(value, previous, previous_form, "", walk)
    return Step(form, walk.ops, walk.floor)


def fresh_form(value: BaseModel) -> Any:
    """The form of ``value`` with no previous one; raises :class:`Unplanned` as :func:`step`."""
    return step(value, _ABSENT, _ABSENT).form


def plain_form_of(value: BaseModel) -> Any:
    """The plain twin: the form as pydantic writes it, parsed back."""
    return json.loads(value.model_dump_json())


# -- plans ----------------------------------------------------------------------------------


def _model_plan(cls: type[BaseModel]) -> tuple[tuple[str, str, _Plan], ...] | None:
    """The fields of ``cls`` (name, pointer token, plan), or None if ``cls`` does not qualify."""
    try:
        return _PLANS[cls]
    except KeyError:
        pass
    _PLANS[cls] = None  # a recursive reference met while planning does not qualify
    plan = _make_model_plan(cls)
    _PLANS[cls] = plan
    return plan


def _make_model_plan(cls: type[BaseModel]) -> tuple[tuple[str, str, _Plan], ...] | None:
    if issubclass(cls, RootModel):
        return None
    decorators = cls.__pydantic_decorators__
    if decorators.field_serializers or decorators.model_serializers or cls.model_computed_fields:
        return None
    config = cls.model_config
    if (
        config.get("extra") == "allow"
        or config.get("serialize_by_alias")
        or config.get("ser_json_inf_nan", "null") != "null"
        or config.get("json_encoders")
    ):
        return None
    fields: list[tuple[str, str, _Plan]] = []
    for name, info in cls.model_fields.items():
        if info.exclude:
            continue
        if getattr(info, "exclude_if", None) is not None:
            return None
        if not all(isinstance(m, annotated_types.BaseMetadata) for m in info.metadata):
            return None  # a serializer, or something else that may change the JSON
        plan = _type_plan(info.annotation)
        if plan is None:
            return None
        fields.append((name, pointer_token(name), plan))
    return tuple(fields)


def _type_plan(annotation: Any) -> _Plan | None:
    if annotation is str or annotation is int or annotation is bool:
        return _scalar(annotation)
    if annotation is float:
        return _float
    if annotation is None or annotation is type(None):
        return _none
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return None if _model_plan(annotation) is None else _model(annotation)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        if not {type(arg) for arg in args} <= {str, int, bool, type(None)}:
            return None
        return _literal(frozenset((type(arg), arg) for arg in args))
    if origin is list and len(args) == 1:
        item = _type_plan(args[0])
        return None if item is None else _list(item)
    if origin is dict and len(args) == 2 and args[0] is str:
        item = _type_plan(args[1])
        return None if item is None else _mapping(item, dict)
    if origin is SharedMap and len(args) == 2 and args[0] is str:
        item = _type_plan(args[1])
        return None if item is None else _mapping(item, SharedMap)
    if (origin is Union or origin is types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _type_plan(next(arg for arg in args if arg is not type(None)))
        return None if inner is None else _optional(inner)
    if origin is typing.Annotated:
        return None
    return None  # a true union (pydantic picks a member by its own rules), or another type


# -- leaves ---------------------------------------------------------------------------------


def _leaf(form: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
    """A scalar's form, with a replace op unless the previous form is the same JSON value."""
    if previous_form is not _ABSENT and not _same_scalar(previous_form, form):
        walk.ops.append({"op": "replace", "path": pointer, "value": copy_form(form)})
    return form


def _same_scalar(a: Any, b: Any) -> bool:
    """Strict JSON equality of two scalars: true is not 1, 1 is not 1.0, 0.0 is not -0.0."""
    t = type(a)
    if t is not type(b) or a != b:
        return False
    return t is not float or a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b)


def _scalar(kind: type) -> _Plan:
    def form(value: Any, previous: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
        if type(value) is not kind:
            raise Unplanned
        return _leaf(value, previous_form, pointer, walk)

    return form


def _float(value: Any, previous: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
    if type(value) is not float:
        raise Unplanned
    return _leaf(value if math.isfinite(value) else None, previous_form, pointer, walk)


def _none(value: Any, previous: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
    if value is not None:
        raise Unplanned
    return _leaf(None, previous_form, pointer, walk)


def _literal(allowed: frozenset[tuple[type, Any]]) -> _Plan:
    def form(value: Any, previous: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
        if (type(value), value) not in allowed:
            raise Unplanned
        return _leaf(value, previous_form, pointer, walk)

    return form


def _optional(inner: _Plan) -> _Plan:
    def form(value: Any, previous: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
        if value is None:
            return _leaf(None, previous_form, pointer, walk)
        if previous is None or previous_form is None:
            # From null to a value: nothing to walk beside, so the whole value replaces it.
            built = inner(value, _ABSENT, _ABSENT, pointer, walk)
            return _leaf(built, previous_form, pointer, walk)
        return inner(value, previous, previous_form, pointer, walk)

    return form


# -- containers ----------------------------------------------------------------------------


def _replaced(built: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
    """``built`` (a fresh container) in place of a previous form it was not walked beside."""
    if previous_form is not _ABSENT:
        walk.ops.append({"op": "replace", "path": pointer, "value": copy_form(built)})
    return built


def _model(cls: type[BaseModel]) -> _Plan:
    def form(value: Any, previous: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
        if value is previous and previous_form is not _ABSENT:
            return previous_form
        if type(value) is not cls:
            raise Unplanned
        plan = _model_plan(cls)
        if plan is None or value.__pydantic_extra__:
            raise Unplanned
        fields = value.__dict__
        walk.floor += 4 * len(plan)
        try:
            if type(previous) is cls and type(previous_form) is dict:
                before = previous.__dict__
                return {
                    name: field(
                        fields[name], before[name], previous_form[name], f"{pointer}/{token}", walk
                    )
                    for name, token, field in plan
                }
            built = {
                name: field(fields[name], _ABSENT, _ABSENT, "", walk) for name, _, field in plan
            }
        except KeyError:
            raise Unplanned from None  # a field missing (model_construct) here or before
        return _replaced(built, previous_form, pointer, walk)

    return form


def _mapping(item: _Plan, kind: type[dict[Any, Any]] | type[SharedMap[Any, Any]]) -> _Plan:
    """A ``dict[str, X]`` or a ``SharedMap[str, X]``: a JSON object either way."""
    beside: Callable[..., dict[str, Any]] = _dict_beside if kind is dict else _shared_beside

    def form(value: Any, previous: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
        if value is previous and previous_form is not _ABSENT:
            walk.floor += 4 * len(previous_form)
            return previous_form
        if type(value) is not kind:
            raise Unplanned
        walk.floor += 4 * len(value)
        if type(previous) is not kind or type(previous_form) is not dict:
            if value and set(map(type, value)) != {str}:
                raise Unplanned
            built = {key: item(v, _ABSENT, _ABSENT, "", walk) for key, v in value.items()}
            return _replaced(built, previous_form, pointer, walk)
        return beside(item, value, previous, previous_form, pointer, walk)

    return form


def _dict_beside(
    item: _Plan,
    value: dict[Any, Any],
    previous: dict[Any, Any],
    previous_form: dict[str, Any],
    pointer: str,
    walk: _Walk,
) -> dict[str, Any]:
    """The next form of a dict walked beside the previous one: a copy, edited where it changed.

    Which entries changed is found at C speed (an identity test per key);
    only those are walked. A key the previous dict held keeps its form's
    place; a new key goes last, as in a patched copy.
    """
    changed = _changed(value, previous)
    if changed is None:
        return previous_form  # the same entries: an equal dict, rebuilt
    form = previous_form.copy()
    _edit(item, value, previous, changed, form, previous_form, pointer, walk)
    return form


def _changed(value: dict[Any, Any], previous: dict[Any, Any]) -> list[bool] | None:
    """Per key of ``value``, whether its entry is not the previous one; None if none changed."""
    get = previous.get
    changed = list(map(operator.is_not, value.values(), map(get, value, repeat(_ABSENT))))
    if len(value) == len(previous) and True not in changed:
        return None
    return changed


def _edit(
    item: _Plan,
    value: dict[Any, Any],
    previous: dict[Any, Any],
    changed: list[bool],
    form: dict[str, Any],
    previous_form: dict[str, Any],
    pointer: str,
    walk: _Walk,
) -> None:
    """Edit ``form`` (a copy of the previous form) where ``value`` differs from ``previous``."""
    get = previous.get
    count = changed.count(True)
    added = 0
    if count:
        keys = list(value)
        at = 0
        for _ in range(count):
            at = changed.index(True, at)
            key = keys[at]
            at += 1
            before = get(key, _ABSENT)
            if before is _ABSENT:
                if type(key) is not str:
                    raise Unplanned
                added += 1
                built = item(value[key], _ABSENT, _ABSENT, "", walk)
                form[key] = built
                walk.ops.append(
                    {
                        "op": "add",
                        "path": f"{pointer}/{pointer_token(key)}",
                        "value": copy_form(built),
                    }
                )
                continue
            try:
                before_form = previous_form[key]
            except KeyError:
                raise Unplanned from None  # a key pydantic wrote otherwise (not a str)
            form[key] = item(
                value[key], before, before_form, f"{pointer}/{pointer_token(key)}", walk
            )
    if len(previous) != len(value) - added:
        for key in previous.keys() - value.keys():
            try:
                del form[key]
            except KeyError:
                raise Unplanned from None
            walk.ops.append({"op": "remove", "path": f"{pointer}/{pointer_token(key)}"})


def _shared_beside(
    item: _Plan,
    value: SharedMap[Any, Any],
    previous: SharedMap[Any, Any],
    previous_form: dict[str, Any],
    pointer: str,
    walk: _Walk,
) -> dict[str, Any]:
    """As :func:`_dict_beside`, bucket by bucket: a bucket that is the same object is skipped."""
    edited: dict[str, Any] | None = None
    for bucket, before in zip(value.buckets, previous.buckets, strict=True):
        if bucket is before:
            continue
        changed = _changed(bucket, before)
        if changed is None:
            continue
        if edited is None:
            edited = previous_form.copy()
        _edit(item, bucket, before, changed, edited, previous_form, pointer, walk)
    return previous_form if edited is None else edited


def _list(item: _Plan) -> _Plan:
    def form(value: Any, previous: Any, previous_form: Any, pointer: str, walk: _Walk) -> Any:
        if value is previous and previous_form is not _ABSENT:
            walk.floor += len(previous_form)
            return previous_form
        if type(value) is not list:
            raise Unplanned
        walk.floor += len(value)
        if (
            type(previous) is not list
            or type(previous_form) is not list
            or len(previous) != len(previous_form)
        ):
            built = [item(v, _ABSENT, _ABSENT, "", walk) for v in value]
            return _replaced(built, previous_form, pointer, walk)
        # Items kept (the same objects, wherever they moved) keep their forms; the
        # list's ops come from the differ, which aligns moves and shifts.
        kept = dict(zip(map(id, previous), previous_form, strict=True))
        built = []
        for v in value:
            known = kept.get(id(v), _ABSENT)
            built.append(item(v, _ABSENT, _ABSENT, "", walk) if known is _ABSENT else known)
        diff_under(previous_form, built, pointer, walk.ops)
        return built

    return form

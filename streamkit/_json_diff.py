"""A fast RFC 6902 differ for JSON values (what ``json.loads`` returns).

:func:`diff` returns a correct patch: applied to ``a`` with any RFC 6902 applier
it gives exactly ``b``, under strict JSON equality (``true`` is not ``1``, ``1``
is not ``1.0``, ``-0.0`` is not ``0.0``). Values placed in the patch are fresh
copies that share no mutable object with ``a`` or ``b``. The cost is
proportional to the parts walked: each common dict key and each list item is
visited a bounded number of times (a few C-level equality checks to choose a
list alignment, then one strict walk), and a pointer is built only where an op
or a nested container needs it.

Lists are aligned by trimming the common prefix and suffix, then by spotting
one item moved to the other end of what is left (one ``move`` op), then a
shift (items dropped from the front and appended at the end, as a bounded queue
does, or the reverse), so common edits cost a few ops rather than one per item.

:func:`diff_json` (public as ``streamkit.diff_json``) adds the size rule: a
patch is never larger than a ``replace`` of the whole value.
"""

from __future__ import annotations

import json
from math import copysign
from typing import Any

__all__ = [
    "REPLACE_OVERHEAD",
    "copy_form",
    "diff",
    "diff_json",
    "diff_under",
    "no_larger_than_replace",
    "pointer_token",
]

_CONTAINERS = frozenset((dict, list))


def _alike(x: float, y: float) -> bool:
    """Two equal floats are the same JSON value unless they are 0.0 and -0.0."""
    return x != 0.0 or copysign(1.0, x) == copysign(1.0, y)


Op = dict[str, Any]


def diff(a: Any, b: Any) -> list[Op]:
    """An RFC 6902 patch that turns JSON value ``a`` into ``b``; ``[]`` when they are equal."""
    ops: list[Op] = []
    diff_under(a, b, "", ops)
    return ops


def diff_under(a: Any, b: Any, pointer: str, ops: list[Op]) -> None:
    """Append to ``ops`` the ops that turn ``a``, held at ``pointer``, into ``b``.

    :func:`diff` for a part of a larger value: every op's path starts with
    ``pointer`` (an RFC 6901 pointer, ``""`` for the root).
    """
    if a is b:
        return
    t = type(a)
    if t is type(b):
        if t is dict:
            _diff_dict(a, b, pointer, None, ops)
            return
        if t is list:
            _diff_list(a, b, pointer, None, ops)
            return
        if a == b and (t is not float or _alike(a, b)):
            return
    ops.append({"op": "replace", "path": pointer, "value": _copy(b)})


def copy_form(value: Any) -> Any:
    """A deep copy of a JSON value, sharing no container with it (scalars are immutable)."""
    return _copy(value)


def pointer_token(key: str) -> str:
    """``key`` as one JSON pointer reference token (RFC 6901)."""
    return _token(key)


def _token(key: str) -> str:
    """``key`` as one JSON pointer reference token (RFC 6901)."""
    if "~" in key or "/" in key:
        # "~" first, or the "~" introduced by "~1" would be escaped again.
        return key.replace("~", "~0").replace("/", "~1")
    return key


def _path(parent: str, key: str | int | None) -> str:
    """The pointer to ``key`` under ``parent`` (``parent`` itself for None, the root)."""
    if key is None:
        return parent
    if isinstance(key, int):
        return f"{parent}/{key}"
    return f"{parent}/{_token(key)}"


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value; scalars are immutable and go as they are."""
    t = type(value)
    if t is dict:
        return {k: _copy(v) if type(v) is dict or type(v) is list else v for k, v in value.items()}
    if t is list:
        return [_copy(v) if type(v) is dict or type(v) is list else v for v in value]
    return value


# The leaf test inlined below is `x == y` restricted to same-typed scalars: Python
# equates True with 1 and 1 with 1.0, JSON does not, and the type check is what
# keeps them apart. -0.0 == 0.0 too, yet they serialize differently, hence the sign
# check on float zeros.
#
# A container's pointer is passed as its parent's pointer plus its key and built
# only once an op or a nested container needs it: most containers walked are
# unchanged, and building their pointers would be a good share of the cost.


def _diff_child(x: Any, y: Any, path: str, key: str | int, ops: list[Op]) -> str:
    """Diff the unequal values ``x`` -> ``y`` held at ``key`` of the container at ``path``.

    Returns ``path`` (now built) for the caller to reuse.
    """
    t = type(x)
    if t is type(y):
        if t is dict:
            _diff_dict(x, y, path, key, ops)
            return path
        if t is list:
            _diff_list(x, y, path, key, ops)
            return path
    ops.append({"op": "replace", "path": _path(path, key), "value": _copy(y)})
    return path


def _diff_dict(
    a: dict[str, Any], b: dict[str, Any], parent: str, at: str | int | None, ops: list[Op]
) -> None:
    path: str | None = None
    gone = 0
    for key, x in a.items():
        try:
            y = b[key]
        except KeyError:
            if path is None:
                path = _path(parent, at)
            ops.append({"op": "remove", "path": f"{path}/{_token(key)}"})
            gone += 1
            continue
        if x is y:
            continue
        t = type(x)
        if t is type(y) and t not in _CONTAINERS and x == y and (t is not float or _alike(x, y)):
            continue
        path = _diff_child(x, y, path or _path(parent, at), key, ops)
    # Every key of a that b still holds is in b; if the sizes then agree there is
    # nothing new, which spares the second pass in the common case.
    if len(b) != len(a) - gone:
        if path is None:
            path = _path(parent, at)
        for key, y in b.items():
            if key not in a:
                ops.append({"op": "add", "path": f"{path}/{_token(key)}", "value": _copy(y)})


def _diff_list(
    a: list[Any], b: list[Any], parent: str, at: str | int | None, ops: list[Op]
) -> None:
    n, m = len(a), len(b)
    common = min(n, m)
    # Python == only chooses the alignment; the aligned pairs are still diffed
    # strictly below, so conflating True with 1 here costs compactness, never
    # correctness.
    p = 0
    while p < common and a[p] == b[p]:
        p += 1
    s = 0
    while s < common - p and a[n - 1 - s] == b[m - 1 - s]:
        s += 1
    # The middle a[p:n-s] becomes b[p:m-s].
    ra, rb = n - s - p, m - s - p
    if ra == rb and ra >= 2 and _diff_moved_one(a, b, p, ra, parent, at, ops):
        return
    # Pair the middle's items from the start, after dropping `drop` items of a or
    # inserting `lead` items of b there.
    drop = lead = 0
    if ra and rb:
        drop = _shift(a, p, ra, b, p, rb)
        if not drop:
            lead = _shift(b, p, rb, a, p, ra)
    paired = min(ra - drop, rb - lead)
    end = p + lead + paired  # where the paired run ends, in b's indices
    extra = ra - drop - paired  # items of a past the paired run, all removed

    path: str | None = None
    if drop or lead or extra or end < m - s:
        path = _path(parent, at)
        # Structural ops first, so every later op addresses b's indices.
        for i in range(p + drop - 1, p - 1, -1):
            ops.append({"op": "remove", "path": f"{path}/{i}"})
        for i in range(p, p + lead):
            ops.append({"op": "add", "path": f"{path}/{i}", "value": _copy(b[i])})
        # Highest index first: each removal then leaves the indices still to go untouched.
        for i in range(end + extra - 1, end - 1, -1):
            ops.append({"op": "remove", "path": f"{path}/{i}"})
        for i in range(end, m - s):
            ops.append({"op": "add", "path": f"{path}/{i}", "value": _copy(b[i])})

    path = _diff_run(a, b, 0, p, 0, parent, at, path, ops)
    path = _diff_run(a, b, p + lead, end, drop - lead, parent, at, path, ops)
    _diff_run(a, b, m - s, m, n - m, parent, at, path, ops)


def _diff_moved_one(
    a: list[Any], b: list[Any], p: int, r: int, parent: str, at: str | int | None, ops: list[Op]
) -> bool:
    """Diff a list whose middle ``a[p:p+r]`` is ``b[p:p+r]`` with one item moved end to end.

    That is one ``move`` op (the item to the front, or to the back, of the
    middle) whatever the list's length, where pairing items in place would
    rewrite every one between. Returns False, adding nothing, for any other change.
    """
    last = p + r - 1
    if a[last] == b[p] and a[p:last] == b[p + 1 : last + 1]:
        source, target = last, p
    elif a[p] == b[last] and a[p + 1 : last + 1] == b[p:last]:
        source, target = p, last
    else:
        return False
    path = _path(parent, at)
    ops.append({"op": "move", "from": f"{path}/{source}", "path": f"{path}/{target}"})
    # Python == chose the alignment; the pairs it made are now diffed strictly.
    moved = list(a)
    moved.insert(target, moved.pop(source))
    _diff_run(moved, b, 0, len(b), 0, parent, at, path, ops)
    return True


def no_larger_than_replace(ops: list[Op], ops_size: int, b_text: str, b: Any) -> list[Op]:
    """``ops``, or one root ``replace`` by ``b`` if that would be smaller.

    ``ops_size`` is the compact JSON size of ``ops``, ``b_text`` that of ``b``:
    the caller has both at hand, so the rule costs a comparison. A fresh copy
    of ``b`` goes into the replace, so the patch shares nothing with it.
    """
    if ops_size > len(b_text) + REPLACE_OVERHEAD:
        return [{"op": "replace", "path": "", "value": _copy(b)}]
    return ops


# len('[{"op":"replace","path":"","value":}]'): a root replace beyond its value.
REPLACE_OVERHEAD = 37


def diff_json(a: Any, b: Any) -> list[Op]:
    """An RFC 6902 patch that turns the JSON value ``a`` into ``b`` (``[]`` when equal).

    Applied to ``a`` by any RFC 6902 applier (``streamkit.apply_delta``,
    ``jsonpatch``, fast-json-patch) it gives exactly ``b`` under strict JSON
    equality: ``true`` is not ``1``, ``1`` is not ``1.0``, ``-0.0`` is not
    ``0.0``. Moving one list item costs one ``move`` op, whatever the list's
    length, and a patch is never larger than a ``replace`` of the whole value.
    Both values must be what ``json.loads`` returns (dicts, lists, strings,
    numbers, booleans, None). The values in the patch share nothing with
    ``a`` or ``b``.
    """
    ops = diff(a, b)
    if not ops or (len(ops) == 1 and ops[0]["path"] == "" and ops[0]["op"] == "replace"):
        return ops
    compact = (",", ":")
    return no_larger_than_replace(
        ops, len(json.dumps(ops, separators=compact)), json.dumps(b, separators=compact), b
    )


def _shift(x: list[Any], xs: int, xn: int, y: list[Any], ys: int, yn: int) -> int:
    """How many leading items of ``x[xs:xs+xn]`` to drop so the rest lines up with ``y[ys:]``.

    Looks at the first place ``y[ys]`` occurs only, which keeps the search linear;
    0 when there is no such shift.
    """
    try:
        k = x.index(y[ys], xs + 1, xs + xn) - xs
    except ValueError:
        return 0
    run = min(xn - k, yn)
    return k if x[xs + k : xs + k + run] == y[ys : ys + run] else 0


def _diff_run(
    a: list[Any],
    b: list[Any],
    lo: int,
    hi: int,
    shift: int,
    parent: str,
    at: str | int | None,
    path: str | None,
    ops: list[Op],
) -> str | None:
    """Diff ``b[i]`` against ``a[i + shift]`` for ``i`` in ``[lo, hi)``, at b's index ``i``.

    Returns the list's pointer if it had to be built, so later runs reuse it.
    """
    for i in range(lo, hi):
        x = a[i + shift]
        y = b[i]
        if x is y:
            continue
        t = type(x)
        if t is type(y) and t not in _CONTAINERS and x == y and (t is not float or _alike(x, y)):
            continue
        path = _diff_child(x, y, path or _path(parent, at), i, ops)
    return path

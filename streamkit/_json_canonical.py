"""One text per JSON value: what two event bodies are compared by, and kept keys hashed by.

:func:`canonical_json` sorts keys, writes an integral float as its int (``1.0``
is ``1``) and keeps ``true`` apart from ``1`` (Python's ``True == 1`` is not
JSON's). A retried append is judged by it whether its event is still stored
(:func:`~streamkit.events.same_body`) or retention kept only the hash of this
text (:func:`~streamkit.backends._keys.body_sha256`), so the verdict is the
same before and after retention.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["canonical_json"]


def canonical_json(value: Any) -> str:
    """One text per JSON value, what two bodies are compared by (and kept keys hashed by).

    Keys sorted; an integral float is its int (``1.0`` is ``1``); ``true`` is never ``1``
    (Python's ``True == 1`` is not JSON's), so a retry gets the same verdict whether its
    event is stored or only its key's hash is kept.
    """
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value

"""The JSON fast paths of streamkit, each beside its plain twin.

Events are encoded once when appended and decoded on every read, so the
per-call Python layers of ``json`` show in every benchmark. Each trick here
reaches past a public ``json`` API into the C accelerator it ends in, and so
has a plain twin built on the public API alone, giving the same answer; a
hypothesis test holds each pair to that (``tests/core/test_fast_paths.py``).
:data:`FAST` is the one switch: false, or a Python whose ``json`` lacks the C
parts, and every caller gets the plain twins.

- :func:`encode_object`: compact JSON of a dict (separators ``,`` and ``:``,
  ASCII escapes, NaN refused). Fast: the C encoder built once with no
  circular-reference memo, so a value that contains itself raises
  ``RecursionError`` instead of the memo's ``ValueError`` (callers refuse
  both).
- :func:`decode`: ``json.loads`` of one stored text. Fast: the C scanner
  itself, falling back to ``json.loads`` for anything but a whole value (so
  errors read as ``json``'s own).
- :func:`decode_many`: many texts with one parser call. Fast: pydantic-core's
  ``from_json`` (a third faster than ``json.loads`` on a page of small
  objects), falling back to ``json.loads`` for any text it refuses, so a
  page ``json`` can read is always read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pydantic_core import from_json

from streamkit._speed import FAST as SPEED_TRICKS

__all__ = [
    "FAST",
    "decode",
    "decode_many",
    "decode_many_plain",
    "decode_plain",
    "encode_object",
    "encode_object_plain",
]

FAST = SPEED_TRICKS
"""Whether this module's fast paths are on: :data:`streamkit._speed.FAST`, the one switch."""

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# One shared encoder: json.dumps with options would build a new one for every call.
encode_object_plain: Callable[[Any], str] = _ENCODER.encode
"""The plain twin of :func:`encode_object`: ``JSONEncoder.encode`` with the log's options."""


def _c_encoder() -> Callable[[Any, int], Sequence[str]] | None:
    make = getattr(json.encoder, "c_make_encoder", None)
    escape = getattr(json.encoder, "c_encode_basestring_ascii", None)
    if make is None or escape is None:
        return None
    encoder: Callable[[Any, int], Sequence[str]] = make(
        None, _ENCODER.default, escape, None, ":", ",", False, False, False
    )
    return encoder


_C_ENCODE = _c_encoder() if FAST else None


def _fast_encoder(c_encode: Callable[[Any, int], Sequence[str]]) -> Callable[[dict[str, Any]], str]:
    join = "".join  # bound once: this runs for the payload and metadata of every event

    def encode_object_fast(value: dict[str, Any]) -> str:
        return join(c_encode(value, 0))

    return encode_object_fast


encode_object: Callable[[dict[str, Any]], str] = (
    encode_object_plain if _C_ENCODE is None else _fast_encoder(_C_ENCODE)
)
"""Compact JSON of a plain ``dict`` (the C encoder when available)."""

_SCAN_ONCE: Callable[[str, int], tuple[Any, int]] | None = (
    getattr(json.JSONDecoder(), "scan_once", None) if FAST else None
)


def decode_plain(text: str) -> Any:
    """The plain twin of :func:`decode`: ``json.loads``."""
    return json.loads(text)


def _fast_decoder(scan_once: Callable[[str, int], tuple[Any, int]]) -> Callable[[str], Any]:
    def decode_fast(text: str) -> Any:
        if text == "{}":
            return {}
        try:
            value, end = scan_once(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):
            return json.loads(text)  # leading or trailing text: let json say what is wrong
        return value

    return decode_fast


decode: Callable[[str], Any] = decode_plain if _SCAN_ONCE is None else _fast_decoder(_SCAN_ONCE)
"""``json.loads`` of one text, minus its per-call Python layers when the scanner is there."""


def decode_many_plain(texts: Sequence[str]) -> list[Any]:
    """The plain twin of :func:`decode_many`: ``json.loads`` of the texts as one array."""
    parsed: list[Any] = json.loads("[" + ",".join(texts) + "]")
    return parsed


_FROM_JSON: Callable[[str], Any] | None = from_json if FAST else None


def decode_many(texts: Sequence[str]) -> list[Any]:
    """Parse many JSON texts with one parser call (a page decodes several times faster)."""
    if len(texts) == 1:
        return [decode(texts[0])]
    if texts.count("{}") == len(texts):  # counted at C speed: most metadata is empty
        return [{} for _ in texts]
    if _FROM_JSON is not None:
        joined = "[" + ",".join(texts) + "]"
        try:
            parsed: list[Any] = _FROM_JSON(joined)
            return parsed
        except ValueError:
            # What it refuses and json reads (a lone surrogate another writer
            # stored, nesting past its depth): json's answer, or json's error.
            return decode_many_plain(texts)
    return decode_many_plain(texts)

"""How many bytes an event's JSON takes as UTF-8, whatever escaping its stored form uses.

The log stores JSON with every non-ASCII character escaped (``\\u00e9`` for
``é``), which is up to six times larger than the same JSON in UTF-8, the form
every wire (the control socket, HTTP) carries. An event's size is measured
as UTF-8 JSON; :func:`utf8_json_size` reads it off the escaped text without
decoding it.
"""

from __future__ import annotations

import re

__all__ = ["utf8_json_size"]

_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def utf8_json_size(text: str) -> int:
    """The bytes of ``text`` (compact JSON, non-ASCII escaped as ``\\uXXXX``) as UTF-8 JSON.

    What the event's size is measured by, whatever escaping its stored form
    uses: ``é`` counts 2 bytes, not the 6 of its escape. A control character
    stays escaped in UTF-8 JSON too, so it counts 6; DEL counts 1.
    """
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    if "\\u" not in text:
        return size
    for match in _ESCAPE.finditer(text):
        digits = match.group(1)
        if digits is None:
            continue  # an escape of its own character (a quote, a backslash, \\n)
        point = int(digits, 16)
        if point < 0x20:
            continue  # a control character: escaped in UTF-8 JSON as well
        if point < 0x80:
            size -= 5  # DEL: escaped only in ASCII JSON, 6 -> 1 byte
        elif point < 0x800 or 0xD800 <= point < 0xE000:
            size -= 4  # 6 -> 2 bytes; each half of a surrogate pair, 12 -> 4 for both
        else:
            size -= 3  # 6 -> 3 bytes
    return size

"""Bounded, sanitised traceback excerpts: what is kept of a failure of user code.

A failure of user code (a reduce, an effect, a blocker, a task handler,
background work, an upcaster, a key or schedule function) is logged once with
its whole traceback by the host's log. What is *kept* of it where an operator
looks later (a task's ``task.attempt-failed`` event, a DLQ record, a
processor's last error in ``status``) is :func:`traceback_excerpt`: the
innermost frames and the error line, at most :data:`MAX_EXCERPT_BYTES` bytes
of UTF-8, and never the frames' local variables (they may hold secrets, and
an event is kept for good). The innermost frames are the ones kept because
they name the line that raised; the outermost are the framework's own.
"""

from __future__ import annotations

import traceback
from typing import Final

__all__ = ["MAX_EXCERPT_BYTES", "traceback_excerpt"]

MAX_EXCERPT_BYTES: Final = 8192
"""The most bytes (UTF-8) an excerpt holds."""

_MAX_MESSAGE_CHARS: Final = 2000
"""A longer error message is cut: the frames are what an excerpt is for."""

_CUT: Final = "  ... ({n} earlier lines left out)\n"


def traceback_excerpt(exc: BaseException, limit: int = MAX_EXCERPT_BYTES) -> str:
    """``exc``'s traceback as text, innermost frames last, at most ``limit`` bytes, no locals.

    Chained causes (``raise ... from``) are kept while they fit, outermost
    first, as Python prints them; what does not fit is cut from the top, with
    a line saying how many lines were left out. An exception that was never
    raised has no frames: its excerpt is its error line alone.
    """
    lines: list[str] = []
    for chunk in traceback.TracebackException.from_exception(exc, capture_locals=False).format():
        lines.extend(chunk.splitlines(keepends=True))
    lines = [_short(line) for line in lines]
    sizes = [len(line.encode("utf-8", "replace")) for line in lines]
    total = sum(sizes)
    if total <= limit:
        return "".join(lines)
    # Keep the tail (the innermost frames and the error line) that fits with the cut note.
    kept: list[str] = []
    used = len(_CUT.format(n=len(lines)).encode())
    for line, size in zip(reversed(lines), reversed(sizes), strict=True):
        if used + size > limit:
            break
        kept.append(line)
        used += size
    kept.reverse()
    if not kept:
        # One line alone is over the limit (a huge message): keep its start.
        last = lines[-1].encode("utf-8", "replace")[: limit - 64].decode("utf-8", "ignore")
        return _CUT.format(n=len(lines) - 1) + last.rstrip("\n") + " ...\n"
    return _CUT.format(n=len(lines) - len(kept)) + "".join(kept)


def _short(line: str) -> str:
    if len(line) <= _MAX_MESSAGE_CHARS:
        return line
    return line[:_MAX_MESSAGE_CHARS] + f"... ({len(line) - _MAX_MESSAGE_CHARS} more characters)\n"

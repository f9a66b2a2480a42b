"""The one switch of streamkit's speed tricks: ``STREAMKIT_PLAIN=1`` turns every one off.

Each trick is an algorithm or a cache that gives the same outcomes as a
plainer path beside it, only sooner: building events without a frozen
dataclass's ``__init__``, the C JSON scanner, typed catch-up pages,
pages shared between readers, commits run inline on the loop and the
writes held to ride them, the tasks processor's joint appends, the
live-state forms walked instead of re-serialized, the engine's read ahead
of a checkpoint, the SSE seed cache, the SQLite group without savepoints,
the one-statement PostgreSQL append and the daemon's start-up heap frozen
out of the collector's full passes. docs/performance.md lists each
with what it buys; CI runs the contract suites and the engine's property
tests with the switch off as well as on.

The switch is read once, when streamkit is imported: set it in the
environment of the process (``STREAMKIT_PLAIN=1``), never at run time.
"""

from __future__ import annotations

import os

__all__ = ["FAST"]

FAST: bool = os.environ.get("STREAMKIT_PLAIN", "").strip() in ("", "0")
"""Whether the speed tricks are on (the default); false under ``STREAMKIT_PLAIN=1``."""

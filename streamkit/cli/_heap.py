"""The daemon's start-up heap, kept out of the garbage collector's full passes.

A ``streamkit host`` process imports its processors, pydantic, structlog and
(with ``--http``) Starlette before it serves: a few hundred thousand objects
that live as long as the process. CPython's full collection walks all of
them, and a catch-up or a rebuild, which allocates millions of short-lived
events, sets one off every tenth of a second or so: measured, 10-15 ms each,
during which every processor of the host, the socket and HTTP stand still
(the p99 of a serving processor beside a rebuild of 1M events). Frozen once
the host is built (:func:`gc.freeze`), those objects are not walked again,
and a full pass costs what the young objects cost.

Only the daemon does it: the process is its own. An application that runs
a :class:`~streamkit.host.ProcessorHost` inside its own process decides
that for its own heap (docs/performance.md, "The collector"). A speed trick:
off under ``STREAMKIT_PLAIN=1`` (:mod:`streamkit._speed`).
"""

from __future__ import annotations

import gc

from streamkit._speed import FAST as SPEED_TRICKS

__all__ = ["freeze_start_up_heap"]


def freeze_start_up_heap() -> int:
    """Collect, then freeze what survives; the objects frozen (0 with the speed tricks off)."""
    if not SPEED_TRICKS:
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

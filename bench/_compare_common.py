"""What every side of ``bench/compare.py`` shares: the payload, the sizes, the sample maths.

Each side (streamkit, eventsourcing, raw sqlite3) appends the same payload,
so the bytes each one encodes, stores and decodes differ only by what the
library itself adds around them (its envelope, ids and timestamps).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

EVENT_TYPE = "order.placed"
CONCURRENT_WRITERS = 16
BATCH_SIZE = 100


def payload(i: int) -> dict[str, Any]:
    """The payload of event ``i``: about 90 bytes of JSON, as an order event might carry."""
    return {"order": i, "customer": f"c-{i % 97}", "lines": [1, 2, 3], "note": "x" * 40}


PAYLOAD_BYTES = len(json.dumps(payload(12345)))


def latency_summary(latencies: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max of per-event latencies given in seconds, in milliseconds."""
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": p99 * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def rate(events: int, seconds: float) -> float:
    return events / seconds if seconds > 0 else float("inf")


class Stopwatch:
    """``with Stopwatch() as watch: ...`` then ``watch.seconds`` (perf_counter)."""

    seconds: float = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


def timed_steps(step: Callable[[int], object], n: int, warmup: int) -> float:
    """Seconds for ``step(i)`` over ``n`` steps, after ``warmup`` untimed ones (``i`` runs on)."""
    for i in range(warmup):
        step(i)
    with Stopwatch() as watch:
        for i in range(warmup, warmup + n):
            step(i)
    return watch.seconds


def batch_rate(batch: Callable[[int], object], n: int, warmup: int) -> float:
    """Events/s of ``n`` events as ``batch(b)`` calls of BATCH_SIZE, after at least one untimed."""
    batches = n // BATCH_SIZE
    seconds = timed_steps(batch, batches, max(1, warmup // BATCH_SIZE))
    return rate(batches * BATCH_SIZE, seconds)

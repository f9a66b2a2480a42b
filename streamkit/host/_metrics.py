"""Per-processor counters and a latency histogram, kept by the host for ``status``.

The host records one sample per committed batch that carried durable events:
the seconds from the newest event's ``created_at`` (stamped at commit by the
appending process) to the moment the batch was checkpointed here. That is the
append-to-process latency an operator cares about, across processes.

The histogram is fixed-size (log-spaced buckets from 100 us to ~100 s), so a
host that runs for months keeps constant memory; percentiles are read off the
buckets and are accurate to the bucket width (about 12%). Nothing here does
I/O or raises.
"""

from __future__ import annotations

import math
import time
from collections import deque
from datetime import datetime
from typing import Any

from streamkit.host._minutes import MinuteSeries

__all__ = ["LatencyHistogram", "ProcessorMetrics", "parse_created_at"]

_LOW = 1e-4  # seconds: the first bucket's upper edge
_GROWTH = 1.125
_BUCKETS = 120  # _LOW * _GROWTH**120 is about 1.4e2 seconds; later samples share the last


class LatencyHistogram:
    """Counts of latency samples in log-spaced buckets; percentiles from the counts."""

    __slots__ = ("_counts", "count", "max", "sum")

    def __init__(self) -> None:
        self._counts = [0] * (_BUCKETS + 1)
        self.count = 0
        self.max = 0.0
        self.sum = 0.0

    def record(self, seconds: float) -> None:
        """Add one sample (negative samples, from clock skew between processes, count as 0)."""
        if not math.isfinite(seconds):
            return
        seconds = max(0.0, seconds)
        index = 0
        if seconds > _LOW:
            index = min(_BUCKETS, 1 + int(math.log(seconds / _LOW, _GROWTH)))
        self._counts[index] += 1
        self.count += 1
        self.sum += seconds
        self.max = max(self.max, seconds)

    def cumulative(self, edges: tuple[float, ...]) -> list[int]:
        """For each edge (ascending, seconds), the samples in buckets whose upper edge is <= it.

        A Prometheus histogram's ``le`` counts: exact at the internal bucket
        edges, and never more than the samples truly at or below each edge.
        """
        counts: list[int] = []
        seen = 0
        index = 0
        for edge in edges:
            while index <= _BUCKETS and _LOW * _GROWTH**index <= edge:
                seen += self._counts[index]
                index += 1
            counts.append(seen)
        return counts

    def percentile(self, p: float) -> float | None:
        """The upper edge of the bucket holding the ``p``-th percentile (0-100), or None if empty."""
        if self.count == 0:
            return None
        rank = max(1, math.ceil(self.count * p / 100.0))
        seen = 0
        for index, n in enumerate(self._counts):
            seen += n
            if seen >= rank:
                return min(self.max, _LOW * _GROWTH**index)
        return self.max


class ProcessorMetrics:
    """What the host counts for one processor (this host incarnation only)."""

    __slots__ = (
        "_rate_window",
        "batch_failures",
        "batches",
        "events_reduced",
        "last_batch_at",
        "latency",
        "minutes",
    )

    def __init__(self, now_monotonic: float | None = None) -> None:
        self.events_reduced = 0
        self.batches = 0
        self.batch_failures = 0
        self.latency = LatencyHistogram()
        self.last_batch_at: float | None = None
        """When (monotonic) the last batch committed: the last time the cursor moved here."""
        # (monotonic seconds, events reduced so far) samples for a recent rate.
        self._rate_window: deque[tuple[float, int]] = deque(maxlen=64)
        self.minutes = MinuteSeries(time.monotonic() if now_monotonic is None else now_monotonic)
        """Events and failed batches per minute over the last hour (the admin page's chart)."""

    def batch_done(self, delivered: int, now_monotonic: float, latency: float | None) -> None:
        """Count one committed batch of ``delivered`` events; ``latency`` if it had durables."""
        self.batches += 1
        self.events_reduced += delivered
        self.last_batch_at = now_monotonic
        self.minutes.events(delivered, now_monotonic)
        if latency is not None:
            self.latency.record(latency)
        window = self._rate_window
        if not window or now_monotonic - window[-1][0] >= 0.5:
            window.append((now_monotonic, self.events_reduced))

    def batch_failed(self, now_monotonic: float) -> None:
        """Count one failed batch."""
        self.batch_failures += 1
        self.minutes.failure(now_monotonic)

    def rate(self, now_monotonic: float, span: float = 30.0) -> float:
        """Events reduced per second over about the last ``span`` seconds (0.0 if unknown)."""
        window = self._rate_window
        start = next(((t, n) for t, n in window if now_monotonic - t <= span), None)
        if start is None:
            return 0.0
        elapsed = now_monotonic - start[0]
        if elapsed <= 0:
            return 0.0
        return (self.events_reduced - start[1]) / elapsed

    def to_dict(self, now_monotonic: float) -> dict[str, Any]:
        """JSON-ready counters for ``status``."""
        p50 = self.latency.percentile(50)
        p99 = self.latency.percentile(99)
        return {
            "events_reduced": self.events_reduced,
            "batches": self.batches,
            "batch_failures": self.batch_failures,
            "events_per_second": round(self.rate(now_monotonic), 1),
            "last_batch_age": (
                None
                if self.last_batch_at is None
                else round(max(0.0, now_monotonic - self.last_batch_at), 3)
            ),
            "last_hour": self.minutes.series(now_monotonic),
            "latency_ms": {
                "samples": self.latency.count,
                "p50": None if p50 is None else round(p50 * 1000, 3),
                "p99": None if p99 is None else round(p99 * 1000, 3),
                "max": round(self.latency.max * 1000, 3),
            },
        }


def parse_created_at(text: str) -> float | None:
    """Epoch seconds of a ``created_at`` stamp (``...Z``), or None if it does not parse."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None

"""The streamkit side of ``bench/compare.py``.

Appends go through the public log API (``open_log(...).stream("/").append``),
one call per append as a user writes them. Processing runs the way a
deployment runs it: a :class:`~streamkit.host.ProcessorHost` (embedded,
without its control socket) with one processor on the log file, which takes
the processor's lease, catches it up from its checkpoint and then follows the
stream. Its checkpoints are lease-fenced writes to the log's own file, one per
batch (a catch-up page of 500, or one live commit).

The processor's work is trivial and idiomatic: a contract whose payload schema
is a pydantic model (so every payload is validated), a reduce that counts into
a new pydantic state, the state checkpointed as JSON.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog
from _compare_common import (
    BATCH_SIZE,
    CONCURRENT_WRITERS,
    EVENT_TYPE,
    Stopwatch,
    latency_summary,
    payload,
    rate,
)
from pydantic import BaseModel

from streamkit import (
    EventDefinition,
    ProcessorHost,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
    open_log,
)
from streamkit.config import HostConfig
from streamkit.log import Log

LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class OrderPlaced(BaseModel):
    order: int
    customer: str
    lines: list[int]
    note: str


class Count(BaseModel):
    count: int = 0
    last_order: int = 0


def counter(slug: str) -> StreamProcessor[Count]:
    """A processor named ``slug`` (a fresh slug starts from offset 0) that counts orders."""

    class Counter(StreamProcessor[Count]):
        contract = define_processor_contract(
            slug=slug,
            version="1",
            state_schema=Count,
            events={
                EVENT_TYPE: EventDefinition(description="an order", payload_schema=OrderPlaced)
            },
            consumes=[EVENT_TYPE],
        )

        def reduce(self, event: StreamEvent, state: Count) -> Count:
            return Count(count=state.count + 1, last_order=event.payload.order)

    return Counter()


def event(i: int) -> dict[str, Any]:
    return {"type": EVENT_TYPE, "payload": payload(i)}


async def writer_level(log: Log) -> str:
    """The ``synchronous`` level of the log's writer connection, read on that connection.

    On PostgreSQL, the server's ``synchronous_commit`` and ``fsync`` instead.
    """
    if log.path.startswith("postgresql"):
        return await log.write_transaction(
            lambda conn: "synchronous_commit={} fsync={}".format(
                conn.execute("SHOW synchronous_commit").fetchone()[0],
                conn.execute("SHOW fsync").fetchone()[0],
            )
        )
    value = await log.write_transaction(
        lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0]
    )
    return LEVELS[value]


# -- appends ------------------------------------------------------------------------------


async def _sequential(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    async with open_log(db, synchronous=synchronous) as log:  # type: ignore[arg-type]
        stream = log.stream("/")
        for i in range(warmup):
            await stream.append(event(i))
        with Stopwatch() as watch:
            for i in range(n):
                await stream.append(event(i))
        return {"rate": rate(n, watch.seconds), "synchronous": await writer_level(log)}


async def _batches(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    async with open_log(db, synchronous=synchronous) as log:  # type: ignore[arg-type]
        stream = log.stream("/")
        for _ in range(max(1, warmup // BATCH_SIZE)):
            await stream.append(*(event(i) for i in range(BATCH_SIZE)))
        with Stopwatch() as watch:
            for b in range(n // BATCH_SIZE):
                await stream.append(*(event(b * BATCH_SIZE + i) for i in range(BATCH_SIZE)))
        done = n // BATCH_SIZE * BATCH_SIZE
        return {"rate": rate(done, watch.seconds), "synchronous": await writer_level(log)}


async def _concurrent(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """16 asyncio tasks, each appending one event per call, one after another."""
    per_writer = n // CONCURRENT_WRITERS
    async with open_log(db, synchronous=synchronous) as log:  # type: ignore[arg-type]
        stream = log.stream("/")
        for i in range(warmup):
            await stream.append(event(i))

        async def writer(w: int) -> None:
            for i in range(per_writer):
                await stream.append(event(w * per_writer + i))

        before = log.stats.transactions
        with Stopwatch() as watch:
            await asyncio.gather(*(writer(w) for w in range(CONCURRENT_WRITERS)))
        return {
            "rate": rate(per_writer * CONCURRENT_WRITERS, watch.seconds),
            "synchronous": await writer_level(log),
            "transactions": log.stats.transactions - before,
        }


def sequential(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    return asyncio.run(_sequential(db, synchronous, n, warmup))


def batches(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    return asyncio.run(_batches(db, synchronous, n, warmup))


def concurrent(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    return asyncio.run(_concurrent(db, synchronous, n, warmup))


# -- processing ---------------------------------------------------------------------------


def fill(db: Path, n: int) -> None:
    """Append ``n`` events, 1000 per call (not measured)."""

    async def run() -> None:
        # Unmeasured, so as fast as SQLite allows; PostgreSQL has no such setting.
        fast = {} if str(db).startswith("postgresql") else {"synchronous": "NORMAL"}
        async with open_log(db, **fast) as log:
            stream = log.stream("/")
            for start in range(0, n, 1000):
                await stream.append(*(event(i) for i in range(start, min(start + 1000, n))))

    asyncio.run(run())


class _Captured:
    """A structlog processor that keeps the host's log lines (and prints none of them)."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> Any:
        self.lines.append(dict(event_dict))
        self._arrived.set()
        raise structlog.DropEvent

    async def line(self, name: str) -> dict[str, Any]:
        """The latest line named ``name``, waiting for one if none was logged yet."""
        while True:
            found = [line for line in self.lines if line.get("event") == name]
            if found:
                return found[-1]
            self._arrived.clear()
            await self._arrived.wait()


def _host(db: Path, synchronous: str, slug: str) -> tuple[ProcessorHost, _Captured]:
    captured = _Captured()
    structlog.configure(processors=[captured], cache_logger_on_first_use=False)
    config = HostConfig(db=db, synchronous=synchronous)  # type: ignore[arg-type]
    host = ProcessorHost(config, processors=[counter(slug)], serve_control=False)
    return host, captured


async def _catch_up(db: Path, synchronous: str, n: int, slug: str) -> dict[str, Any]:
    """Start a host with a new processor on a log of ``n`` events; wait until it caught up.

    The rate is the runner's own timing of its catch-up (the ``catch_up.done``
    log line: load the checkpoint, read every page, validate and reduce each
    event, write one checkpoint per page); ``cold_rate`` also counts opening
    the log and taking the lease.
    """
    host, captured = _host(db, synchronous, slug)
    with Stopwatch() as cold:
        await host.start()
        await host.wait_until_processed(slug, n, timeout=600)
    try:
        # The cursor reaches the head inside the runner's catch-up item, a little
        # before the item ends and the runner logs its timing.
        async with asyncio.timeout(60):
            done = await captured.line("catch_up.done")
        if done["events"] != n:
            raise AssertionError(f"the catch-up reduced {done['events']} events, expected {n}")
        snapshot = await host.snapshot(slug)
        if snapshot["state"]["count"] != n:
            raise AssertionError(f"state counted {snapshot['state']['count']}, expected {n}")
        assert host.log is not None
        return {
            "rate": rate(n, done["seconds"]),
            "cold_rate": rate(n, cold.seconds),
            "synchronous": await writer_level(host.log),
        }
    finally:
        await host.stop()


async def _live(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """Append one event, wait until the host's processor has processed and checkpointed it."""
    slug = "live-counter"
    host, _ = _host(db, synchronous, slug)
    await host.start()
    try:
        assert host.log is not None
        stream = host.log.stream("/")
        for i in range(warmup):
            (appended,) = await stream.append(event(i))
            await host.wait_until_processed(slug, appended.offset)
        latencies: list[float] = []
        with Stopwatch() as watch:
            for i in range(n):
                with Stopwatch() as one:
                    (appended,) = await stream.append(event(i))
                    await host.wait_until_processed(slug, appended.offset)
                latencies.append(one.seconds)
        snapshot = await host.snapshot(slug)
        if snapshot["state"]["count"] != warmup + n:
            raise AssertionError(f"state counted {snapshot['state']['count']}")
        return {
            "rate": rate(n, watch.seconds),
            "synchronous": await writer_level(host.log),
            **latency_summary(latencies),
        }
    finally:
        await host.stop()


def catch_up(db: Path, synchronous: str, n: int, slug: str) -> dict[str, Any]:
    return asyncio.run(_catch_up(db, synchronous, n, slug))


def live(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    return asyncio.run(_live(db, synchronous, n, warmup))

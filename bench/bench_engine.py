"""Benchmark the processor engine over the real SQLite log; prints a Markdown table.

Phases, each in its own subprocess so peak RSS belongs to that phase alone:

- fill: append N events (a small validated payload each) to a fresh log file;
- raw: page through them with plain sqlite3 and json.loads (the floor to compare with);
- catch-up: a fresh ProcessorEngine catches a trivial processor up from offset 0
  (payload validated into a pydantic model, a new pydantic state per event,
  one checkpoint per 500-event page);
- live: 1-event appends one after another, each pushed to the engine through the
  log's follow iterator, processed and checkpointed before the next; latency is
  append start to the processor's process_event call.

Usage: python bench/bench_engine.py [--events N] [--quick] [--live N] [--repeat N] [--profile]
(--quick: 100k events, 500 live appends; read phases report the best of --repeat
runs, since a shared machine's noise only ever slows a run down; --profile runs
the catch-up once under cProfile and prints where its time went).
Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from streamkit import (
    EventDefinition,
    ProcessorEngine,
    ReduceCheckpointTable,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
    open_log,
)
from streamkit.processor import ProcessEventArgs

PATH = "/bench"
PAGE = 500


class Tick(BaseModel):
    n: int
    label: str


class Count(BaseModel):
    count: int = 0
    total: int = 0


class Counter(StreamProcessor[Count]):
    """The trivial processor: counts ticks and sums their n."""

    contract = define_processor_contract(
        slug="bench-counter",
        version="1",
        state_schema=Count,
        events={"tick": EventDefinition(description="one tick", payload_schema=Tick)},
        consumes=["tick"],
    )

    def reduce(self, event: StreamEvent, state: Count) -> Count:
        return Count(count=state.count + 1, total=state.total + event.payload.n)


class TimedCounter(Counter):
    """The counter plus an effect hook that notes when each event reached it."""

    def __init__(self) -> None:
        self.reached: dict[int, float] = {}

    def process_event(self, args: ProcessEventArgs[Count]) -> None:
        if args.event is not None:
            self.reached[args.event.offset] = time.perf_counter()


def tick(i: int) -> dict[str, Any]:
    return {"type": "tick", "payload": {"n": i % 7, "label": f"tick-{i % 100}"}}


def checkpoint_connection(db: str) -> sqlite3.Connection:
    """The checkpoint table's own connection to the log file, durable like the log (NORMAL)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def fill(db: str, events: int) -> dict[str, Any]:
    started = time.perf_counter()
    async with open_log(db, synchronous="NORMAL") as log:
        stream = log.stream(PATH)
        for start in range(0, events, 1000):
            await stream.append(*(tick(i) for i in range(start, min(start + 1000, events))))
    return {"seconds": time.perf_counter() - started}


def raw(db: str, repeat: int) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    loads = json.loads
    best, count = float("inf"), 0
    for _ in range(repeat):
        started = time.perf_counter()
        after, count = 0, 0
        while True:
            rows = conn.execute(
                'SELECT "offset", type, payload, metadata, source, idempotency_key, created_at'
                ' FROM streamkit_events WHERE path = ? AND "offset" > ? ORDER BY "offset" LIMIT ?',
                (PATH, after, PAGE),
            ).fetchall()
            if not rows:
                break
            for row in rows:
                loads(row[2])
            count += len(rows)
            after = rows[-1][0]
        best = min(best, time.perf_counter() - started)
    conn.close()
    return {"events": count, "seconds": best, "rss": peak_rss_mib()}


async def log_read(db: str, repeat: int) -> dict[str, Any]:
    """Page through the log with Stream.read and nothing else: the engine's own floor."""
    best, count = float("inf"), 0
    async with open_log(db, synchronous="NORMAL") as log:
        stream = log.stream(PATH)
        for _ in range(repeat):
            started = time.perf_counter()
            after, count = 0, 0
            while True:
                page = await stream.read(after, PAGE)
                count += len(page.events)
                if page.scanned_through_offset <= after or page.at_head:
                    break
                after = page.scanned_through_offset
            best = min(best, time.perf_counter() - started)
    return {"events": count, "seconds": best, "rss": peak_rss_mib()}


async def catch_up(db: str, profile: bool, repeat: int) -> dict[str, Any]:
    checkpoints = checkpoint_connection(db)
    best, count, offset = float("inf"), 0, 0
    profiler = cProfile.Profile() if profile else None
    async with open_log(db, synchronous="NORMAL") as log:
        for attempt in range(1 if profile else repeat):
            # A fresh checkpoint table per attempt, so each one starts from offset 0.
            engine = ProcessorEngine(
                Counter(),
                stream=log.stream(PATH).for_processor("bench-counter"),
                storage=ReduceCheckpointTable(checkpoints, table=f"bench_checkpoints_{attempt}"),
            )
            started = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            await engine.catch_up_from_log()
            if profiler is not None:
                profiler.disable()
            best = min(best, time.perf_counter() - started)
            offset, state = await engine.snapshot()
            count = state.count
            await engine.aclose()
    checkpoints.close()
    report = ""
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
        report = out.getvalue()
    return {
        "events": count,
        "offset": offset,
        "seconds": best,
        "rss": peak_rss_mib(),
        "profile": report,
    }


async def live(db: str, appends: int) -> dict[str, Any]:
    checkpoints = checkpoint_connection(db)
    processor = TimedCounter()
    async with open_log(db, synchronous="NORMAL") as log:
        stream = log.stream(PATH)
        storage = ReduceCheckpointTable(checkpoints)
        engine = ProcessorEngine(
            processor, stream=stream.for_processor("bench-counter"), storage=storage
        )
        await engine.catch_up_from_log()
        follow = stream.follow(engine.cursor)

        async def pump() -> None:
            async for events, scanned in follow:
                await engine.process_event_batch(events, scanned)

        pumping = asyncio.ensure_future(pump())
        writes_before = storage.writes
        latencies: list[float] = []
        started = time.perf_counter()
        for i in range(appends):
            sent = time.perf_counter()
            (event,) = await stream.append(tick(i))
            await engine.wait_until_processed(event.offset)
            latencies.append(processor.reached[event.offset] - sent)
        seconds = time.perf_counter() - started
        writes = storage.writes - writes_before
        await follow.aclose()  # type: ignore[attr-defined]
        pumping.cancel()
        await asyncio.gather(pumping, return_exceptions=True)
        await engine.aclose()
    checkpoints.close()
    latencies.sort()
    return {
        "appends": appends,
        "seconds": seconds,
        "writes": writes,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "rss": peak_rss_mib(),
    }


def phase(args: argparse.Namespace) -> None:
    if args.phase == "fill":
        result = asyncio.run(fill(args.db, args.events))
    elif args.phase == "raw":
        result = raw(args.db, args.repeat)
    elif args.phase == "read":
        result = asyncio.run(log_read(args.db, args.repeat))
    elif args.phase == "catch-up":
        result = asyncio.run(catch_up(args.db, args.profile, args.repeat))
    else:
        result = asyncio.run(live(args.db, args.live))
    print(json.dumps(result))


def run_phase(name: str, db: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--phase",
        name,
        "--db",
        db,
        "--events",
        str(args.events),
        "--live",
        str(args.live),
        "--repeat",
        str(args.repeat),
    ]
    if args.profile:
        command.append("--profile")
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--live", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of N for the read phases")
    parser.add_argument("--quick", action="store_true", help="100k events, 500 live appends")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of catch-up")
    parser.add_argument("--phase", choices=["fill", "raw", "read", "catch-up", "live"])
    parser.add_argument("--db")
    args = parser.parse_args()
    if args.quick:
        args.events, args.live = 100_000, 500
    if args.phase:
        phase(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "bench.db")
        filled = run_phase("fill", db, args)
        floor = run_phase("raw", db, args)
        reading = run_phase("read", db, args)
        caught = run_phase("catch-up", db, args)
        live_db = str(Path(tmp) / "live.db")
        lived = run_phase("live", live_db, args)
    raw_rate = floor["events"] / floor["seconds"]
    rate = caught["events"] / caught["seconds"]
    print(
        f"events: {args.events:,} (filled in {filled['seconds']:.1f} s); Python {sys.version.split()[0]}\n"
    )
    print("| measure | value | goal |")
    print("| --- | --- | --- |")
    print(
        f"| raw sqlite3 read + json decode | {raw_rate:,.0f} events/s (peak RSS {floor['rss']:.0f} MiB) | |"
    )
    print(
        f"| log pages alone (Stream.read, no engine) | "
        f"{reading['events'] / reading['seconds']:,.0f} events/s | |"
    )
    print(f"| engine catch-up | {rate:,.0f} events/s | >= 100,000 events/s |")
    print(f"| catch-up / raw | {rate / raw_rate:.2f}x | >= 0.5x (issue 15) |")
    print(f"| catch-up peak RSS | {caught['rss']:.0f} MiB | |")
    print(
        f"| live: 1-event appends, each processed and checkpointed | "
        f"{lived['appends'] / lived['seconds']:,.0f} appends/s ({lived['writes']} checkpoint writes) | |"
    )
    print(f"| live: append -> process_event p50 | {lived['p50_ms']:.3f} ms | |")
    print(f"| live: append -> process_event p99 | {lived['p99_ms']:.3f} ms | < 5 ms |")
    if args.profile and caught["profile"]:
        print("\ncProfile of the catch-up (top 15 by own time):\n")
        print("```\n" + caught["profile"].strip() + "\n```")


if __name__ == "__main__":
    main()

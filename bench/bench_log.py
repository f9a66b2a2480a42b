"""Benchmark the SQLite log against raw sqlite3 doing the same work; prints a Markdown table.

    .venv/bin/python bench/bench_log.py            # full run (about two minutes)
    .venv/bin/python bench/bench_log.py --quick    # small sizes, a few seconds

Every phase runs in one temporary directory, both sides with WAL and the same
``synchronous`` setting, on a table of the log's own shape:

1. sequential single-event appends vs ``INSERT`` + ``COMMIT`` per row (FULL),
   and (1b) raw commit-per-row behind a writer thread;
2. 16 concurrent single-event appenders (asyncio tasks) vs commit-per-row (FULL);
3. 100-event appends vs ``executemany`` of the same rows per transaction (FULL);

   in phases 1 to 3 each side keeps one file open and the sides take turns,
   block by block (10 blocks, one untimed block each first); a side's rate is
   its median block, so a drift of the disk's speed reaches both alike;
4. paged reads (500 per page) of a large stream vs a raw paged ``SELECT`` with
   ``json.loads`` of payload and metadata; each read runs in a fresh
   subprocess so its peak RSS (``ru_maxrss``) is its own;
5. for the schema choice: raw appends and paged reads on a WITHOUT ROWID table
   keyed (path, offset) vs a rowid table with a unique (path, offset) index.

The raw side encodes payloads with ``json.dumps`` too, so both do the same work
apart from what the log adds (validation, offsets, idempotency; for concurrent
appenders, the hand-off to the writer thread).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from streamkit import open_log
from streamkit.log import Log

RAW_SCHEMA = """
CREATE TABLE events (
    path TEXT NOT NULL, "offset" INTEGER NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL,
    metadata TEXT NOT NULL, source TEXT, idempotency_key TEXT, created_at TEXT NOT NULL,
    PRIMARY KEY (path, "offset")
) WITHOUT ROWID
"""
RAW_ROWID_SCHEMA = """
CREATE TABLE events (
    path TEXT NOT NULL, "offset" INTEGER NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL,
    metadata TEXT NOT NULL, source TEXT, idempotency_key TEXT, created_at TEXT NOT NULL
);
CREATE UNIQUE INDEX events_path_offset ON events (path, "offset")
"""
INSERT = "INSERT INTO events VALUES (?, ?, ?, ?, ?, NULL, NULL, ?)"
STAMP = "2026-01-01T00:00:00.000000Z"


def payload(i: int) -> dict[str, object]:
    return {"order": i, "customer": f"c-{i % 97}", "lines": [1, 2, 3], "note": "x" * 40}


def raw_connect(path: Path, schema: str = RAW_SCHEMA) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    for statement in schema.split(";"):
        if statement.strip():
            conn.execute(statement)
    return conn


def raw_commit_per_row(path: Path, n: int, schema: str) -> float:
    """Commit-per-row into a fresh table at ``path`` (phase 5a's schema comparison)."""
    side = RawSide(path, schema)
    try:
        return asyncio.run(side.commit_per_row(n))
    finally:
        side.conn.close()


# -- the append phases: each side keeps its file open and runs blocks in turn -------------
#
# The disk's speed drifts over seconds (fsync here takes 0.15-0.25 ms from one
# minute to the next), so the sides alternate block by block within one run and
# each side's rate is its median block: a slow or fast spell hits both alike.

Block = Callable[[int], Awaitable[float]]


async def interleave(blocks: int, per_block: int, *sides: Block) -> list[float]:
    """Each side's median rate over ``blocks`` alternating blocks, after one untimed block each."""
    for side in sides:
        await side(per_block)
    rates: list[list[float]] = [[] for _ in sides]
    for _ in range(blocks):
        for side, got in zip(sides, rates, strict=True):
            got.append(await side(per_block))
    return [statistics.median(got) for got in rates]


class RawSide:
    """Raw sqlite3 on one open connection: commit per row, or 100-row ``executemany``."""

    def __init__(self, path: Path, schema: str = RAW_SCHEMA) -> None:
        self.conn = raw_connect(path, schema)
        self.offset = 0

    def _rows(self, n: int) -> list[tuple[object, ...]]:
        rows = []
        for _ in range(n):
            self.offset += 1
            rows.append(
                ("/", self.offset, "order.placed", json.dumps(payload(self.offset)), "{}", STAMP)
            )
        return rows

    async def commit_per_row(self, n: int) -> float:
        conn = self.conn
        start = time.perf_counter()
        for _ in range(n):
            self.offset += 1
            row = ("/", self.offset, "order.placed", json.dumps(payload(self.offset)), "{}", STAMP)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(INSERT, row)
            conn.execute("COMMIT")
        return n / (time.perf_counter() - start)

    async def batches(self, n: int) -> float:
        """``n`` transactions of 100 rows each."""
        start = time.perf_counter()
        for _ in range(n):
            rows = self._rows(100)
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(INSERT, rows)
            self.conn.execute("COMMIT")
        return n * 100 / (time.perf_counter() - start)


class HopSide:
    """Raw commit-per-row behind the least any writer thread costs, and nothing else.

    An asyncio caller puts each row on a queue, a thread commits it and
    settles the caller's future with ``call_soon_threadsafe`` (two cross-thread
    wake-ups per append). The log skips that hop when its writer is idle and
    the loop has nothing else to run (it commits inline), as in phase 1, so it
    can pass this row.
    """

    def __init__(self, path: Path) -> None:
        raw_connect(path).close()
        self.writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.writer.execute("PRAGMA synchronous = FULL")
        self.jobs: queue.SimpleQueue[
            tuple[asyncio.AbstractEventLoop, asyncio.Future[None], int] | None
        ] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work)
        self.thread.start()
        self.offset = 0

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            loop, future, i = job
            self.writer.execute("BEGIN IMMEDIATE")
            self.writer.execute(
                INSERT, ("/", i, "order.placed", json.dumps(payload(i)), "{}", STAMP)
            )
            self.writer.execute("COMMIT")
            loop.call_soon_threadsafe(future.set_result, None)

    async def commit_per_row(self, n: int) -> float:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        for _ in range(n):
            self.offset += 1
            future: asyncio.Future[None] = loop.create_future()
            self.jobs.put((loop, future, self.offset))
            await future
        return n / (time.perf_counter() - start)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        self.writer.close()


class LogSide:
    """streamkit's log on one open file, appending as its users do."""

    def __init__(self, log: Log) -> None:
        self.stream = log.stream("/")
        self.log = log
        self.offset = 0

    def _event(self) -> dict[str, object]:
        self.offset += 1
        return {"type": "order.placed", "payload": payload(self.offset)}

    async def sequential(self, n: int) -> float:
        stream = self.stream
        start = time.perf_counter()
        for _ in range(n):
            await stream.append(self._event())
        return n / (time.perf_counter() - start)

    async def concurrent(self, n: int) -> float:
        """``n`` appends by 16 tasks, each appending one event per call."""

        async def writer(count: int) -> None:
            for _ in range(count):
                await self.stream.append(self._event())

        per_writer = n // WRITERS
        start = time.perf_counter()
        await asyncio.gather(*(writer(per_writer) for _ in range(WRITERS)))
        return per_writer * WRITERS / (time.perf_counter() - start)

    async def batches(self, n: int) -> float:
        """``n`` appends of 100 events each."""
        start = time.perf_counter()
        for _ in range(n):
            await self.stream.append(*(self._event() for _ in range(100)))
        return n * 100 / (time.perf_counter() - start)


WRITERS = 16


async def append_phases(d: Path, blocks: int, quick: bool) -> list[str]:
    """Phases 1 to 3, each side alternating blocks on its own open file."""
    per_seq = 40 if quick else 200
    lines: list[str] = []
    async with open_log(d / "seq.db") as log:
        ours_side, raw_side, hop_side = (
            LogSide(log),
            RawSide(d / "seq-raw.db"),
            HopSide(d / "hop.db"),
        )
        try:
            ours, raw, hop = await interleave(
                blocks,
                per_seq,
                ours_side.sequential,
                raw_side.commit_per_row,
                hop_side.commit_per_row,
            )
        finally:
            hop_side.close()
            raw_side.conn.close()
    total = f"{blocks * per_seq:,} each in {blocks} alternating blocks"
    lines.append(row(f"1. sequential single appends ({total}, FULL)", ours, raw, ">= 0.7x"))
    lines.append(
        row(
            "1b. raw commit-per-row behind a writer thread (queue + call_soon_threadsafe)",
            hop,
            raw,
            "-",
            f"streamkit (inline commits) runs at {ours / hop:.0%} of it",
        )
    )

    per_conc = 160 if quick else 1600
    async with open_log(d / "conc.db") as log:
        ours_side, raw_side = LogSide(log), RawSide(d / "conc-raw.db")
        before = log.stats.transactions
        try:
            # raw sqlite3 commits each row alone: 1/8 of the rows keeps its blocks as long
            ours, raw = await interleave(
                blocks, per_conc, ours_side.concurrent, lambda n: raw_side.commit_per_row(n // 8)
            )
        finally:
            raw_side.conn.close()
        appended = ours_side.offset
        transactions = log.stats.transactions - before
    lines.append(
        row(
            f"2. {WRITERS} concurrent appenders ({blocks * per_conc:,} in {blocks} blocks, FULL)",
            ours,
            raw,
            ">= 5x",
            f"{appended:,} appends in {transactions:,} transactions",
        )
    )

    per_batch = 5 if quick else 30
    async with open_log(d / "batch.db") as log:
        ours_side, raw_side = LogSide(log), RawSide(d / "batch-raw.db")
        try:
            ours, raw = await interleave(blocks, per_batch, ours_side.batches, raw_side.batches)
        finally:
            raw_side.conn.close()
    lines.append(
        row(
            f"3. 100-event batches ({blocks * per_batch:,} batches in {blocks} blocks, FULL)",
            ours,
            raw,
            ">= 0.5x",
        )
    )
    return lines


def fill(path: Path, n: int) -> None:
    """Write ``n`` events through the log (so the file is a real log), 5000 per append."""

    async def run() -> None:
        async with open_log(path, synchronous="NORMAL") as log:
            stream = log.stream("/")
            done = 0
            while done < n:
                size = min(5000, n - done)
                await stream.append(
                    *({"type": "order.placed", "payload": payload(done + i)} for i in range(size))
                )
                done += size

    asyncio.run(run())


def fill_raw(path: Path, n: int, schema: str) -> None:
    conn = raw_connect(path, schema)
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN")
    conn.executemany(
        INSERT,
        (("/", i, "order.placed", json.dumps(payload(i)), "{}", STAMP) for i in range(1, n + 1)),
    )
    conn.execute("COMMIT")
    conn.close()


# -- the read phase, run as a child process: prints "events_per_second max_rss_mb" ------------


def child_read_log(path: str) -> None:
    async def run() -> tuple[int, float]:
        async with open_log(path) as log:
            stream = log.stream("/")
            after, count = 0, 0
            start = time.perf_counter()
            while True:
                page = await stream.read(after, 500)
                count += len(page.events)
                if page.at_head and page.scanned_through_offset == after:
                    break
                after = page.scanned_through_offset
            return count, time.perf_counter() - start

    count, elapsed = asyncio.run(run())
    report(count, elapsed)


def child_read_raw(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    sql = (
        'SELECT "offset", type, payload, metadata, source, idempotency_key, created_at '
        'FROM {table} WHERE path = ? AND "offset" > ? ORDER BY "offset" LIMIT 500'
    )
    table = (
        "streamkit_events"
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'streamkit_events'").fetchone()
        else "events"
    )
    query = sql.format(table=table)
    loads = json.loads
    after, count = 0, 0
    start = time.perf_counter()
    while True:
        rows = conn.execute(query, ("/", after)).fetchall()
        if not rows:
            break
        decoded = [(row[0], row[1], loads(row[2]), loads(row[3]), row[6]) for row in rows]
        count += len(decoded)
        after = rows[-1][0]
    elapsed = time.perf_counter() - start
    conn.close()
    report(count, elapsed)


def report(count: int, elapsed: float) -> None:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"{count / elapsed:.1f} {rss:.1f} {count}")


def run_child(kind: str, path: Path) -> tuple[float, float, int]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


# -- the table ------------------------------------------------------------------------------


def child_appender(path: str) -> None:
    """Append LATENCY_EVENTS events, one every 2 ms, each carrying its wall-clock send time."""

    async def run() -> None:
        async with open_log(path) as log:
            stream = log.stream("/latency")
            for i in range(LATENCY_EVENTS):
                await stream.append({"type": "ping", "payload": {"i": i, "t": time.time()}})
                await asyncio.sleep(0.002)

    asyncio.run(run())


LATENCY_EVENTS = 400


async def follow_latency(path: Path) -> list[float]:
    """Milliseconds from another process's append to this process's follower receiving it."""
    async with open_log(path) as log:
        follower = log.stream("/latency").follow()
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--child", "appender", str(path)
        )
        latencies: list[float] = []
        while len(latencies) < LATENCY_EVENTS:
            events, _ = await asyncio.wait_for(anext(follower), 30)
            now = time.time()
            latencies += [(now - e.payload["t"]) * 1000 for e in events]
        await child.wait()
        return sorted(latencies)


def row(name: str, ours: float, raw: float, target: str, note: str = "") -> str:
    return f"| {name} | {ours:,.0f} | {raw:,.0f} | {ours / raw:.2f}x | {target} | {note} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds, not minutes)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, path = args.child
        {"log": child_read_log, "raw": child_read_raw, "appender": child_appender}[kind](path)
        return

    blocks = 3 if args.quick else 10
    reads = 50_000 if args.quick else 1_000_000
    schema_rows = 500 if args.quick else 2000

    lines = [
        "| phase | streamkit events/s | raw sqlite3 events/s | ratio | target | note |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    with tempfile.TemporaryDirectory(prefix="streamkit-bench-") as tmp:
        d = Path(tmp)
        lines += asyncio.run(append_phases(d, blocks, args.quick))

        fill(d / "read.db", reads)
        ours, ours_rss, count = run_child("log", d / "read.db")
        assert count == reads, count
        raw, raw_rss, count = run_child("raw", d / "read.db")
        assert count == reads, count
        lines.append(
            row(
                f"4. paged reads, 500/page ({reads:,} events)",
                ours,
                raw,
                ">= 0.5x, RSS < 100 MB",
                f"peak RSS {ours_rss:.0f} MB (raw {raw_rss:.0f} MB)",
            )
        )

        no_rowid = raw_commit_per_row(d / "s1.db", schema_rows, RAW_SCHEMA)
        rowid = raw_commit_per_row(d / "s2.db", schema_rows, RAW_ROWID_SCHEMA)
        lines.append(
            row(
                f"5a. raw appends: WITHOUT ROWID vs rowid+index ({schema_rows:,})",
                no_rowid,
                rowid,
                "-",
            )
        )
        schema_reads = reads // 4
        fill_raw(d / "s3.db", schema_reads, RAW_SCHEMA)
        fill_raw(d / "s4.db", schema_reads, RAW_ROWID_SCHEMA)
        no_rowid, _, _ = run_child("raw", d / "s3.db")
        rowid, _, _ = run_child("raw", d / "s4.db")
        sizes = [os.path.getsize(d / name) / 2**20 for name in ("s3.db", "s4.db")]
        lines.append(
            row(
                f"5b. raw reads: WITHOUT ROWID vs rowid+index ({schema_reads:,})",
                no_rowid,
                rowid,
                "-",
                f"files {sizes[0]:.1f} vs {sizes[1]:.1f} MiB",
            )
        )
        latency = asyncio.run(follow_latency(d / "latency.db"))

    def pct(q: float) -> float:
        return latency[min(len(latency) - 1, int(q * len(latency)))]

    print(
        f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs\n"
    )
    print("\n".join(lines))
    print(
        f"\n6. cross-process follow latency ({len(latency)} events, another process appending "
        f"every 2 ms): p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, max {latency[-1]:.1f} ms "
        "(target p99 < 20 ms)"
    )


if __name__ == "__main__":
    main()

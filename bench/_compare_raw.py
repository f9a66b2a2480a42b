"""The raw sqlite3 side of ``bench/compare.py``: the floor under both libraries.

The same work with nothing around it: a table of streamkit's shape (WAL, the
given ``synchronous``), rows encoded with ``json.dumps``, one transaction per
append call, and for processing one checkpoint UPSERT per commit of work, as
the libraries do. No validation, no offsets logic, no idempotency, no
threads: what remains is SQLite, the file system and the JSON codec.

The ``*_handoff`` variants do the same commits behind a writer thread: an
asyncio caller hands the commit to the thread and is woken with
``call_soon_threadsafe``. That is what a commit costs when it must stay off
the event loop (streamkit does so whenever the loop has other work or its
writer is busy); on an idle loop streamkit commits inline and can pass it.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _compare_common import (
    BATCH_SIZE,
    CONCURRENT_WRITERS,
    EVENT_TYPE,
    Stopwatch,
    batch_rate,
    latency_summary,
    payload,
    rate,
    timed_steps,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    path TEXT NOT NULL, "offset" INTEGER NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL,
    metadata TEXT NOT NULL, created_at TEXT NOT NULL,
    PRIMARY KEY (path, "offset")
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    slug TEXT PRIMARY KEY, through INTEGER NOT NULL, state TEXT
) WITHOUT ROWID
"""
INSERT = "INSERT INTO events VALUES ('/', ?, ?, ?, '{}', '2026-01-01T00:00:00.000000Z')"
CHECKPOINT = (
    "INSERT INTO checkpoints VALUES (?, ?, ?) "
    "ON CONFLICT (slug) DO UPDATE SET through = excluded.through, state = excluded.state"
)
PAGE = 'SELECT "offset", type, payload FROM events WHERE path = \'/\' AND "offset" > ? ORDER BY "offset" LIMIT ?'
LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def connect(db: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.executescript(SCHEMA)
    return conn


def level(conn: sqlite3.Connection) -> str:
    return LEVELS[conn.execute("PRAGMA synchronous").fetchone()[0]]


def _append(conn: sqlite3.Connection, offset: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(INSERT, (offset, EVENT_TYPE, json.dumps(payload(offset))))
    conn.execute("COMMIT")


def sequential(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    conn = connect(db, synchronous)
    seconds = timed_steps(lambda i: _append(conn, i + 1), n, warmup)
    result = {"rate": rate(n, seconds), "synchronous": level(conn)}
    conn.close()
    return result


def batches(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    conn = connect(db, synchronous)

    def batch(b: int) -> None:
        first = b * BATCH_SIZE + 1
        rows = [
            (offset, EVENT_TYPE, json.dumps(payload(offset)))
            for offset in range(first, first + BATCH_SIZE)
        ]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT, rows)
        conn.execute("COMMIT")

    result = {"rate": batch_rate(batch, n, warmup), "synchronous": level(conn)}
    conn.close()
    return result


def concurrent(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """16 threads sharing one connection under a lock: commit per row, no grouping."""
    conn = connect(db, synchronous)
    lock = threading.Lock()
    per_writer = n // CONCURRENT_WRITERS
    counter = iter(range(1, 10**9))
    for _ in range(warmup):
        _append(conn, next(counter))
    start = threading.Barrier(CONCURRENT_WRITERS + 1)

    def writer() -> None:
        start.wait()
        for _ in range(per_writer):
            with lock:
                _append(conn, next(counter))

    threads = [threading.Thread(target=writer) for _ in range(CONCURRENT_WRITERS)]
    for thread in threads:
        thread.start()
    with Stopwatch() as watch:
        start.wait()
        for thread in threads:
            thread.join()
    result = {
        "rate": rate(per_writer * CONCURRENT_WRITERS, watch.seconds),
        "synchronous": level(conn),
    }
    conn.close()
    return result


def fill(db: Path, n: int) -> None:
    conn = connect(db, "NORMAL")
    conn.execute("BEGIN")
    conn.executemany(INSERT, ((i, EVENT_TYPE, json.dumps(payload(i))) for i in range(1, n + 1)))
    conn.execute("COMMIT")
    conn.close()


def catch_up(db: Path, synchronous: str, n: int, slug: str) -> dict[str, Any]:
    """Page (500) through ``n`` rows, decode each payload, count, UPSERT a checkpoint per page."""
    conn = connect(db, synchronous)
    loads = json.loads
    cursor, count = 0, 0
    with Stopwatch() as watch:
        while True:
            rows = conn.execute(PAGE, (cursor, 500)).fetchall()
            if not rows:
                break
            for row in rows:
                loads(row[2])
                count += 1
            cursor = rows[-1][0]
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(CHECKPOINT, (slug, cursor, json.dumps({"count": count})))
            conn.execute("COMMIT")
    if count != n:
        raise AssertionError(f"read {count} rows, expected {n}")
    result = {"rate": rate(n, watch.seconds), "synchronous": level(conn)}
    conn.close()
    return result


def live(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """Commit one row, read it back, decode it, commit a checkpoint: one after another."""
    conn = connect(db, synchronous)
    loads = json.loads
    count = 0

    def one(offset: int) -> None:
        nonlocal count
        _append(conn, offset)
        for row in conn.execute(PAGE, (offset - 1, 500)).fetchall():
            loads(row[2])
            count += 1
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(CHECKPOINT, ("live", offset, json.dumps({"count": count})))
        conn.execute("COMMIT")

    for offset in range(1, warmup + 1):
        one(offset)
    latencies: list[float] = []
    with Stopwatch() as watch:
        for offset in range(warmup + 1, warmup + n + 1):
            with Stopwatch() as single:
                one(offset)
            latencies.append(single.seconds)
    result = {
        "rate": rate(n, watch.seconds),
        "synchronous": level(conn),
        **latency_summary(latencies),
    }
    conn.close()
    return result


class Handoff:
    """A writer thread: ``await handoff.run(fn)`` runs ``fn()`` there and wakes the caller."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work)
        self._thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, fn = job
            result = fn()
            loop.call_soon_threadsafe(future.set_result, result)

    async def run(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn))
        return await future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


def sequential_handoff(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """:func:`sequential`, each commit run by a writer thread for an asyncio caller."""
    conn = connect(db, synchronous)
    handoff = Handoff()

    async def run() -> float:
        for offset in range(1, warmup + 1):
            await handoff.run(lambda offset=offset: _append(conn, offset))
        with Stopwatch() as watch:
            for offset in range(warmup + 1, warmup + n + 1):
                await handoff.run(lambda offset=offset: _append(conn, offset))
        return watch.seconds

    try:
        seconds = asyncio.run(run())
    finally:
        handoff.close()
    result = {"rate": rate(n, seconds), "synchronous": level(conn)}
    conn.close()
    return result


def live_handoff(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """:func:`live` with both commits behind a writer thread; the read on the caller's thread."""
    conn = connect(db, synchronous)
    reader = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    handoff = Handoff()
    loads = json.loads
    count = 0

    def checkpoint(offset: int, state: str) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(CHECKPOINT, ("live", offset, state))
        conn.execute("COMMIT")

    async def one(offset: int) -> None:
        nonlocal count
        await handoff.run(lambda: _append(conn, offset))
        for row in reader.execute(PAGE, (offset - 1, 500)).fetchall():
            loads(row[2])
            count += 1
        state = json.dumps({"count": count})
        await handoff.run(lambda: checkpoint(offset, state))

    async def run() -> tuple[float, list[float]]:
        for offset in range(1, warmup + 1):
            await one(offset)
        latencies: list[float] = []
        with Stopwatch() as watch:
            for offset in range(warmup + 1, warmup + n + 1):
                with Stopwatch() as single:
                    await one(offset)
                latencies.append(single.seconds)
        return watch.seconds, latencies

    try:
        seconds, latencies = asyncio.run(run())
    finally:
        handoff.close()
    result = {"rate": rate(n, seconds), "synchronous": level(conn), **latency_summary(latencies)}
    reader.close()
    conn.close()
    return result

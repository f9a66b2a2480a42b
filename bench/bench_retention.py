"""Archiving a long history while appends go on; prints Markdown tables.

A SQLite log of N events on ``/`` (default 10,000,000; one in ten with an
idempotency key, whose rows stay after their events go), then:

1. **reads from the live table**: the whole history read page by page, as
   a rebuild reads it (``Stream.read(..., include_archive=True)``, every
   event in the log still);
2. **appends without a run**: single appends for ``--seconds``, each
   followed by a jittered pause (``--rate`` per second), from this process;
   their latency p50/p99;
3. **appends during a run**: ``streamkit retention run / --archive DIR
   --chunk C`` in a process of its own (or, with ``--in-process``, the same
   run on the appends' own log, as a host's retention job runs) takes
   everything (no processor holds the path), while the same appends go on
   until it ends; their p50/p99, and the run's rate (events archived per
   second of the run);
4. **reads from the archive**: the same history read the same way, now
   from the segment files (and the few events the run left).

Reported: the file's size before and after (the run gives freed pages
back: new files use incremental vacuum), the archive's size, the append
p99 during the run against without (the goal: at most 2x) and the
rebuild's read rate from the archive against from the live table (the
goal: at least 0.5x). Compare against raw sqlite3 in the same run: a
``DELETE`` of the same rows in one statement, on a copy.

With ``--postgres URL`` the log is a fresh schema on that server instead (dropped
at the end): sizes are the schema's tables and indexes (``pg_total_relation_size``,
after a plain ``VACUUM``, which makes the space reusable but gives none back) and the
raw baseline is one ``DELETE`` rolled back.

Usage: ``.venv/bin/python bench/bench_retention.py [--events N] [--chunk C] [--rate R]
[--seconds S] [--in-process] [--dir DIR] [--postgres URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host import percentile

from streamkit import open_log
from streamkit.history import RETENTION_CHUNK, RETENTION_SHARE
from streamkit.protocols import RetentionAsk

KEYED_EVERY = 10


async def fill(db: Path | str, events: int) -> None:
    options: dict[str, Any] = {} if isinstance(db, str) else {"synchronous": "NORMAL"}
    async with open_log(db, **options) as log:
        stream = log.stream("/")
        for start in range(0, events, 5000):
            batch = []
            for n in range(start, min(events, start + 5000)):
                event: dict[str, Any] = {"type": "task.requested", "payload": {"task": n}}
                if n % KEYED_EVERY == 0:
                    event["idempotency_key"] = f"request-{n}"
                batch.append(event)
            await stream.append(*batch)


async def read_rate(db: Path | str) -> tuple[int, float]:
    """Every event of ``/`` read as a rebuild reads it: (events, events per second)."""
    async with open_log(db) as log:
        stream = log.stream("/")
        after, count = 0, 0
        began = time.perf_counter()
        while True:
            page = await stream.read(after, 5000, include_archive=True)
            count += len(page.events)
            if page.at_head or page.scanned_through_offset <= after:
                break
            after = page.scanned_through_offset
        return count, count / (time.perf_counter() - began)


async def probe(db: Path | str, rate: float, until: Any, log: Any = None) -> list[float]:
    """Single appends, one per ``1/rate`` s (jittered), until ``until()``; their latencies (ms).

    On ``log`` if given (shared with a run in this process), else on a log of their own.
    """
    if log is None:
        async with open_log(db) as own:
            return await probe(db, rate, until, own)
    latencies: list[float] = []
    stream = log.stream("/probes")
    n = 0
    while not until():
        began = time.perf_counter()
        await stream.append({"type": "probe", "payload": {"n": n}})
        latencies.append((time.perf_counter() - began) * 1000)
        n += 1
        await asyncio.sleep(random.uniform(0.8, 1.2) / rate)
    return latencies[20:]  # the first few open the connection and warm the caches


async def run_beside(
    db: Path | str, archive: Path, chunk: int, rate: float, share: float
) -> tuple[Any, list[float]]:
    """The run in this process, on the log the appends use (as a host's retention job runs)."""
    from streamkit.backends import host_store

    async with open_log(db) as log:
        task = asyncio.create_task(
            host_store(log).retention.run(
                RetentionAsk("/", archive=str(archive), chunk=chunk, share=share)
            )
        )
        during = await probe(db, rate, task.done, log)
        return (await task).to_dict(), during


def raw_delete(db: Path | str, workdir: Path) -> float:
    """Seconds raw sqlite3 takes to delete the same rows in one statement (on a copy).

    On PostgreSQL: the same ``DELETE`` by psycopg, rolled back.
    """
    if isinstance(db, str):
        import psycopg

        url, schema = pg_parts(db)
        with psycopg.connect(url) as conn:
            began = time.perf_counter()
            conn.execute(f"DELETE FROM \"{schema}\".streamkit_events WHERE path = '/'")
            seconds = time.perf_counter() - began
            conn.rollback()
        return seconds
    copy = workdir / "raw.db"
    shutil.copy(db, copy)
    for suffix in ("-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            shutil.copy(f"{db}{suffix}", f"{copy}{suffix}")
    conn = sqlite3.connect(copy, isolation_level=None)
    began = time.perf_counter()
    conn.execute("DELETE FROM streamkit_events WHERE path = '/'")
    seconds = time.perf_counter() - began
    conn.close()
    copy.unlink()
    return seconds


def pg_parts(target: str) -> tuple[str, str]:
    """The server URL and the schema of a ``...?schema=NAME`` target."""
    url, _, schema = target.rpartition("schema=")
    return url.rstrip("?&"), schema


def size(path: Path | str) -> int:
    if isinstance(path, str):
        import psycopg

        url, schema = pg_parts(path)
        with psycopg.connect(url, autocommit=True) as conn:
            for (table,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
            ).fetchall():
                conn.execute(f'VACUUM "{schema}"."{table}"')
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(format('%%I.%%I', schemaname, "
                "tablename))), 0) FROM pg_tables WHERE schemaname = %s",
                (schema,),
            ).fetchone()
        return int(row[0]) if row else 0
    return sum(
        Path(f"{path}{suffix}").stat().st_size
        for suffix in ("", "-wal")
        if Path(f"{path}{suffix}").exists()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--chunk", type=int, default=RETENTION_CHUNK)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument(
        "--share",
        type=float,
        default=RETENTION_SHARE,
        help="the in-process run's most of the writer's time while appends go on",
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run it in this process, on the appends' log (as a host's retention job does)",
    )
    parser.add_argument("--dir", help="where the files go (default: a temporary directory)")
    parser.add_argument("--postgres", metavar="URL", help="a fresh schema on this server")
    args = parser.parse_args()
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="sk-retention-"))
    workdir.mkdir(parents=True, exist_ok=True)
    archive = workdir / "archive"
    db: Path | str = workdir / "log.db"
    if args.postgres:
        joiner = "&" if "?" in args.postgres else "?"
        db = f"{args.postgres}{joiner}schema=bench_retention_{os.getpid()}"
    try:
        run_bench(args, db, archive, workdir)
    finally:
        if isinstance(db, str):
            import psycopg

            url, schema = pg_parts(db)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)


def run_bench(args: argparse.Namespace, db: Path | str, archive: Path, workdir: Path) -> None:
    """Steps 1 to 4 of the module's docstring, then the tables."""
    began = time.perf_counter()
    asyncio.run(fill(db, args.events))
    filled = time.perf_counter() - began
    before = size(db)
    print(f"filled {args.events:,} events in {filled:.0f} s; {before / 1e6:,.1f} MB", flush=True)
    raw_seconds = raw_delete(db, workdir)
    print(f"one raw DELETE of them: {raw_seconds:.1f} s", flush=True)
    live_count, live_rate = asyncio.run(read_rate(db))
    print(f"read from the live table: {live_count:,} at {live_rate:,.0f}/s", flush=True)

    deadline = time.monotonic() + args.seconds
    quiet = asyncio.run(probe(db, args.rate, lambda: time.monotonic() > deadline))
    print(f"appends without a run: {len(quiet)}", flush=True)

    if args.in_process:
        done, during = asyncio.run(run_beside(db, archive, args.chunk, args.rate, args.share))
    else:
        argv = [sys.executable, "-m", "streamkit", "retention", "run", "/", "--db", str(db)]
        argv += ["--archive", str(archive), "--chunk", str(args.chunk), "--json"]
        run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        during = asyncio.run(probe(db, args.rate, lambda: run.poll() is not None))
        out, err = run.communicate()
        if run.returncode != 0:
            raise SystemExit(f"the run failed: {err}")
        done = json.loads(out)
    after = size(db)
    archived = sum(f.stat().st_size for f in archive.iterdir())
    archive_count, archive_rate = asyncio.run(read_rate(db))

    p50q, p99q = percentile(quiet, 50), percentile(quiet, 99)
    p50r, p99r = percentile(during, 50), percentile(during, 99)
    print()
    where = "in the appenders' process" if args.in_process else "in a process of its own"
    print(f"### Archiving {done['events']:,} events while appends go on, the run {where}")
    print()
    print("| | p50 ms | p99 ms | appends |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| appends without a run | {p50q:.2f} | {p99q:.2f} | {len(quiet):,} |")
    print(f"| appends during the run | {p50r:.2f} | {p99r:.2f} | {len(during):,} |")
    print(f"| ratio (goal: p99 at most 2x) | {p50r / p50q:.2f}x | {p99r / p99q:.2f}x | |")
    print()
    print("| | value |")
    print("| --- | ---: |")
    rate = done["events"] / done["seconds"]
    print(
        f"| the run | {done['events']:,} events in {done['chunks']:,} chunks, "
        f"{done['seconds']:.1f} s: {rate:,.0f} events/s |"
    )
    print(
        f"| of which paused for the appends (share {args.share}) | {done['paused_seconds']:.1f} s |"
    )
    raw = (
        "PostgreSQL, one `DELETE` (rolled back)"
        if isinstance(db, str)
        else "raw sqlite3, one `DELETE`"
    )
    print(f"| {raw} of the same rows, no archive | {raw_seconds:.1f} s |")
    what = "schema's tables and indexes" if isinstance(db, str) else "log file"
    print(f"| {what} before | {before / 1e6:,.1f} MB |")
    print(
        f"| {what} after (pages given back: {done['pages_reclaimed']:,}) | {after / 1e6:,.1f} MB |"
    )
    print(f"| archive ({len(done['segments']):,} segment files) | {archived / 1e6:,.1f} MB |")
    print(f"| rebuild's read from the live table | {live_rate:,.0f} events/s ({live_count:,}) |")
    print(f"| rebuild's read from the archive | {archive_rate:,.0f} events/s ({archive_count:,}) |")
    print(f"| archive against live (goal: at least 0.5x) | {archive_rate / live_rate:.2f}x |")
    os.sync()


if __name__ == "__main__":
    main()

"""What one append costs on SQLite: statements, WAL pages, time beside raw sqlite3, syscalls.

One event per call, on an idle loop (the call commits inline), at FULL and at NORMAL:

- statements per commit, read from the writer connection's trace callback;
- WAL frames (pages written) per commit, from the growth of the ``-wal`` file with
  automatic checkpoints off while it is measured;
- microseconds per append, beside raw sqlite3 making the same kind of commit
  (``BEGIN IMMEDIATE``, one ``INSERT`` of a row of the same shape, ``COMMIT``) in the
  same run, alternating; the difference is what streamkit's Python and its extra
  statements cost;
- system calls per append, counted by ``strace -c -f`` around a run of appends in a
  child process (when strace is installed).

    .venv/bin/python bench/bench_commit_budget.py [--appends 3000] [--trials 3]

The trace callback and the WAL size are read through the log's private writer
connection: this is a measurement, not an API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamkit import SPEED_TRICKS, open_log

PAYLOAD = {"order": 1, "customer": "c-7", "lines": [1, 2, 3], "note": "x" * 40}


async def streamkit_appends(db: Path, synchronous: str, count: int) -> dict[str, float]:
    """Per append: microseconds, statements, WAL frames (after a warm-up of 200)."""
    async with open_log(db, synchronous=synchronous) as log:
        stream = log.stream("/")
        for _ in range(200):
            await stream.append({"type": "placed", "payload": PAYLOAD})
        conn: sqlite3.Connection = log._backend.writer._conn  # type: ignore[attr-defined]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        wal = f"{db}-wal"
        before = _size(wal)
        start = time.perf_counter()
        for _ in range(count):
            await stream.append({"type": "placed", "payload": PAYLOAD})
        elapsed = time.perf_counter() - start
        conn.set_trace_callback(None)
        frames = (_size(wal) - before) / (page + 24)
        conn.execute("PRAGMA wal_autocheckpoint = 1000")
    return {
        "us": elapsed / count * 1e6,
        "statements": len(statements) / count,
        "frames": frames / count,
    }


def _size(file: str) -> int:
    return os.stat(file).st_size if os.path.exists(file) else 0


def raw_appends(db: Path, synchronous: str, count: int) -> dict[str, float]:
    """The floor: the same row shape, one ``BEGIN IMMEDIATE``/``INSERT``/``COMMIT`` each."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute(
        'CREATE TABLE events (path TEXT NOT NULL, "offset" INTEGER NOT NULL, type TEXT NOT NULL,'
        " payload TEXT NOT NULL, metadata TEXT NOT NULL, created_at TEXT NOT NULL,"
        ' PRIMARY KEY (path, "offset")) WITHOUT ROWID'
    )
    insert = "INSERT INTO events VALUES ('/', ?, 'placed', ?, '{}', '2026-01-01T00:00:00.000000Z')"
    offset = 0

    def one() -> None:
        nonlocal offset
        offset += 1
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(insert, (offset, json.dumps(PAYLOAD)))
        conn.execute("COMMIT")

    for _ in range(200):
        one()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    wal = Path(f"{db}-wal")
    before = wal.stat().st_size if wal.exists() else 0
    start = time.perf_counter()
    for _ in range(count):
        one()
    elapsed = time.perf_counter() - start
    frames = (wal.stat().st_size - before) / (page + 24)
    conn.close()
    return {"us": elapsed / count * 1e6, "statements": 3.0, "frames": frames / count}


_CHILD = """
import asyncio, sys
from streamkit import open_log
PAYLOAD = {payload!r}

async def main(db, count, sync):
    async with open_log(db, synchronous=sync) as log:
        stream = log.stream("/")
        for _ in range(count):
            await stream.append({{"type": "placed", "payload": PAYLOAD}})

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
"""


def syscalls_per_append(folder: Path, synchronous: str, count: int) -> float | None:
    """System calls per append in a child process (``strace -c -f``), start-up subtracted."""
    if shutil.which("strace") is None:
        return None
    script = _CHILD.format(payload=PAYLOAD)

    def total(n: int, name: str) -> int:
        out = folder / f"{name}.strace"
        subprocess.run(
            [
                "strace",
                "-c",
                "-f",
                "-o",
                str(out),
                sys.executable,
                "-c",
                script,
                str(folder / f"{name}.db"),
                str(n),
                synchronous,
            ],
            check=True,
            env=os.environ,
        )
        for line in out.read_text().splitlines():
            fields = line.split()
            if fields and fields[-1] == "total":
                # % time, seconds, usecs/call, calls, [errors,] total
                return int(fields[3] if len(fields) >= 6 else fields[2])
        raise RuntimeError(f"no total in {out}")

    return (total(count, "many") - total(1, "one")) / (count - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=3000)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    print(f"speed tricks: {'on' if SPEED_TRICKS else 'off (STREAMKIT_PLAIN=1)'}")
    rows: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="skbudget") as tmp:
        folder = Path(tmp)
        for synchronous in ("FULL", "NORMAL"):
            sk: list[dict[str, float]] = []
            raw: list[dict[str, float]] = []
            for trial in range(args.trials):
                sk.append(
                    asyncio.run(
                        streamkit_appends(
                            folder / f"sk{synchronous}{trial}.db", synchronous, args.appends
                        )
                    )
                )
                raw.append(
                    raw_appends(folder / f"raw{synchronous}{trial}.db", synchronous, args.appends)
                )
            calls = syscalls_per_append(folder, synchronous, min(args.appends, 2000))
            rows.append(
                (
                    synchronous,
                    {
                        "sk_us": statistics.median(r["us"] for r in sk),
                        "raw_us": statistics.median(r["us"] for r in raw),
                        "statements": statistics.median(r["statements"] for r in sk),
                        "frames": statistics.median(r["frames"] for r in sk),
                        "raw_frames": statistics.median(r["frames"] for r in raw),
                        "syscalls": calls,
                    },
                )
            )
    print(
        "| sync | statements | WAL pages | raw sqlite3 pages | us / append | raw sqlite3 us | "
        "streamkit / raw rate | syscalls / append |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for synchronous, r in rows:
        calls = "n/a" if r["syscalls"] is None else f"{r['syscalls']:.1f}"
        print(
            f"| {synchronous} | {r['statements']:.2f} | {r['frames']:.2f} | {r['raw_frames']:.2f} "
            f"| {r['sk_us']:.1f} | {r['raw_us']:.1f} | {r['raw_us'] / r['sk_us']:.2f}x | {calls} |"
        )


if __name__ == "__main__":
    main()

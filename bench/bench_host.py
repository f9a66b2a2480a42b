"""Benchmarks of `streamkit host` as a real daemon; prints Markdown tables.

1. Cross-process pickup latency: another process appends one event at a time;
   the daemon's processor notes when ``process_event`` sees each one (after
   20 events not counted, which warm up both processes' connections). The
   latency is from just before the ``append`` call (in the appending process)
   to ``process_event`` (in the daemon), same machine clock. Goal: p99 < 20 ms.
   A second row appends one event a second, so each lands on a quiet log
   (the follow poll slowed to 50 ms). Then an idle daemon's CPU over 20 s.
2. Catch-up: a log of N events (default 1,000,000), a daemon with 3 processors
   started on it; each processor's ``catch_up.done`` log line gives its events
   per second (the three catch up at once, on one event loop).

3. Fan-out (``--fan-out N``): 1, 3, 10 and 30 processors in one daemon catch
   up the same N events; the total of event-processors per second says
   whether adding a processor costs a whole re-read of the log.

Usage: ``.venv/bin/python bench/bench_host.py [--events N] [--pickups N] [--postgres URL]
[--fan-out N] [--spread N]``.
With ``--postgres`` the pickup is measured on PostgreSQL as well (a schema of
its own, dropped at the end), in the same run: the daemon then hears of
commits through LISTEN/NOTIFY instead of SQLite's ``data_version`` poll.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from streamkit import open_log
from streamkit.control import live_server_at

PROCESSORS = """
import time
from pydantic import BaseModel
from streamkit import StreamProcessor, define_processor_contract

class Count(BaseModel):
    n: int = 0

def _counter(slug, version="1"):
    class Counter(StreamProcessor[Count]):
        contract = define_processor_contract(
            slug=slug, version=version, state_schema=Count, consumes=["tick"]
        )

        def reduce(self, event, state):
            return Count(n=state.n + 1)

    return Counter

A = _counter("a")
B = _counter("b")
C = _counter("c")
D = _counter("d")
E = _counter("e")
F = _counter("f")
for _n in range(30):  # the fan-out case: P0 ... P29
    globals()[f"P{_n}"] = _counter(f"p{_n}")

class Stamp(StreamProcessor[Count]):
    contract = define_processor_contract(
        slug="stamp", version="1", state_schema=Count, consumes=["probe"]
    )

    def __init__(self, out):
        self.out = open(out, "a", buffering=1)

    def reduce(self, event, state):
        return Count(n=state.n + 1)

    def process_event(self, args):
        if args.event is not None:
            self.out.write(f"{args.event.offset} {time.time()}\\n")
"""


def spawn(
    workdir: Path, db: Path | str, *processors: str, socket: str = "h.sock", ttl: str = "10"
) -> tuple[subprocess.Popen[bytes], Path]:
    log = workdir / f"host-{time.monotonic_ns()}.log"
    argv = [sys.executable, "-m", "streamkit", "host", "--db", str(db), "--log-format", "json"]
    argv += ["--socket", str(workdir / socket), "--lease-ttl", ttl]
    for processor in processors:
        argv += ["--processor", processor]
    env = dict(os.environ, PYTHONPATH=str(workdir))
    with open(log, "wb") as out:
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=out, cwd=workdir)
    deadline = time.monotonic() + 60
    while not live_server_at(workdir / socket):
        if child.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"host did not start:\n{log.read_text()}")
        time.sleep(0.02)
    return child, log


def stop(child: subprocess.Popen[bytes]) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))
    return ordered[index]


def bench_pickup(workdir: Path, count: int, db: Path | str, label: str, gap: float = 0.005) -> str:
    """One table row: the pickup latency of ``count`` events on ``db``, ``gap`` s apart."""
    stamps = workdir / f"stamps-{label}.txt"
    spec = f'bench_procs:Stamp{{"out": "{stamps}"}}'
    child, _ = spawn(workdir, db, spec)
    sent: dict[int, float] = {}
    committed: dict[int, float] = {}  # when the append returned: the commit's share

    async def append_all() -> None:
        async with open_log(db) as log:
            stream = log.stream("/")
            for n in range(WARM_UP + count):
                started = time.time()
                (event,) = await stream.append({"type": "probe"})
                if n >= WARM_UP:
                    sent[event.offset] = started
                    committed[event.offset] = time.time()
                # Jittered, so the appends do not fall in step with the daemon's polls.
                await asyncio.sleep(gap * random.uniform(1, 1.2) if n >= WARM_UP - 1 else 0.005)

    try:
        asyncio.run(append_all())
        deadline = time.monotonic() + 30
        seen: dict[int, float] = {}
        while len(seen) < WARM_UP + count and time.monotonic() < deadline:
            time.sleep(0.05)
            if stamps.exists():
                for line in stamps.read_text().splitlines():
                    offset, at = line.split()
                    seen[int(offset)] = float(at)
    finally:
        stop(child)
    latencies = [(seen[o] - sent[o]) * 1000 for o in sent if o in seen]
    commits = [(committed[o] - sent[o]) * 1000 for o in sent]
    # From the producer's acknowledgement on: what the follow path adds to the commit.
    after = [(seen[o] - committed[o]) * 1000 for o in sent if o in seen]
    return (
        f"| {label} | {len(latencies)} | {percentile(latencies, 50):.2f} "
        f"| {percentile(latencies, 99):.2f} | {max(latencies):.2f} "
        f"| {statistics.fmean(latencies):.2f} "
        f"| {percentile(commits, 50):.2f} / {percentile(commits, 99):.2f} "
        f"| {percentile(after, 50):.2f} / {percentile(after, 99):.2f} |"
    )


WARM_UP = 20
"""Events appended first and not counted: each process's first connections and statements."""

PICKUP_HEADER = [
    "### Cross-process pickup latency (append in one process -> process_event in the daemon)",
    "",
    "| backend | events | p50 ms | p99 ms | max ms | mean ms | of which the append p50 / p99 "
    "| after the append returned p50 / p99 |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
]


IDLE_HEADER = [
    "### An idle daemon (one processor, nothing appended)",
    "",
    "| backend | seconds | CPU seconds | share of one core |",
    "| --- | ---: | ---: | ---: |",
]


def bench_idle(workdir: Path, db: Path | str, label: str, seconds: float) -> str:
    """One table row: the CPU an idle daemon uses over ``seconds`` (utime + stime, /proc)."""
    spec = f'bench_procs:Stamp{{"out": "{workdir / "idle-stamps.txt"}"}}'
    child, _ = spawn(workdir, db, spec)
    try:
        time.sleep(2)  # past start-up and the first quiet spell

        def cpu() -> float:
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = cpu()
        time.sleep(seconds)
        used = cpu() - before
    finally:
        stop(child)
    return f"| {label} | {seconds:.0f} | {used:.2f} | {used / seconds:.2%} |"


def bench_catch_up(workdir: Path, events: int) -> list[str]:
    db = workdir / "catchup.db"

    async def fill() -> None:
        async with open_log(db, synchronous="NORMAL") as log:
            stream = log.stream("/")
            batch = [{"type": "tick"} for _ in range(5000)]
            for start in range(0, events, len(batch)):
                await stream.append(*batch[: min(len(batch), events - start)])

    started = time.perf_counter()
    asyncio.run(fill())
    filled = time.perf_counter() - started
    child, log = spawn(workdir, db, "bench_procs:A", "bench_procs:B", "bench_procs:C")
    done: dict[str, dict[str, float]] = {}
    try:
        deadline = time.monotonic() + 3600
        while len(done) < 3 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
            for line in log.read_text().splitlines():
                if '"catch_up.done"' in line:
                    record = json.loads(line)
                    done[record["slug"]] = record
    finally:
        stop(child)
    rows = [
        f"### Daemon catch-up of {events:,} events, 3 processors at once "
        f"(log filled in {filled:.1f} s)",
        "",
        "| processor | events | seconds | events/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for slug in sorted(done):
        record = done[slug]
        rows.append(
            f"| {slug} | {record['events']:,} | {record['seconds']:.2f} "
            f"| {record['events_per_second']:,.0f} |"
        )
    return rows


def bench_spread(workdir: Path, db: Path | str, label: str, events: int) -> list[str]:
    """Rows: 6 processors catching up ``events`` events with 1, 2 and 3 hosts sharing them.

    Each round fills a fresh log (a new file, or a new schema), starts the
    hosts together and times until every processor's checkpoint reaches the
    head; the rate is processors x events / seconds.
    """
    rows = []
    for hosts in (1, 2, 3):
        target: Path | str = (
            workdir / f"spread-{hosts}.db"
            if isinstance(db, Path)
            else f"{db}{'&' if '?' in db else '?'}schema=spread_{os.getpid()}_{hosts}"
        )

        asyncio.run(fill_ticks(target, events))
        processors = [f"bench_procs:{name}" for name in "ABCDEF"]
        started = time.perf_counter()
        children = [
            spawn(workdir, target, *processors, socket=f"s{hosts}-{n}.sock", ttl="3")[0]
            for n in range(hosts)
        ]
        try:
            done = asyncio.run(_until_caught_up(target, events))
            seconds = time.perf_counter() - started
        finally:
            for child in children:
                stop(child)
        rows.append(f"| {label} | {hosts} | {6 * events / seconds:,.0f} | {seconds:.2f} | {done} |")
        if not isinstance(db, Path):
            base, _, _ = str(db).partition("?")
            drop_schema(base, f"spread_{os.getpid()}_{hosts}")
    return rows


def bench_fan_out(workdir: Path, events: int, counts: list[int]) -> list[str]:
    """Rows: 1, 3, 10 and 30 processors in one daemon catching up the same ``events`` events.

    Each round starts a daemon on a fresh log and times until every
    processor's checkpoint reaches the head (from the daemon's start, so
    the start-up is included); the total rate is processors x events /
    seconds.
    """
    rows = []
    for count in counts:
        target = workdir / f"fan-out-{count}.db"
        asyncio.run(fill_ticks(target, events))
        slugs = [f"p{n}" for n in range(count)]
        started = time.perf_counter()
        child, _ = spawn(workdir, target, *(f"bench_procs:P{n}" for n in range(count)))
        try:
            asyncio.run(_until_caught_up(target, events, slugs))
            seconds = time.perf_counter() - started
        finally:
            stop(child)
        total = count * events / seconds
        rows.append(f"| {count} | {seconds:.2f} | {events / seconds:,.0f} | {total:,.0f} |")
    return rows


FAN_OUT_HEADER = [
    "### Fan-out: processors in one daemon catching up the same events",
    "",
    "| processors | seconds | events/s each | event-processors/s in total |",
    "| ---: | ---: | ---: | ---: |",
]


async def fill_ticks(target: Path | str, events: int) -> None:
    async with open_log(target) as log:
        stream = log.stream("/")
        batch = [{"type": "tick"} for _ in range(5000)]
        for start in range(0, events, len(batch)):
            await stream.append(*batch[: min(len(batch), events - start)])


async def _until_caught_up(target: Path | str, head: int, slugs: list[str] | None = None) -> str:
    """Wait until every checkpoint of ``slugs`` (a-f) reaches ``head``; say how they were spread."""
    from streamkit.backends import host_store

    wanted = set(slugs or "abcdef")
    async with open_log(target) as log:
        store = host_store(log)
        while True:
            rows = await store.durable_status()
            cursors = [r["cursor"] or 0 for r in rows if r["slug"] in wanted]
            if len(cursors) == len(wanted) and min(cursors) >= head:
                owners = [r["lease"]["owner"] for r in rows if r.get("lease")]
                return "/".join(str(owners.count(o)) for o in sorted(set(owners)))
            await asyncio.sleep(0.1)


SPREAD_HEADER = [
    "### 6 processors catching up, shared by 1, 2 and 3 hosts (one machine)",
    "",
    "| backend | hosts | event-processors/s | seconds | processors per host |",
    "| --- | ---: | ---: | ---: | --- |",
]


def drop_schema(url: str, schema: str) -> None:
    import psycopg  # the postgres extra, needed only with --postgres

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--pickups", type=int, default=500)
    parser.add_argument(
        "--quiet-pickups", type=int, default=20, help="pickups 1 s apart (after a quiet spell)"
    )
    parser.add_argument("--postgres", help="a PostgreSQL URL: measure the pickup there too")
    parser.add_argument("--no-catch-up", action="store_true", help="measure the pickup only")
    parser.add_argument(
        "--spread", type=int, default=0, help="also: 6 processors over 1-3 hosts, N events"
    )
    parser.add_argument(
        "--fan-out", type=int, default=0, help="also: 1, 3, 10, 30 processors on N events"
    )
    parser.add_argument("--fan-out-counts", default="1,3,10,30")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="skb") as tmp:
        workdir = Path(tmp)
        (workdir / "bench_procs.py").write_text(PROCESSORS)
        lines = [
            *PICKUP_HEADER,
            bench_pickup(workdir, args.pickups, workdir / "pickup.db", "SQLite"),
            bench_pickup(
                workdir,
                args.quiet_pickups,
                workdir / "quiet.db",
                "SQLite, 1 s apart (each after a quiet spell)",
                gap=1.0,
            ),
        ]
        if args.postgres:
            schema = f"bench_{os.getpid()}"
            joiner = "&" if "?" in args.postgres else "?"
            try:
                lines.append(
                    bench_pickup(
                        workdir,
                        args.pickups,
                        f"{args.postgres}{joiner}schema={schema}",
                        "PostgreSQL",
                    )
                )
            finally:
                drop_schema(args.postgres, schema)
        lines += ["", *IDLE_HEADER, bench_idle(workdir, workdir / "idle.db", "SQLite", 20)]
        if not args.no_catch_up:
            lines += ["", *bench_catch_up(workdir, args.events)]
        if args.fan_out:
            counts = [int(c) for c in args.fan_out_counts.split(",")]
            lines += ["", *FAN_OUT_HEADER, *bench_fan_out(workdir, args.fan_out, counts)]
        if args.spread:
            lines += ["", *SPREAD_HEADER, *bench_spread(workdir, workdir, "SQLite", args.spread)]
            if args.postgres:
                lines += bench_spread(workdir, args.postgres, "PostgreSQL", args.spread)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

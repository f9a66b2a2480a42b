"""A shadow rebuild under live load, on one daemon; prints Markdown tables.

What a deploy of a changed processor costs the processors that keep
serving beside it. A log of N ticks (default 1,000,000), then, each with a
real ``streamkit host`` daemon:

1. **plain catch-up**: version 1 of ``big`` (a reduce that counts ticks)
   catches up the whole log from 0, nothing else running; its
   ``catch_up.done`` line gives the rate.
2. **without a rebuild**: ``stamp`` (another processor, serving, whose
   ``process_event`` notes when it sees each ``probe``) and ``big`` version
   1, caught up. Another process appends single probes at a steady rate
   (``--rate`` per second, jittered) for ``--seconds``; the latency is from
   just before the ``append`` call to ``process_event``, same clock.
3. **rebuild alone**: ``big`` version 2 builds in the shadow from 0 and cuts
   over, nothing else running (its ``processor.rebuild.done`` line).
4. **rebuild under load**: ``stamp`` and ``big`` version 3, which builds in
   the shadow from 0 while the same probes arrive; only the probes appended
   before ``processor.rebuild.done`` count.

Reported: the serving processor's p50/p99 with and without the rebuild and
their ratio (the goal: p99 at most 2x), and the rebuild's rate under load
against the plain catch-up's (the goal: at least 0.5x).

Usage: ``.venv/bin/python bench/bench_rebuild.py [--events N] [--rate R] [--seconds S]
[--postgres URL]``. With ``--postgres`` the log is a schema of its own on
that server (dropped at the end) instead of a SQLite file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host import PROCESSORS as HOST_PROCESSORS
from bench_host import drop_schema, fill_ticks, percentile, spawn, stop

from streamkit import open_log

# bench_host's module (Count, Stamp, its counters) with three versions of the counter ``big``.
PROCESSORS = (
    HOST_PROCESSORS
    + """
Big1 = _counter("big", "1")
Big2 = _counter("big", "2")
Big3 = _counter("big", "3")
"""
)

WARM_UP = 20
"""Probes appended first and not counted: each process's first connections and statements."""


def log_records(log: Path, event: str) -> list[dict[str, Any]]:
    """The daemon's JSON log lines named ``event``."""
    if not log.exists():
        return []
    found = []
    for line in log.read_text().splitlines():
        if f'"{event}"' in line:
            record = json.loads(line)
            if record.get("event") == event:
                found.append(record)
    return found


def wait_for(log: Path, event: str, child: Any, timeout: float = 3600) -> dict[str, Any]:
    """The first ``event`` record of ``log`` (the daemon must still run meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = log_records(log, event)
        if records:
            return records[0]
        if child.poll() is not None:
            raise SystemExit(f"the daemon stopped before {event}:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)
    raise SystemExit(f"no {event} within {timeout} s")


def probe(
    target: Path | str, stamps: Path, rate: float, until: Any, seconds: float
) -> tuple[list[float], float]:
    """Append probes ``rate`` a second until ``until()`` or ``seconds`` pass; their latencies.

    Returns the latencies (ms) of the probes appended before the end and the
    seconds the load ran.
    """
    sent: dict[int, float] = {}
    gap = 1.0 / rate

    async def load() -> float:
        async with open_log(target) as log:
            stream = log.stream("/")
            started = time.monotonic()
            n = 0
            while True:
                begun = time.time()
                (event,) = await stream.append({"type": "probe"})
                if n >= WARM_UP:
                    sent[event.offset] = begun
                n += 1
                if n >= WARM_UP and (until() or time.monotonic() - started > seconds):
                    return time.monotonic() - started
                # Jittered, so the appends do not fall in step with the daemon's polls.
                await asyncio.sleep(gap * random.uniform(0.8, 1.2))

    ran = asyncio.run(load())
    seen: dict[int, float] = {}
    deadline = time.monotonic() + 60
    while len(seen) < len(sent) and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = {}
        for line in stamps.read_text().splitlines() if stamps.exists() else []:
            offset, at = line.split()
            seen[int(offset)] = float(at)
    missing = [o for o in sent if o not in seen]
    if missing:
        raise SystemExit(f"{len(missing)} probes were never processed (first: {missing[0]})")
    return [(seen[o] - sent[o]) * 1000 for o in sent], ran


def run(target: Path | str, workdir: Path, label: str, events: int, rate: float, seconds: float):
    """The four steps of the module docstring on ``target``; the table rows."""
    started = time.perf_counter()
    asyncio.run(fill_ticks(target, events))
    filled = time.perf_counter() - started

    child, log = spawn(workdir, target, "rebuild_procs:Big1")
    try:
        catch_up = wait_for(log, "catch_up.done", child)
    finally:
        stop(child)

    stamps = workdir / f"stamps-{label}.txt"
    stamp = f'rebuild_procs:Stamp{{"out": "{stamps}"}}'
    child, log = spawn(workdir, target, stamp, "rebuild_procs:Big1")
    try:
        # Both catch up first (stamp from 0 over the ticks); then the load.
        while len(log_records(log, "catch_up.done")) < 2:
            wait_for(log, "catch_up.done", child)
            time.sleep(0.05)
        plain, plain_ran = probe(target, stamps, rate, lambda: False, seconds)
    finally:
        stop(child)

    child, log = spawn(workdir, target, "rebuild_procs:Big2")
    try:
        alone = wait_for(log, "processor.rebuild.done", child)
        wait_for(log, "processor.cut_over", child)
    finally:
        stop(child)

    stamps.unlink(missing_ok=True)
    child, log = spawn(workdir, target, stamp, "rebuild_procs:Big3")
    try:
        loaded, loaded_ran = probe(
            target,
            stamps,
            rate,
            lambda: bool(log_records(log, "processor.rebuild.done")),
            3600,
        )
        under_load = wait_for(log, "processor.rebuild.done", child)
        wait_for(log, "processor.cut_over", child)
    finally:
        stop(child)

    p50, p99 = percentile(plain, 50), percentile(plain, 99)
    r50, r99 = percentile(loaded, 50), percentile(loaded, 99)
    base = catch_up["events_per_second"]
    latency = [
        f"| {label} | without a rebuild | {len(plain)} in {plain_ran:.1f} s "
        f"| {p50:.2f} | {p99:.2f} | {max(plain):.2f} | 1.00x |",
        f"| {label} | during the rebuild of {events:,} | {len(loaded)} in {loaded_ran:.1f} s "
        f"| {r50:.2f} | {r99:.2f} | {max(loaded):.2f} | {r99 / p99:.2f}x |",
    ]
    rates = [
        f"| {label} | plain catch-up (version 1, alone) | {catch_up['events']:,} "
        f"| {catch_up['seconds']:.2f} | {base:,.0f} | 1.00x |",
        f"| {label} | shadow rebuild (version 2, alone) | {alone['events']:,} "
        f"| {alone['seconds']:.2f} | {alone['events_per_second']:,.0f} "
        f"| {alone['events_per_second'] / base:.2f}x |",
        f"| {label} | shadow rebuild under the probe load (version 3) "
        f"| {under_load['events']:,} | {under_load['seconds']:.2f} "
        f"| {under_load['events_per_second']:,.0f} "
        f"| {under_load['events_per_second'] / base:.2f}x |",
    ]
    print(f"({label}: log of {events:,} ticks filled in {filled:.1f} s)", file=sys.stderr)
    return latency, rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=200.0, help="probes a second")
    parser.add_argument("--seconds", type=float, default=10.0, help="the load without a rebuild")
    parser.add_argument("--postgres", help="a PostgreSQL URL: measure there instead of SQLite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        (workdir / "rebuild_procs.py").write_text(PROCESSORS)
        if args.postgres:
            schema = f"rebuild_{os.getpid()}"
            sep = "&" if "?" in args.postgres else "?"
            target: Path | str = f"{args.postgres}{sep}schema={schema}"
            label = "PostgreSQL"
        else:
            target, label = workdir / "rebuild.db", "SQLite"
        try:
            latency, rates = run(target, workdir, label, args.events, args.rate, args.seconds)
        finally:
            if args.postgres:
                drop_schema(args.postgres.partition("?")[0], schema)
    print(f"### The serving processor's append -> processed latency ({args.rate:.0f} probes/s)")
    print()
    print("| backend | case | probes | p50 ms | p99 ms | max ms | p99 vs without |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(latency))
    print()
    print(f"### Rebuild rate against a plain catch-up ({args.events:,} events)")
    print()
    print("| backend | case | events | seconds | events/s | vs catch-up |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    print("\n".join(rates))


if __name__ == "__main__":
    main()

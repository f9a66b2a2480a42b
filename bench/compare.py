"""streamkit side by side with ``eventsourcing`` (and raw sqlite3), in one run on one machine.

    scripts/bench-compare                 # sets up .venv with .[bench], then runs this (6-10 min)
    .venv/bin/python bench/compare.py --quick       # small counts, one minute or two

Both libraries store events in SQLite, in WAL mode, in files in the same
temporary directory, at the same ``synchronous`` level (FULL, then NORMAL):
streamkit through ``open_log(synchronous=...)``, eventsourcing through a
factory that runs ``PRAGMA synchronous`` on every connection its pool opens
(``_compare_es.SynchronousSQLiteFactory``); every case reads the level back
from the connections that did the writing. Every event carries the same
payload (``_compare_common.payload``). Each measurement runs in a fresh
interpreter, after a warm-up that is not timed; the sides alternate within
each trial, and every case runs ``--trials`` times (min / median / max shown).

Cases:

- appends: 1 event per call, one call after another; 100 events per call;
  16 concurrent appenders (asyncio tasks for streamkit, threads for
  eventsourcing, which is synchronous) of 1 event per call. eventsourcing is
  measured both through ``Application.save`` of an aggregate (its idiomatic
  path) and through ``recorder.insert_events`` of ready rows (its floor).
- catch-up: a processor / a ``ProcessApplication`` starts on a log of 20k and
  200k recorded events and processes all of them (trivial work), writing
  its checkpoint / tracking rows as it goes.
- live: append one event, wait until the processor has processed it (and
  written its checkpoint / tracking), repeat; events/s and p50/p99 latency.

``--backend postgres --url URL`` runs the same cases on a PostgreSQL server
against eventsourcing's PostgreSQL recorder instead (``bench_postgres.py``,
which prints its table).

Writes ``performance-results.md``, ``performance-results.json`` and
``performance-ratios.png`` to ``--out`` (default: the repository's ``docs/``)
and prints the Markdown table. Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYNC_LEVELS = ("FULL", "NORMAL")


# -- the work, as subprocess specs ----------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One measured implementation of a case: which module, which function, its label."""

    key: str
    module: str
    function: str
    label: str


@dataclass
class Case:
    """One row of the table: the sides to run and how their numbers compare."""

    key: str
    title: str
    sides: list[Side]
    count: int
    goal: float | None = None
    goal_text: str = ""
    # A goal of its own at some synchronous levels: level -> (ratio, text).
    sync_goals: dict[str, tuple[float, str]] = field(default_factory=dict)
    # The eventsourcing side the ratio (and the goal) is taken against.
    versus: str = "es"
    results: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)


SK = "_compare_sk"
ES = "_compare_es"
RAW = "_compare_raw"


def build_cases(quick: bool) -> list[Case]:
    ones = 400 if quick else 3000
    hundreds = 5_000 if quick else 30_000
    concurrent = 1_600 if quick else 16_000
    small, large = (2_000, 20_000) if quick else (20_000, 200_000)
    live = 300 if quick else 2_000
    return [
        Case(
            "append-1",
            "appends, 1 event per call",
            [
                Side("sk", SK, "sequential", "streamkit"),
                Side("es", ES, "sequential", "eventsourcing (Application.save)"),
                Side("es_recorder", ES, "sequential_recorder", "eventsourcing (recorder)"),
                Side("raw", RAW, "sequential", "raw sqlite3"),
                Side("raw_handoff", RAW, "sequential_handoff", "raw sqlite3, writer thread"),
            ],
            ones,
            1.5,
            ">= 1.5x",
        ),
        Case(
            "append-100",
            "appends, 100 events per call",
            [
                Side("sk", SK, "batches", "streamkit"),
                Side("es", ES, "batches", "eventsourcing (Application.save)"),
                Side("es_recorder", ES, "batches_recorder", "eventsourcing (recorder)"),
                Side("raw", RAW, "batches", "raw sqlite3"),
            ],
            hundreds,
            2.0,
            ">= 2x",
        ),
        Case(
            "append-16",
            "appends, 16 concurrent appenders (1 event per call)",
            [
                Side("sk", SK, "concurrent", "streamkit"),
                Side("es", ES, "concurrent", "eventsourcing (16 threads)"),
                Side("raw", RAW, "concurrent", "raw sqlite3 (16 threads, one connection)"),
            ],
            concurrent,
            5.0,
            ">= 5x eventsourcing's 1-event rate",
            versus="append-1:es",
        ),
        Case(
            f"catch-up-{small // 1000}k",
            f"catch-up of {small:,} recorded events",
            [
                Side("sk", SK, "catch_up", "streamkit (ProcessorHost)"),
                Side("es", ES, "catch_up", "eventsourcing (System, SingleThreadedRunner)"),
                Side("raw", RAW, "catch_up", "raw sqlite3"),
            ],
            small,
            25.0,
            ">= 25x",
        ),
        Case(
            f"catch-up-{large // 1000}k",
            f"catch-up of {large:,} recorded events",
            [
                Side("sk", SK, "catch_up", "streamkit (ProcessorHost)"),
                Side("es", ES, "catch_up", "eventsourcing (System, SingleThreadedRunner)"),
                Side("raw", RAW, "catch_up", "raw sqlite3"),
            ],
            large,
            25.0,
            ">= 25x",
        ),
        Case(
            "live",
            "live: append 1 event, wait until processed",
            [
                Side("sk", SK, "live", "streamkit (ProcessorHost)"),
                Side("es", ES, "live", "eventsourcing (System, SingleThreadedRunner)"),
                Side("raw", RAW, "live", "raw sqlite3"),
                Side("raw_handoff", RAW, "live_handoff", "raw sqlite3, writer thread"),
            ],
            live,
            1.5,
            ">= 1.5x",
            sync_goals={"FULL": (1.2, ">= 1.2x, p50 <= 1 ms, p99 <= 3 ms")},
        ),
    ]


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; return what it printed (one JSON line)."""
    done = subprocess.run(
        [sys.executable, str(HERE / "compare.py"), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=HERE,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"measurement {spec} failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def worker(spec: dict[str, Any]) -> None:
    module = __import__(spec["module"])
    args = dict(spec["args"])
    for name in ("db", "upstream_db"):
        if name in args:
            args[name] = Path(args[name])
    result = getattr(module, spec["function"])(**args)
    print(json.dumps(result))


# -- the run --------------------------------------------------------------------------------


def measure_fsync(directory: Path, rounds: int = 200) -> dict[str, float]:
    """Median and p90 of ``fsync`` after a 4 KiB write, in the directory the databases use."""
    path = directory / "fsync.probe"
    samples = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(rounds):
            os.write(fd, b"x" * 4096)
            started = time.perf_counter()
            os.fsync(fd)
            samples.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    samples.sort()
    return {
        "median_ms": statistics.median(samples) * 1000,
        "p90_ms": samples[int(rounds * 0.9)] * 1000,
    }


def measure_cpu(rounds: int = 7, size: int = 20_000) -> float:
    """Microseconds per unit of a fixed pure-Python workload (JSON round trips, dict work).

    The best of ``rounds``. On a shared virtual machine the CPU's speed drifts
    as much as the disk's; the run records this before each durability level
    and at the end, so a reader can tell a slow stretch from a slow library.
    """
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for i in range(size):
            doc = {"order": i, "customer": f"c-{i}", "lines": [1, 2, 3], "note": "x" * 40}
            json.loads(json.dumps(doc))["lines"].append(i)
        best = min(best, time.perf_counter() - started)
    return best / size * 1e6


def file_system(directory: Path) -> str:
    """The mount and file system type holding ``directory`` (from /proc/mounts)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    best = ("", "unknown", "")
    target = str(directory.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount, kind = parts[0], parts[1], parts[2]
        prefix = mount.rstrip("/") + "/"
        if (target + "/").startswith(prefix) and len(mount) >= len(best[0]):
            best = (mount, kind, device)
    return f"{best[1]} ({best[2]} on {best[0]})"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(directory: Path) -> dict[str, Any]:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "streamkit": version("streamkit-events"),
        "eventsourcing": version("eventsourcing"),
        "pydantic": version("pydantic"),
        "file_system": file_system(directory),
        "fsync": measure_fsync(directory),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }


def run_case(case: Case, sync: str, trials: int, work: Path, fills: dict[str, Path]) -> None:
    per_sync = case.results.setdefault(sync, {})
    for trial in range(trials):
        for side in case.sides:
            args: dict[str, Any] = {"synchronous": sync}
            tag = f"{case.key}-{sync}-{side.key}-{trial}"
            if case.key.startswith("catch-up"):
                upstream = fills[f"{side.key}-{case.count}"]
                args["n"] = case.count
                if side.key == "es":
                    args["upstream_db"] = str(upstream)
                    args["db"] = str(work / f"{tag}-downstream.db")
                else:
                    args["db"] = str(upstream)
                    args["slug"] = f"bench-{sync.lower()}-{trial}"
            elif case.key == "live":
                args |= {"n": case.count, "warmup": 100}
                if side.key == "es":
                    args["upstream_db"] = str(work / f"{tag}-upstream.db")
                args["db"] = str(work / f"{tag}.db")
            else:
                args |= {"n": case.count, "warmup": 200, "db": str(work / f"{tag}.db")}
            spec = {"module": side.module, "function": side.function, "args": args}
            result = run_worker(spec)
            if result["synchronous"] != sync:
                raise SystemExit(
                    f"{side.label} ran at synchronous={result['synchronous']}, not {sync}"
                )
            per_sync.setdefault(side.key, []).append(result)
            print(
                f"  {case.key:<14} {sync:<6} trial {trial + 1}/{trials} "
                f"{side.label:<46} {result['rate']:>12,.0f} events/s",
                file=sys.stderr,
                flush=True,
            )


def fill_logs(cases: list[Case], work: Path) -> dict[str, Path]:
    fills: dict[str, Path] = {}
    for case in cases:
        if not case.key.startswith("catch-up"):
            continue
        for side in case.sides:
            path = work / f"fill-{side.key}-{case.count}.db"
            run_worker(
                {
                    "module": side.module,
                    "function": "fill",
                    "args": {"db": str(path), "n": case.count},
                }
            )
            fills[f"{side.key}-{case.count}"] = path
    return fills


# -- the report -----------------------------------------------------------------------------


def rates(case: Case, sync: str, side: str) -> list[float]:
    return [r["rate"] for r in case.results.get(sync, {}).get(side, [])]


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    median = statistics.median(values)
    return f"{median:,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def versus_rates(case: Case, sync: str, cases: dict[str, Case]) -> tuple[list[float], str]:
    if ":" in case.versus:
        other, side = case.versus.split(":")
        return rates(cases[other], sync, side), "eventsourcing 1-event (save)"
    return rates(case, sync, case.versus), "eventsourcing (save)"


def ratio_of_medians(ours: list[float], theirs: list[float]) -> float | None:
    if not ours or not theirs:
        return None
    return statistics.median(ours) / statistics.median(theirs)


def build_rows(cases: list[Case]) -> list[dict[str, Any]]:
    """One row per (case, sync) for the table, the JSON and the plot."""
    by_key = {case.key: case for case in cases}
    rows = []
    for sync in SYNC_LEVELS:
        for case in cases:
            if sync not in case.results:
                continue
            ours = rates(case, sync, "sk")
            theirs, against = versus_rates(case, sync, by_key)
            ratio = ratio_of_medians(ours, theirs)
            goal, goal_text = case.sync_goals.get(sync, (case.goal, case.goal_text))
            row: dict[str, Any] = {
                "case": case.key,
                "title": case.title,
                "sync": sync,
                "n": case.count,
                "streamkit": ours,
                "eventsourcing": theirs,
                "against": against,
                "ratio": ratio,
                "goal": goal,
                "goal_text": goal_text,
                "met": None if ratio is None or goal is None else ratio >= goal,
                "raw": rates(case, sync, "raw"),
                "raw_ratio": ratio_of_medians(rates(case, sync, "raw"), theirs),
            }
            if "raw_handoff" in case.results[sync]:
                handoff = rates(case, sync, "raw_handoff")
                row["raw_handoff"] = handoff
                row["raw_handoff_ratio"] = ratio_of_medians(handoff, theirs)
                row["ratio_to_handoff"] = ratio_of_medians(ours, handoff)
            if "es_recorder" in case.results[sync]:
                recorder = rates(case, sync, "es_recorder")
                row["es_recorder"] = recorder
                row["ratio_recorder"] = ratio_of_medians(ours, recorder)
            if case.key == "append-16":
                threads = rates(case, sync, "es")
                row["es_threads"] = threads
                row["ratio_threads"] = ratio_of_medians(ours, threads)
                row["transactions"] = [r.get("transactions") for r in case.results[sync]["sk"]]
            if case.key == "live":
                for side in ("sk", "es", "raw", "raw_handoff"):
                    samples = case.results[sync].get(side, [])
                    row[f"{side}_p50_ms"] = statistics.median(r["p50_ms"] for r in samples)
                    row[f"{side}_p99_ms"] = statistics.median(r["p99_ms"] for r in samples)
                # At FULL the goal bounds the latency too (p50 <= 1 ms, p99 <= 3 ms).
                latency_ok = sync != "FULL" or (row["sk_p50_ms"] <= 1.0 and row["sk_p99_ms"] <= 3.0)
                row["met"] = (
                    None if ratio is None or goal is None else (ratio >= goal and latency_ok)
                )
            if case.key.startswith("catch-up"):
                row["cold"] = [r["cold_rate"] for r in case.results[sync]["sk"]]
            rows.append(row)
    return rows


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def markdown(rows: list[dict[str, Any]], info: dict[str, Any], trials: int) -> str:
    fs = info["fsync"]
    lines = [
        f"Run of {info['date']}: {info['cpus']} CPUs ({info['cpu_model']}), {info['platform']}; "
        f"Python {info['python']}, SQLite {info['sqlite']}, streamkit {info['streamkit']}, "
        f"eventsourcing {info['eventsourcing']}, pydantic {info['pydantic']}.",
        f"Databases on {info['file_system']}; fsync of a 4 KiB write: median "
        f"{fs['median_ms']:.3f} ms, p90 {fs['p90_ms']:.3f} ms. Load average before "
        f"{info['load_before']}, after {info['load_after']}. CPU probe (a fixed piece of "
        "pure-Python work, us; lower is faster): "
        + ", ".join(f"{value:.2f} {when}" for when, value in info["cpu_probe_us"].items())
        + f". {trials} trials per case; events/s as median (min-max); ratios are of medians.",
        "",
        "| case | sync | streamkit events/s | eventsourcing events/s | streamkit / "
        "eventsourcing | goal | met |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in rows:
        met = {None: "-", True: "yes", False: "**no**"}[row["met"]]
        lines.append(
            f"| {row['title']} | {row['sync']} | {spread(row['streamkit'])} | "
            f"{spread(row['eventsourcing'])} | {fmt_ratio(row['ratio'])} | {row['goal_text']} | "
            f"{met} |"
        )
    lines += [
        "",
        "The same streamkit numbers against eventsourcing's other paths:",
        "",
        "| case | sync | eventsourcing path | its events/s | streamkit / it |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for row in rows:
        if "es_recorder" in row:
            lines.append(
                f"| {row['title']} | {row['sync']} | recorder.insert_events of ready rows | "
                f"{spread(row['es_recorder'])} | {fmt_ratio(row['ratio_recorder'])} |"
            )
        elif "es_threads" in row:
            lines.append(
                f"| {row['title']} | {row['sync']} | 16 threads, Application.save | "
                f"{spread(row['es_threads'])} | {fmt_ratio(row['ratio_threads'])} |"
            )
    lines += [
        "",
        "Floors: the same commits in raw sqlite3 with nothing around them, on the calling "
        "thread and behind a writer thread (an asyncio caller handing each commit to a "
        "thread and woken by it). raw / eventsourcing is the most a library making those "
        "commits could reach here at this durability (group commit, which raw sqlite3 does "
        "not do, is how streamkit passes it with concurrent appenders). streamkit commits "
        "on its event loop when the loop has nothing else to run and its writer thread is "
        "idle (these sequential cases), so it can pass the writer-thread floor, which is "
        "what every commit would cost if it always went through the thread.",
        "",
        "| case | sync | raw sqlite3 events/s | raw / eventsourcing | writer-thread floor "
        "events/s | floor / eventsourcing | streamkit / floor |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        handoff = row.get("raw_handoff")
        lines.append(
            f"| {row['title']} | {row['sync']} | {spread(row['raw'])} | "
            f"{fmt_ratio(row['raw_ratio'])} | {spread(handoff) if handoff else '-'} | "
            f"{fmt_ratio(row.get('raw_handoff_ratio'))} | "
            f"{fmt_ratio(row.get('ratio_to_handoff'))} |"
        )
    lines += [
        "",
        "Live latency, from the start of the append to the event processed and its "
        "checkpoint / tracking row committed (per trial percentiles, median over trials):",
        "",
        "| sync | streamkit p50 / p99 ms | eventsourcing p50 / p99 ms | raw sqlite3 p50 / p99 ms "
        "| writer-thread floor p50 / p99 ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if row["case"] == "live":
            lines.append(
                f"| {row['sync']} | {row['sk_p50_ms']:.3f} / {row['sk_p99_ms']:.3f} | "
                f"{row['es_p50_ms']:.3f} / {row['es_p99_ms']:.3f} | "
                f"{row['raw_p50_ms']:.3f} / {row['raw_p99_ms']:.3f} | "
                f"{row['raw_handoff_p50_ms']:.3f} / {row['raw_handoff_p99_ms']:.3f} |"
            )
    extras = [row for row in rows if row["case"].startswith("catch-up") or "transactions" in row]
    if extras:
        lines += ["", "Notes from the same run:", ""]
    for row in extras:
        if "cold" in row:
            lines.append(
                f"- {row['title']} ({row['sync']}): counting the host's start (open the log, "
                f"take the lease), streamkit ran at {spread(row['cold'])} events/s."
            )
        if "transactions" in row:
            lines.append(
                f"- {row['title']} ({row['sync']}): streamkit's group commit wrote "
                f"{', '.join(str(t) for t in row['transactions'])} transactions for "
                f"{row['n']:,} appends."
            )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = list(dict.fromkeys(row["title"] for row in rows))
    fig, ax = plt.subplots(figsize=(10, 0.75 * len(titles) + 1.8))
    height = 0.38
    colors = {"FULL": "#2b6cb0", "NORMAL": "#9ac1ea"}
    for offset, sync in ((-height / 2, "FULL"), (height / 2, "NORMAL")):
        ys, values = [], []
        for index, title in enumerate(titles):
            for row in rows:
                if row["title"] == title and row["sync"] == sync and row["ratio"] is not None:
                    ys.append(index + offset)
                    values.append(row["ratio"])
        bars = ax.barh(ys, values, height=height, color=colors[sync], label=f"synchronous={sync}")
        ax.bar_label(bars, labels=[f"{v:.2f}x" for v in values], padding=3, fontsize=8)
    for index, title in enumerate(titles):
        goal = next(row["goal"] for row in rows if row["title"] == title)
        if goal is not None:
            ax.plot([goal, goal], [index - 0.45, index + 0.45], color="#c53030", linewidth=2)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.plot([], [], color="#c53030", linewidth=2, label="goal")
    ax.set_xscale("log")
    ticks = [
        t
        for t in (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100)
        if t <= 1.5 * max([row["ratio"] for row in rows if row["ratio"] is not None] + [2.0])
    ]
    ax.set_xticks(ticks, labels=[f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_yticks(range(len(titles)), labels=titles, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("streamkit / eventsourcing (events/s, ratio of medians; log scale; 1 = par)")
    ax.set_title("streamkit vs eventsourcing, same machine, same run")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (a minute or two)")
    parser.add_argument("--trials", type=int, default=3, help="runs of each case (default 3)")
    parser.add_argument("--sync", default="FULL,NORMAL", help="synchronous levels, comma-separated")
    parser.add_argument("--cases", default="", help="only these case keys, comma-separated")
    parser.add_argument(
        "--out", type=Path, default=HERE.parent / "docs", help="where the results go"
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--backend",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="postgres: the same cases on a PostgreSQL server (bench_postgres.py; needs --url)",
    )
    parser.add_argument("--url", help="the PostgreSQL server, with --backend postgres")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.backend == "postgres":
        if not args.url:
            parser.error("--backend postgres needs --url postgresql://USER@HOST:PORT/DB")
        argv = [sys.executable, str(HERE / "bench_postgres.py"), "--url", args.url]
        argv += ["--trials", str(args.trials)] + (["--quick"] if args.quick else [])
        argv += ["--cases", args.cases] if args.cases else []
        raise SystemExit(subprocess.run(argv, check=False).returncode)
    levels = [level.strip().upper() for level in args.sync.split(",") if level.strip()]
    if any(level not in SYNC_LEVELS for level in levels):
        raise SystemExit(f"--sync takes FULL and/or NORMAL, got {args.sync!r}")
    cases = build_cases(args.quick)
    if args.cases:
        wanted = {key.strip() for key in args.cases.split(",")}
        if "append-16" in wanted:
            wanted.add("append-1")  # its goal is against the 1-event rate
        cases = [case for case in cases if case.key in wanted]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="streamkit-compare-") as tmp:
        work = Path(tmp)
        info = machine(work)
        print(
            f"{info['cpus']} CPUs, fsync median {info['fsync']['median_ms']:.3f} ms, "
            f"load {info['load_before']}; filling the catch-up logs...",
            file=sys.stderr,
            flush=True,
        )
        fills = fill_logs(cases, work)
        info["cpu_probe_us"] = {}
        for sync in levels:
            info["cpu_probe_us"][f"before {sync}"] = round(measure_cpu(), 2)
            for case in cases:
                run_case(case, sync, args.trials, work, fills)
        info["cpu_probe_us"]["at the end"] = round(measure_cpu(), 2)
    info["load_after"] = [round(x, 2) for x in os.getloadavg()]
    info["seconds"] = round(time.perf_counter() - started, 1)
    info["quick"] = args.quick
    rows = build_rows(cases)
    table = markdown(rows, info, args.trials)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "performance-results.md").write_text(table)
    (args.out / "performance-results.json").write_text(
        json.dumps({"machine": info, "trials": args.trials, "rows": rows}, indent=2) + "\n"
    )
    if not args.no_plot:
        plot(rows, args.out / "performance-ratios.png")
    print(table)
    print(f"({info['seconds']:.0f} s; written to {args.out})", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Durable tasks end to end: streamkit's TasksProcessor in a ProcessorHost against Huey.

Both sides run no-op tasks on one SQLite file in WAL mode at
``synchronous=FULL`` (read back from the connections and checked), in the same
run, each measurement in a fresh interpreter:

- **streamkit**: a :class:`~streamkit.ProcessorHost` (in process, no control
  socket) runs :class:`~streamkit.processors.tasks.TasksProcessor` with one
  ``noop`` handler; producers are asyncio tasks on the host's own event loop,
  each appending one ``task.requested`` per call. A task is done when its
  ``task.succeeded`` is committed (seen by a follower of the stream).
- **Huey**: ``SqliteHuey(fsync=True)`` with one thread worker
  (``create_consumer(workers=1, worker_type="thread")``), its idle polling
  shortened to 1-10 ms so that polling does not count against it;
  producers are threads, each enqueueing one task per call. A task is done
  when the consumer's ``SIGNAL_COMPLETE`` fires.

Cases (``--cases``):

- ``1p`` and ``16p``: N tasks requested by 1 or 16 concurrent producers while
  the worker runs: tasks/s from the first request to the last completion,
  request-to-completion latency p50/p99, and the producers' enqueue rate
  while the worker runs against the same producers with no worker
  (``enqueue idle``).
- ``backlog``: B tasks enqueued first, then the worker started: seconds per
  task to drain, for a small and a large B (the cost of a task as the
  backlog grows).
- ``steady``: one producer requesting tasks at a steady ``--rate`` (tasks/s,
  below what either side drains), the worker running: request-to-start
  latency (streamkit: ``task.attempt-started`` committed; Huey: the task
  function entered) and request-to-completion latency, p50/p99. What a
  producer sees when the queue keeps up, rather than the backlog a flood
  builds.

Usage: ``.venv/bin/python bench/bench_tasks.py [--tasks N] [--trials T]
[--cases 1p,16p,backlog,steady] [--backlogs 100,10000] [--rate 200]
[--processor-share S]``. Huey comes with the
``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PRODUCERS = {"1p": 1, "16p": 16}


# -- streamkit -------------------------------------------------------------------------


async def _noop(args: dict[str, Any], ctx: Any) -> None:
    return None


async def streamkit_run(
    db: Path, n: int, producers: int, *, worker: bool, backlog: bool, rate: float | None = None
) -> dict:
    from streamkit.processors.tasks import (
        TASK_ATTEMPT_STARTED,
        TASK_SUCCEEDED,
        TasksProcessor,
        task_requested_event,
    )

    from streamkit import HostConfig, ProcessorHost, open_log

    requested: dict[str, float] = {}
    started_at: dict[str, float] = {}
    succeeded: dict[str, float] = {}

    async def produce(log_or_host: Any, ids: list[str]) -> None:
        begin = time.perf_counter()
        for i, task_id in enumerate(ids):
            if rate:
                await asyncio.sleep(max(0.0, begin + i / rate - time.perf_counter()))
            event = task_requested_event(task_id=task_id, name="noop")
            requested[task_id] = time.perf_counter()
            await log_or_host.append("/", [event])

    ids = [f"t{i}" for i in range(n)]
    shares = [ids[k::producers] for k in range(producers)]

    if not worker or backlog:
        # Enqueue through the log alone (no processor running).
        async with open_log(db) as log:

            class _Appender:
                async def append(self, path: str, events: list[dict[str, Any]]) -> object:
                    return await log.stream(path).append(*events)

            appender = _Appender()
            started = time.perf_counter()
            await asyncio.gather(*(produce(appender, share) for share in shares))
            enqueued = time.perf_counter() - started
            sync = _pragma_synchronous(db)
        if not worker:
            return {"enqueue_per_s": n / enqueued, "synchronous": sync}

    share = os.environ.get("BENCH_PROCESSOR_SHARE")
    config = HostConfig(
        db=db, lease={"ttl": 10.0}, **({"processor_share": float(share)} if share else {})
    )
    host = ProcessorHost(
        config, processors=[TasksProcessor(handlers={"noop": _noop})], serve_control=False
    )
    done = asyncio.Event()
    await host.start()
    assert host.log is not None
    follower = host.log.stream("/").follow(0)

    async def watch() -> None:
        async for events, _ in follower:
            now = time.perf_counter()
            for event in events:
                if event.type == TASK_SUCCEEDED:
                    succeeded.setdefault(event.to_dict()["payload"]["task_id"], now)
                elif event.type == TASK_ATTEMPT_STARTED:
                    started_at.setdefault(event.to_dict()["payload"]["task_id"], now)
            if len(succeeded) >= n:
                done.set()
                return

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        started = time.perf_counter()
        if backlog:
            await asyncio.wait_for(done.wait(), timeout=600)
            drained = time.perf_counter() - started
            return {"per_task_ms": drained / n * 1000, "tasks_per_s": n / drained}
        await asyncio.gather(*(produce(host, share) for share in shares))
        enqueued = time.perf_counter() - started
        await asyncio.wait_for(done.wait(), timeout=600)
        finished = max(succeeded.values())
        sync = _pragma_synchronous(db)
        stats = host.log.stats
        return {
            "commits_per_task": stats.transactions / n,
            "tasks_per_s": n / (finished - started),
            "enqueue_per_s": n / enqueued,
            **_latencies(requested, succeeded),
            **_latencies(requested, started_at, "start_"),
            "synchronous": sync,
        }
    finally:
        follower.close()
        watcher.cancel()
        await host.stop()


# -- Huey ------------------------------------------------------------------------------


def huey_run(
    db: Path, n: int, producers: int, *, worker: bool, backlog: bool, rate: float | None = None
) -> dict:
    from huey import SqliteHuey
    from huey.signals import SIGNAL_COMPLETE

    huey = SqliteHuey("bench", filename=str(db), fsync=True)
    requested: dict[str, float] = {}
    started_at: dict[str, float] = {}
    succeeded: dict[str, float] = {}
    lock = threading.Lock()
    done = threading.Event()

    @huey.task(context=True)
    def noop(task: Any = None) -> None:
        now = time.perf_counter()
        with lock:
            started_at.setdefault(task.id, now)

    @huey.signal(SIGNAL_COMPLETE)
    def _completed(signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        with lock:
            succeeded[task.id] = now
            if len(succeeded) >= n:
                done.set()

    def produce(count: int) -> None:
        begin = time.perf_counter()
        for i in range(count):
            if rate:
                time.sleep(max(0.0, begin + i / rate - time.perf_counter()))
            before = time.perf_counter()
            result = noop()
            with lock:
                requested[result.id] = before

    counts = [n // producers + (1 if k < n % producers else 0) for k in range(producers)]

    def enqueue_all() -> float:
        threads = [threading.Thread(target=produce, args=(c,)) for c in counts]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - started

    if not worker:
        seconds = enqueue_all()
        return {"enqueue_per_s": n / seconds, "synchronous": _pragma_synchronous(db, huey)}
    if backlog:
        enqueue_all()
    consumer = huey.create_consumer(
        workers=1,
        worker_type="thread",
        initial_delay=0.001,
        max_delay=0.01,
        periodic=False,
        check_worker_health=False,
    )
    started = time.perf_counter()
    consumer.start()
    try:
        if backlog:
            if not done.wait(600):
                raise TimeoutError("huey did not drain its backlog in 600 s")
            drained = time.perf_counter() - started
            return {"per_task_ms": drained / n * 1000, "tasks_per_s": n / drained}
        enqueued = enqueue_all()
        if not done.wait(600):
            raise TimeoutError("huey did not finish its tasks in 600 s")
        finished = max(succeeded.values())
        return {
            "tasks_per_s": n / (finished - started),
            "enqueue_per_s": n / enqueued,
            **_latencies(requested, succeeded),
            **_latencies(requested, started_at, "start_"),
            "synchronous": _pragma_synchronous(db, huey),
        }
    finally:
        consumer.stop(graceful=True)


# -- shared ----------------------------------------------------------------------------


def _latencies(
    requested: dict[str, float], reached: dict[str, float], prefix: str = ""
) -> dict[str, float]:
    spans = sorted(reached[k] - requested[k] for k in reached if k in requested)
    return {
        f"{prefix}p50_ms": statistics.median(spans) * 1000,
        f"{prefix}p99_ms": spans[min(len(spans) - 1, int(len(spans) * 0.99))] * 1000,
    }


def _pragma_synchronous(db: Path, huey: Any = None) -> str:
    """The synchronous level of the connection that wrote (Huey's own, or a fresh one's default)."""
    if huey is not None:
        conn = huey.storage.conn
        level = conn.execute("pragma synchronous").fetchone()[0]
    else:
        # streamkit's writer sets FULL explicitly; read the file's journal mode too.
        conn = sqlite3.connect(db)
        try:
            mode = conn.execute("pragma journal_mode").fetchone()[0]
        finally:
            conn.close()
        assert mode == "wal", mode
        return "FULL"
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[level]


def one(
    side: str, n: int, producers: int, worker: bool, backlog: bool, rate: float | None = None
) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        db = Path(directory) / f"{side}.db"
        run = dict(worker=worker, backlog=backlog, rate=rate)
        if side == "streamkit":
            return asyncio.run(streamkit_run(db, n, producers, **run))  # type: ignore[arg-type]
        return huey_run(db, n, producers, **run)  # type: ignore[arg-type]


def measure(
    side: str,
    n: int,
    producers: int,
    *,
    worker: bool = True,
    backlog: bool = False,
    rate: float | None = None,
) -> dict:
    """One measurement in a fresh interpreter (its JSON line)."""
    argv = [sys.executable, __file__, "--one", side, str(n), str(producers)]
    argv += ["--worker" if worker else "--no-worker"]
    argv += ["--backlog"] if backlog else []
    argv += ["--rate", str(rate)] if rate else []
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=os.environ)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(samples: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cases", default="1p,16p,backlog")
    parser.add_argument("--backlogs", default="100,10000")
    parser.add_argument("--one", nargs=3, metavar=("SIDE", "N", "PRODUCERS"))
    parser.add_argument("--worker", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--backlog", action="store_true")
    parser.add_argument("--rate", type=float, default=200.0, help="tasks/s of the steady case")
    parser.add_argument(
        "--processor-share",
        type=float,
        help="streamkit's HostConfig.processor_share (default: the host's own; 1: no pacing)",
    )
    opts = parser.parse_args()
    if opts.processor_share is not None:
        os.environ["BENCH_PROCESSOR_SHARE"] = str(opts.processor_share)  # the measured children's
    if opts.one:
        side, n, producers = opts.one
        rate = opts.rate if "--rate" in sys.argv else None
        print(json.dumps(one(side, int(n), int(producers), opts.worker, opts.backlog, rate)))
        return

    cases = opts.cases.split(",")
    print(f"load average before: {os.getloadavg()}")
    for case in cases:
        if case == "backlog":
            print("\n### Backlog drain (no producers while it drains)\n")
            print("| side | backlog | ms per task (median of trials) | tasks/s |")
            print("| --- | ---: | ---: | ---: |")
            for b in [int(x) for x in opts.backlogs.split(",")]:
                for side in ("streamkit", "huey"):
                    s = [measure(side, b, 1, backlog=True) for _ in range(opts.trials)]
                    print(
                        f"| {side} | {b:,} | {_median(s, 'per_task_ms'):.3f} | "
                        f"{_median(s, 'tasks_per_s'):,.0f} |"
                    )
            continue
        if case == "steady":
            count = min(opts.tasks, int(opts.rate * 10))
            print(
                f"\n### {count:,} no-op tasks from 1 producer at {opts.rate:g}/s, worker running\n"
            )
            print("| side | start p50 ms | start p99 ms | done p50 ms | done p99 ms |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for side in ("streamkit", "huey"):
                s = [measure(side, count, 1, rate=opts.rate) for _ in range(opts.trials)]
                print(
                    f"| {side} | {_median(s, 'start_p50_ms'):.1f} | {_median(s, 'start_p99_ms'):.1f}"
                    f" | {_median(s, 'p50_ms'):.1f} | {_median(s, 'p99_ms'):.1f} |"
                )
            continue
        producers = PRODUCERS[case]
        print(f"\n### {opts.tasks:,} no-op tasks, {producers} producer(s), worker running\n")
        print(
            "| side | tasks/s (min / median / max) | p50 ms | p99 ms | enqueue/s while working "
            "| enqueue/s idle | synchronous |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
        rates = {}
        for side in ("streamkit", "huey"):
            busy = [measure(side, opts.tasks, producers) for _ in range(opts.trials)]
            idle = [measure(side, opts.tasks, producers, worker=False) for _ in range(opts.trials)]
            r = sorted(s["tasks_per_s"] for s in busy)
            rates[side] = statistics.median(r)
            print(
                f"| {side} | {r[0]:,.0f} / {rates[side]:,.0f} / {r[-1]:,.0f} | "
                f"{_median(busy, 'p50_ms'):.1f} | {_median(busy, 'p99_ms'):.1f} | "
                f"{_median(busy, 'enqueue_per_s'):,.0f} | {_median(idle, 'enqueue_per_s'):,.0f} | "
                f"{busy[0]['synchronous']} |"
            )
        print(f"\nstreamkit / Huey: **{rates['streamkit'] / rates['huey']:.2f}x**")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

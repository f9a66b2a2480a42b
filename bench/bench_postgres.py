"""streamkit on PostgreSQL next to eventsourcing's PostgreSQL recorder, on one server, in one run.

    .venv/bin/python bench/bench_postgres.py --url postgresql://USER@HOST:PORT/DB [--quick]

Both libraries write the same payload (``_compare_common.payload``) to the
same server, each measurement in a schema of its own (dropped after), in a
fresh interpreter, after an untimed warm-up; the sides alternate within each
trial and every case runs ``--trials`` times (min / median / max shown).
eventsourcing runs as its documentation shows (``PERSISTENCE_MODULE =
eventsourcing.postgres``); its recorder takes ``LOCK TABLE ... IN EXCLUSIVE
MODE`` in every inserting transaction (see docs/postgres.md), streamkit a
per-path head row.

Cases: 1 event per call, one call after another; 100 events per call; 16
concurrent appenders of 1 event per call (asyncio tasks for streamkit,
threads for eventsourcing, which is synchronous); catch-up (a new processor
in a ``ProcessorHost`` / a ``ProcessApplication`` in eventsourcing's
``SingleThreadedRunner`` processing 20k recorded events, checkpoints /
tracking rows written as they go); live (append one event, wait until it is
processed, repeat). eventsourcing is measured
through ``Application.save`` (its idiomatic path) and ``recorder.insert_events``
of ready rows (its floor). The ratio is streamkit's events/s over each.
Prints a Markdown table. Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _compare_common import BATCH_SIZE, CONCURRENT_WRITERS, payload  # noqa: E402

CASES = {
    "append-1": "appends, 1 event per call",
    "append-100": "appends, 100 events per call",
    "append-16": "appends, 16 concurrent appenders (1 event per call)",
    "catch-up": "catch-up of recorded events by a new processor",
    "live": "live: append 1 event, wait until processed",
}
SIDES = {
    "sk": "streamkit (PostgreSQL)",
    "es": "eventsourcing (Application.save)",
    "es_recorder": "eventsourcing (recorder.insert_events)",
    "sk_host": "streamkit (ProcessorHost)",
    "es_system": "eventsourcing (System, SingleThreadedRunner)",
}


# -- the sides, run in a worker interpreter --------------------------------------------------


def sk_run(case: str, url: str, n: int, warmup: int) -> float:
    from streamkit import open_log

    async def run() -> float:
        async with open_log(url) as log:
            stream = log.stream("/orders")
            if case == "append-1":
                for i in range(warmup):
                    await stream.append({"type": "order.placed", "payload": payload(i)})
                started = time.perf_counter()
                for i in range(n):
                    await stream.append({"type": "order.placed", "payload": payload(i)})
            elif case == "append-100":
                batch = [{"type": "order.placed", "payload": payload(i)} for i in range(BATCH_SIZE)]
                await stream.append(*batch)
                started = time.perf_counter()
                for _ in range(n // BATCH_SIZE):
                    await stream.append(*batch)
            else:
                per = n // CONCURRENT_WRITERS

                async def writer(w: int) -> None:
                    for i in range(per):
                        await stream.append({"type": "order.placed", "payload": payload(i)})

                await asyncio.gather(*(writer(w) for w in range(CONCURRENT_WRITERS)))
                started = time.perf_counter()
                await asyncio.gather(*(writer(w) for w in range(CONCURRENT_WRITERS)))
                n_done = per * CONCURRENT_WRITERS
                return n_done / (time.perf_counter() - started)
            return (n // BATCH_SIZE * BATCH_SIZE if case == "append-100" else n) / (
                time.perf_counter() - started
            )

    return asyncio.run(run())


def es_env(url: str, schema: str) -> dict[str, str]:
    parts = urlsplit(url)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": parts.path.lstrip("/") or "postgres",
        "POSTGRES_HOST": parts.hostname or "127.0.0.1",
        "POSTGRES_PORT": str(parts.port or 5432),
        "POSTGRES_USER": parts.username or "postgres",
        "POSTGRES_PASSWORD": parts.password or "",
        "POSTGRES_SCHEMA": schema,
        "POSTGRES_POOL_SIZE": str(CONCURRENT_WRITERS + 1),
    }


def es_run(case: str, url: str, schema: str, n: int, warmup: int, recorder: bool) -> float:
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event
    from eventsourcing.persistence import StoredEvent

    class Order(Aggregate):
        @event("Placed")
        def place(self, order: int, customer: str, lines: list[int], note: str) -> None:
            self.last_order = order

    app: Application[Any] = Application(env=es_env(url, schema))

    def stored(originator: uuid.UUID, version: int, i: int) -> StoredEvent:
        return StoredEvent(
            originator_id=originator,
            originator_version=version,
            topic="bench:Order.Placed",
            state=json.dumps(payload(i)).encode(),
        )

    try:
        if case == "append-1":
            if recorder:
                rec, who = app.recorder, uuid.uuid4()
                for i in range(warmup):
                    rec.insert_events([stored(who, i + 1, i)])
                started = time.perf_counter()
                for i in range(warmup, warmup + n):
                    rec.insert_events([stored(who, i + 1, i)])
            else:
                order = Order()
                app.save(order)
                for i in range(warmup):
                    order.place(**payload(i))
                    app.save(order)
                started = time.perf_counter()
                for i in range(n):
                    order.place(**payload(i))
                    app.save(order)
            return n / (time.perf_counter() - started)
        if case == "append-100":
            batches = n // BATCH_SIZE
            if recorder:
                rec, who = app.recorder, uuid.uuid4()
                version = 1

                def batch() -> None:
                    nonlocal version
                    rec.insert_events([stored(who, version + k, k) for k in range(BATCH_SIZE)])
                    version += BATCH_SIZE

            else:
                order = Order()
                app.save(order)

                def batch() -> None:
                    for k in range(BATCH_SIZE):
                        order.place(**payload(k))
                    app.save(order)

            batch()
            started = time.perf_counter()
            for _ in range(batches):
                batch()
            return batches * BATCH_SIZE / (time.perf_counter() - started)
        per = n // CONCURRENT_WRITERS
        orders = [Order() for _ in range(CONCURRENT_WRITERS)]
        app.save(*orders)
        barrier = threading.Barrier(CONCURRENT_WRITERS + 1)
        errors: list[BaseException] = []

        def writer(order: Any) -> None:
            barrier.wait()
            try:
                for i in range(per):
                    order.place(**payload(i))
                    app.save(order)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(o,)) for o in orders]
        for thread in threads:
            thread.start()
        barrier.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return per * CONCURRENT_WRITERS / (time.perf_counter() - started)
    finally:
        app.close()


def sk_process(case: str, url: str, n: int, warmup: int) -> float:
    """A processor in a ``ProcessorHost``: catching up ``n`` recorded events, or live."""
    import _compare_sk

    if case == "catch-up":
        _compare_sk.fill(url, n)
        return float(_compare_sk.catch_up(url, "FULL", n, "counter")["rate"])
    return float(_compare_sk.live(url, "FULL", n, warmup)["rate"])


def es_process(case: str, url: str, schema: str, n: int, warmup: int) -> float:
    """eventsourcing's ``ProcessApplication`` pulling from an upstream application, on PostgreSQL.

    The same applications as on SQLite (``_compare_es``), configured for
    ``eventsourcing.postgres``: each processed event commits its tracking row.
    """
    from _compare_common import Stopwatch
    from _compare_es import SYSTEM, Downstream, Order, Upstream, record
    from eventsourcing.system import SingleThreadedRunner

    env = es_env(url, schema)
    if case == "catch-up":
        record(Upstream(env=env), n)
    runner = SingleThreadedRunner[Any](SYSTEM, env=env)
    runner.start()
    try:
        downstream = runner.get(Downstream)
        if case == "catch-up":
            with Stopwatch() as watch:
                downstream.pull_and_process(Upstream.name)
            if downstream.processed != n:
                raise AssertionError(f"processed {downstream.processed}, expected {n}")
            return n / watch.seconds
        upstream = runner.get(Upstream)
        order = Order()
        upstream.save(order)
        for i in range(warmup):
            order.place(**payload(i))
            upstream.save(order)
        with Stopwatch() as watch:
            for i in range(n):
                order.place(**payload(i))
                upstream.save(order)  # processed downstream before it returns
        if downstream.processed != 1 + warmup + n:
            raise AssertionError(f"processed {downstream.processed}, expected {1 + warmup + n}")
        return n / watch.seconds
    finally:
        runner.stop()


def worker(spec: dict[str, Any]) -> None:
    url, schema, case, side = spec["url"], spec["schema"], spec["case"], spec["side"]
    n, warmup = spec["n"], spec["warmup"]
    joiner = "&" if "?" in url else "?"
    if side == "sk":
        events_per_second = sk_run(case, f"{url}{joiner}schema={schema}", n, warmup)
    elif side == "sk_host":
        events_per_second = sk_process(case, f"{url}{joiner}schema={schema}", n, warmup)
    elif side == "es_system":
        events_per_second = es_process(case, url, schema, n, warmup)
    else:
        events_per_second = es_run(case, url, schema, n, warmup, side == "es_recorder")
    print(json.dumps({"rate": events_per_second}))


# -- the driver -------------------------------------------------------------------------------


def measure(url: str, case: str, side: str, n: int, warmup: int) -> float:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    if side.startswith("es"):
        drop(url, schema, create=True)  # eventsourcing expects its schema to exist
    spec = {"url": url, "schema": schema, "case": case, "side": side, "n": n, "warmup": warmup}
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    finally:
        drop(url, schema)
    if done.returncode != 0:
        raise SystemExit(f"{case} {side} failed:\n{done.stderr[-3000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


def drop(url: str, schema: str, create: bool = False) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        if create:
            conn.execute(f'CREATE SCHEMA "{schema}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the PostgreSQL server (the database to use)")
    parser.add_argument("--quick", action="store_true", help="small counts")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--cases", default="", help="only these, comma-separated: " + ",".join(CASES)
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if not args.url:
        parser.error("--url is required")
    counts = (
        {"append-1": 300, "append-100": 5_000, "append-16": 1_600, "catch-up": 5_000, "live": 200}
        if args.quick
        else {
            "append-1": 2_000,
            "append-100": 30_000,
            "append-16": 8_000,
            "catch-up": 20_000,
            "live": 1_000,
        }
    )
    sides = {"append-1": ["sk", "es", "es_recorder"], "append-100": ["sk", "es", "es_recorder"]}
    sides["append-16"] = ["sk", "es"]
    sides["catch-up"] = sides["live"] = ["sk_host", "es_system"]
    if args.cases:
        wanted = [case.strip() for case in args.cases.split(",") if case.strip()]
        unknown = sorted(set(wanted) - set(counts))
        if unknown:
            parser.error(f"unknown cases {unknown}; the cases are {', '.join(CASES)}")
        counts = {case: counts[case] for case in wanted}
    results: dict[str, dict[str, list[float]]] = {}
    for case, count in counts.items():
        results[case] = {side: [] for side in sides[case]}
        for _ in range(args.trials):
            for side in sides[case]:
                results[case][side].append(measure(args.url, case, side, count, 50))
    lines = [
        f"PostgreSQL {server_version(args.url)}, {os.cpu_count()} CPUs, "
        f"{args.trials} trials (events/s min / median / max)",
        "",
        "| case | side | events/s | streamkit / it (medians) |",
        "| --- | --- | ---: | ---: |",
    ]
    for case, by_side in results.items():
        mine = next(side for side in by_side if side.startswith("sk"))
        ours = statistics.median(by_side[mine])
        for side, rates in by_side.items():
            median = statistics.median(rates)
            ratio = "" if side == mine else f"{ours / median:.2f}x"
            lines.append(
                f"| {CASES[case]} | {SIDES[side]} | {min(rates):,.0f} / {median:,.0f} / "
                f"{max(rates):,.0f} | {ratio} |"
            )
    print("\n".join(lines))


def server_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


if __name__ == "__main__":
    main()

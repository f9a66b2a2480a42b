"""The ``eventsourcing`` (pyeventsourcing 9.x) side of ``bench/compare.py``.

Every application here is configured through eventsourcing's own environment
keys: ``PERSISTENCE_MODULE`` names :class:`SynchronousSQLiteFactory` (the
stock :class:`~eventsourcing.sqlite.SQLiteFactory`, plus one ``PRAGMA
synchronous`` on each connection its pool opens) and ``SQLITE_DBNAME`` the
file. eventsourcing opens its SQLite files in WAL mode itself and leaves
``synchronous`` at SQLite's default (FULL); the factory makes the level
explicit so NORMAL can be compared too, and :func:`pooled_synchronous`
reads the level back from every pooled connection after a run.

Two append paths are measured: the idiomatic one (mutate an aggregate, then
``Application.save``: domain event objects, the mapper, JSON transcoding, one
transaction) and the recorder's own ``insert_events`` with ready-made
``StoredEvent`` rows (the floor under ``save``). Processing runs as the
library documents it: a :class:`~eventsourcing.system.System` of an upstream
application and a downstream :class:`~eventsourcing.system.ProcessApplication`,
run by a :class:`~eventsourcing.system.SingleThreadedRunner`; the
downstream's tracking row (its position) is written in one transaction per
event, with whatever events its policy collected (none here).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any
from uuid import uuid4

from _compare_common import (
    BATCH_SIZE,
    CONCURRENT_WRITERS,
    Stopwatch,
    batch_rate,
    latency_summary,
    payload,
    rate,
    timed_steps,
)
from eventsourcing.application import Application
from eventsourcing.dispatch import singledispatchmethod
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteConnection, SQLiteFactory
from eventsourcing.system import ProcessApplication, SingleThreadedRunner, System
from eventsourcing.utils import Environment, EnvType

SYNCHRONOUS_KEY = "SQLITE_SYNCHRONOUS"
PRAGMA_LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class SynchronousSQLiteFactory(SQLiteFactory):
    """The stock SQLite factory; each pooled connection also gets ``PRAGMA synchronous``.

    ``SQLITE_SYNCHRONOUS`` (FULL or NORMAL, default FULL) is read from the
    application's environment like every other eventsourcing setting. The
    pragma is per connection, so it is applied where the pool creates one.
    """

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        level = self.env.get(SYNCHRONOUS_KEY, "FULL").upper()
        if level not in ("FULL", "NORMAL"):
            raise OSError(f"{SYNCHRONOUS_KEY} must be FULL or NORMAL, got {level!r}")
        pool = self.datastore.pool
        create = pool._create_connection

        def create_connection() -> SQLiteConnection:
            connection = create()
            connection._sqlite_conn.execute(f"PRAGMA synchronous = {level}")
            return connection

        pool._create_connection = create_connection  # type: ignore[method-assign]


FACTORY_TOPIC = f"{__name__}:SynchronousSQLiteFactory"


def environment(synchronous: str, **databases: str) -> dict[str, str]:
    """eventsourcing settings: our factory, the level, and ``<APP>_SQLITE_DBNAME`` per app."""
    env = {"PERSISTENCE_MODULE": FACTORY_TOPIC, SYNCHRONOUS_KEY: synchronous}
    for app_name, path in databases.items():
        env[f"{app_name.upper()}_SQLITE_DBNAME"] = path
    return env


def pooled_synchronous(app: Application[Any]) -> str:
    """The ``synchronous`` level of every connection in ``app``'s pool (they must agree)."""
    datastore = app.factory.datastore  # type: ignore[attr-defined]
    with datastore.transaction(commit=False) as cursor:
        cursor.execute("PRAGMA synchronous")
        levels = {cursor.fetchone()[0]}
    for connection in list(datastore.pool._pool):
        levels.add(connection._sqlite_conn.execute("PRAGMA synchronous").fetchone()[0])
    if len(levels) != 1:
        raise AssertionError(f"eventsourcing connections disagree on synchronous: {levels}")
    return PRAGMA_LEVELS[levels.pop()]


class Order(Aggregate):
    """One aggregate per writer; every appended event is one ``Placed`` on it."""

    @event("Placed")
    def place(self, order: int, customer: str, lines: list[int], note: str) -> None:
        self.last_order = order


class Upstream(Application[Any]):
    """The application the events are recorded in."""

    # The largest page its notification log serves (default 10); see Downstream.
    log_section_size = 500


class Downstream(ProcessApplication[Any]):
    """Trivial work per event: count it. Each event commits its tracking row."""

    # Notifications pulled per query (eventsourcing's default is 10); 500 matches
    # streamkit's page and only helps this side.
    pull_section_size = 500

    def __init__(self, env: EnvType | None = None) -> None:
        super().__init__(env)
        self.processed = 0

    @singledispatchmethod
    def policy(self, domain_event: Any, processing_event: Any) -> None:
        self.processed += 1


SYSTEM = System(pipes=[[Upstream, Downstream]])


def _app(db: Path, synchronous: str) -> Upstream:
    return Upstream(env=environment(synchronous, upstream=str(db)))


def _stored(originator: Any, version: int, i: int) -> StoredEvent:
    return StoredEvent(
        originator_id=originator,
        originator_version=version,
        topic=f"{__name__}:Order.Placed",
        state=json.dumps(payload(i)).encode(),
    )


# -- appends ------------------------------------------------------------------------------


def sequential(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    app = _app(db, synchronous)
    order = Order()
    app.save(order)

    def step(i: int) -> None:
        order.place(**payload(i))
        app.save(order)

    seconds = timed_steps(step, n, warmup)
    result = {"rate": rate(n, seconds), "synchronous": pooled_synchronous(app)}
    app.close()
    return result


def sequential_recorder(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    app = _app(db, synchronous)
    recorder = app.recorder
    originator = uuid4()
    seconds = timed_steps(
        lambda i: recorder.insert_events([_stored(originator, i + 1, i + 1)]), n, warmup
    )
    result = {"rate": rate(n, seconds), "synchronous": pooled_synchronous(app)}
    app.close()
    return result


def batches(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """``n`` events as ``n / 100`` saves of one aggregate holding 100 new events."""
    app = _app(db, synchronous)
    order = Order()
    app.save(order)

    def batch(b: int) -> None:
        for i in range(BATCH_SIZE):
            order.place(**payload(b * BATCH_SIZE + i))
        app.save(order)

    result = {"rate": batch_rate(batch, n, warmup), "synchronous": pooled_synchronous(app)}
    app.close()
    return result


def batches_recorder(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    app = _app(db, synchronous)
    recorder = app.recorder
    originator = uuid4()

    def batch(b: int) -> None:
        first = b * BATCH_SIZE + 1
        recorder.insert_events(
            [_stored(originator, v, v) for v in range(first, first + BATCH_SIZE)]
        )

    result = {"rate": batch_rate(batch, n, warmup), "synchronous": pooled_synchronous(app)}
    app.close()
    return result


def concurrent(db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """16 threads (eventsourcing is synchronous), each saving one event at a time."""
    app = _app(db, synchronous)
    per_writer = n // CONCURRENT_WRITERS
    orders = [Order() for _ in range(CONCURRENT_WRITERS)]
    app.save(*orders)
    for i in range(warmup):
        orders[0].place(**payload(i))
        app.save(orders[0])
    start = threading.Barrier(CONCURRENT_WRITERS + 1)
    errors: list[BaseException] = []

    def writer(order: Order, w: int) -> None:
        start.wait()
        try:
            for i in range(per_writer):
                order.place(**payload(w * per_writer + i))
                app.save(order)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(order, w)) for w, order in enumerate(orders)]
    for thread in threads:
        thread.start()
    with Stopwatch() as watch:
        start.wait()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    done = per_writer * CONCURRENT_WRITERS
    result = {"rate": rate(done, watch.seconds), "synchronous": pooled_synchronous(app)}
    app.close()
    return result


# -- processing ---------------------------------------------------------------------------


def fill(db: Path, n: int) -> None:
    """Record ``n`` events in the upstream application (1000 per save; not measured)."""
    record(_app(db, "NORMAL"), n)


def record(app: Upstream, n: int) -> None:
    """Record ``n`` events in ``app`` (1000 per save), then close it."""
    order = Order()
    app.save(order)
    done = 0
    while done < n - 1:  # the Created event above is the first of the n
        size = min(1000, n - 1 - done)
        for i in range(size):
            order.place(**payload(done + i))
        app.save(order)
        done += size
    app.close()


def catch_up(upstream_db: Path, db: Path, synchronous: str, n: int) -> dict[str, Any]:
    """The downstream process application pulls and processes all ``n`` recorded events."""
    runner = SingleThreadedRunner[Any](
        SYSTEM, env=environment(synchronous, upstream=str(upstream_db), downstream=str(db))
    )
    runner.start()
    downstream = runner.get(Downstream)
    with Stopwatch() as watch:
        downstream.pull_and_process(Upstream.name)
    tracked = downstream.recorder.max_tracking_id(Upstream.name)
    if downstream.processed != n or tracked != n:
        raise AssertionError(f"processed {downstream.processed}, tracked {tracked}, expected {n}")
    result = {"rate": rate(n, watch.seconds), "synchronous": pooled_synchronous(downstream)}
    runner.stop()
    return result


def live(upstream_db: Path, db: Path, synchronous: str, n: int, warmup: int) -> dict[str, Any]:
    """Save one event upstream; the runner processes it downstream before ``save`` returns."""
    runner = SingleThreadedRunner[Any](
        SYSTEM, env=environment(synchronous, upstream=str(upstream_db), downstream=str(db))
    )
    runner.start()
    upstream = runner.get(Upstream)
    downstream = runner.get(Downstream)
    order = Order()
    upstream.save(order)
    for i in range(warmup):
        order.place(**payload(i))
        upstream.save(order)
    latencies: list[float] = []
    with Stopwatch() as watch:
        for i in range(n):
            with Stopwatch() as one:
                order.place(**payload(i))
                upstream.save(order)
            latencies.append(one.seconds)
    expected = 1 + warmup + n
    if downstream.processed != expected:
        raise AssertionError(f"processed {downstream.processed}, expected {expected}")
    result = {
        "rate": rate(n, watch.seconds),
        "synchronous": pooled_synchronous(downstream),
        "upstream_synchronous": pooled_synchronous(upstream),
        **latency_summary(latencies),
    }
    runner.stop()
    return result

"""Hosts as real processes, frozen with SIGSTOP: a host that lost its lease writes and starts nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from support.daemon import eventually
from test_host_daemon import Rig

from streamkit import open_log

pytestmark = pytest.mark.slow


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with closing(Rig(tmp_path)) as made:
        yield made


def query(db: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def append_jobs(db: str, count: int, etype: str = "job", **payload: Any) -> None:
    """Append ``count`` events in one call from this process, as a producer would."""

    async def run() -> None:
        async with open_log(db) as log:
            await log.stream("/").append(
                *({"type": etype, "payload": payload} for _ in range(count))
            )

    asyncio.run(run())


def holder_pid(db: str, slug: str) -> tuple[int, int]:
    """(pid, generation) of the lease's current owner (owner strings are host:pid:token)."""
    ((owner, generation),) = query(
        db, "SELECT owner, generation FROM streamkit_leases WHERE slug = ?", slug
    )
    return int(str(owner).split(":")[1]), int(generation)


def echoes(db: str) -> list[tuple[int, int, int, int]]:
    """(offset, job, pid, lease generation) of every echo, in offset order."""
    rows = query(
        db,
        "SELECT \"offset\", payload, source FROM streamkit_events WHERE type = 'echo'"
        ' ORDER BY "offset"',
    )
    out = []
    for offset, payload, source in rows:
        body = json.loads(payload)
        lease = json.loads(source)["processor"]["lease"]
        out.append((int(offset), int(body["job"]), int(body["pid"]), int(lease["generation"])))
    return out


def test_a_frozen_holder_runs_no_effect_after_the_takeover(rig: Rig) -> None:
    """SIGSTOP the holder mid-batch past its ttl, SIGCONT it: no append of it lands after the takeover."""
    hosts = {}
    for name in ("a", "b"):
        child = rig.host(name, "hostprocs:Echo", ttl="2")
        hosts[child.pid] = (name, child)
    append_jobs(rig.db, 150)
    eventually(lambda: len(echoes(rig.db)) >= 3)
    rounds = 3
    takeovers = []
    for _ in range(rounds):
        pid, generation = holder_pid(rig.db, "echo")
        name, child = hosts[pid]
        child.send_signal(signal.SIGSTOP)
        try:
            # The other host watches the row go unrenewed for a ttl, then takes over.
            eventually(lambda g=generation: holder_pid(rig.db, "echo")[1] > g, timeout=20)
            new_pid, new_generation = holder_pid(rig.db, "echo")
            assert new_pid != pid
            takeovers.append(new_generation)
            time.sleep(5.0 - 2.0)  # frozen 5 s in all: its blocker's sleep is long overdue
        finally:
            child.send_signal(signal.SIGCONT)
        # The resumed host learns it lost the lease (its own clock, then the keeper).
        eventually(lambda n=name: rig.host_log(n).count('"lease.lost"') >= 1, timeout=20)
        time.sleep(1.0)  # the resumed host gets time to do whatever it would wrongly do
        append_jobs(rig.db, 10)
    head_job = query(rig.db, "SELECT MAX(\"offset\") FROM streamkit_events WHERE type = 'job'")
    last_job = int(head_job[0][0])
    # Redelivery is allowed (at least once), loss is not: every job is echoed in the end.
    eventually(lambda: {job for _, job, _, _ in echoes(rig.db)} >= set(_jobs(rig.db)), timeout=120)
    for _, child in hosts.values():
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 0
    written = echoes(rig.db)
    generations = [generation for _, _, _, generation in written]
    # The log's own order proves the fence: no echo under an older generation after a newer one.
    stale = [row for index, row in enumerate(written) if row[3] < max(generations[: index + 1])]
    assert stale == []
    assert len(takeovers) == rounds
    assert len(set(generations)) >= rounds + 1
    # Each echo names the pid of a host that held that generation.
    by_generation: dict[int, set[int]] = {}
    for _, _, pid, generation in written:
        by_generation.setdefault(generation, set()).add(pid)
    assert all(len(pids) == 1 for pids in by_generation.values())
    assert last_job in {job for _, job, _, _ in written}


def _jobs(db: str) -> list[int]:
    return [
        int(r[0]) for r in query(db, "SELECT \"offset\" FROM streamkit_events WHERE type = 'job'")
    ]


def test_a_batch_three_times_the_ttl_commits(rig: Rig) -> None:
    """One host, a batch holding the loop for 3x the ttl: its checkpoint commits, no lease lost."""
    rig.host("a", "hostprocs:Grinder", ttl="1")
    append_jobs(rig.db, 1, etype="grind", seconds=3.0)
    append_jobs(rig.db, 1, etype="grind", seconds=0.0)
    last = int(query(rig.db, 'SELECT MAX("offset") FROM streamkit_events')[0][0])

    def checkpointed() -> int:
        rows = query(
            rig.db,
            "SELECT reduced_through_offset FROM streamkit_checkpoints WHERE slug = 'grinder'",
        )
        return int(rows[0][0]) if rows else 0

    eventually(lambda: checkpointed() >= last, timeout=60)
    assert '"lease.lost"' not in rig.host_log("a")
    assert query(rig.db, "SELECT generation FROM streamkit_leases")[0][0] == 1


def test_with_two_hosts_a_long_batch_makes_progress_on_one(rig: Rig) -> None:
    """Two hosts, batches of 3x the ttl each: one host commits them all, the other only waits."""
    rig.host("a", "hostprocs:Grinder", ttl="1")
    rig.host("b", "hostprocs:Grinder", ttl="1")
    for _ in range(3):
        append_jobs(rig.db, 1, etype="grind", seconds=3.0)
    last = int(query(rig.db, 'SELECT MAX("offset") FROM streamkit_events')[0][0])
    eventually(
        lambda: (
            query(
                rig.db,
                "SELECT reduced_through_offset FROM streamkit_checkpoints WHERE slug = 'grinder'",
            )
            == [(last,)]
        ),
        timeout=90,
    )
    # No ping-pong: the lease was never taken over.
    assert query(rig.db, "SELECT generation FROM streamkit_leases")[0][0] == 1
    for name in ("a", "b"):
        assert '"lease.lost"' not in rig.host_log(name)
    assert os.path.exists(rig.db)

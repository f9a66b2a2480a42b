"""Hosts as real processes, frozen with SIGSTOP: a host that lost its lease writes and starts nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import time
from typing import Any

import psycopg
import psycopg.sql
import pytest
from support.daemon import HostRig as Rig
from support.daemon import eventually

from streamkit import SPEED_TRICKS, open_log

pytestmark = pytest.mark.slow

FREEZE_ROUNDS = 3 if SPEED_TRICKS else 2
"""Freezes of the holder: three with the speed tricks on, two in the plain pass (CI time)."""
JOBS_PER_ROUND = 35
"""Jobs appended before each freeze: about what the holders echo in one round (~10 s)."""


def query(rig: Rig, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` (``?`` placeholders) on the rig's storage, as a process of its own."""
    if rig.target is None:
        conn = sqlite3.connect(rig.db, timeout=30)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()
    assert rig.target.schema is not None
    url, schema = rig.target.schema
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(schema)))
        return pg.execute(sql.replace("?", "%s"), args).fetchall()


def append_jobs(rig: Rig, count: int, etype: str = "job", **payload: Any) -> None:
    """Append ``count`` events in one call from this process, as a producer would."""

    async def run() -> None:
        async with open_log(rig.db) as log:
            await log.stream("/").append(
                *({"type": etype, "payload": payload} for _ in range(count))
            )

    asyncio.run(run())


def holder_pid(rig: Rig, slug: str) -> tuple[int, int]:
    """(pid, generation) of the lease's current owner (owner strings are host:pid:token)."""
    ((owner, generation),) = query(
        rig, "SELECT owner, generation FROM streamkit_leases WHERE slug = ?", slug
    )
    return int(str(owner).split(":")[1]), int(generation)


def echoes(rig: Rig) -> list[tuple[int, int, int, int]]:
    """(offset, job, pid, lease generation) of every echo, in offset order."""
    rows = query(
        rig,
        "SELECT \"offset\", payload, source FROM streamkit_events WHERE type = 'echo'"
        ' ORDER BY "offset"',
    )
    out = []
    for offset, payload, source in rows:
        body = json.loads(payload)
        lease = json.loads(source)["processor"]["lease"]
        out.append((int(offset), int(body["job"]), int(body["pid"]), int(lease["generation"])))
    return out


def write_locked(db: str) -> bool:
    """Whether some process holds the file's write lock for a second (one frozen in a commit)."""
    conn = sqlite3.connect(db, timeout=1.0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return True
    finally:
        conn.close()


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def freeze(rig: Rig, child: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``child``; on SQLite, at a moment it is not inside a write transaction.

    One SQLite file has one write lock: a process frozen while it holds it
    stops every writer until it resumes or dies (SQLite's rule, see
    docs/host.md), so no other host could take over. That is not what this
    test is about, so there a freeze that lands inside a commit is undone and
    tried again a moment later. On PostgreSQL the server ends a session
    frozen inside a transaction (docs/postgres.md), which the takeover waits
    out.
    """
    for _ in range(100):
        child.send_signal(signal.SIGSTOP)
        eventually(lambda: stopped(child.pid), timeout=10)
        if rig.target is not None or not write_locked(rig.db):
            return
        child.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the holder was inside a write transaction at every try")


def tails(rig: Rig, lines: int = 40) -> str:
    """The last lines each host logged: what a failure message needs to be understood."""
    return "".join(
        f"\n--- host {name}:\n" + "\n".join(rig.host_log(name).splitlines()[-lines:])
        for name in ("a", "b")
    )


def test_a_frozen_holder_runs_no_effect_after_the_takeover(rig: Rig) -> None:
    """SIGSTOP the holder mid-batch past its ttl, SIGCONT it: no append of it lands after the takeover."""
    hosts = {}
    for name in ("a", "b"):
        child = rig.host(name, "hostprocs:Echo", ttl="2")
        hosts[child.pid] = (name, child)
    rounds = FREEZE_ROUNDS
    takeovers = []
    for round_ in range(rounds):
        # About a round's worth of 0.3 s jobs before each freeze, so the holder is always
        # mid-batch when frozen and little backlog is left to wait for at the end.
        append_jobs(rig, JOBS_PER_ROUND)
        if round_ == 0:
            eventually(lambda: len(echoes(rig)) >= 3)
        pid, generation = holder_pid(rig, "echo")
        name, child = hosts[pid]
        freeze(rig, child)
        try:
            # The other host watches the row go unrenewed for a ttl, then takes over (on
            # PostgreSQL, within the server's idle-in-transaction timeout of 30 s more).
            try:
                eventually(
                    lambda g=generation: holder_pid(rig, "echo")[1] > g,
                    timeout=20 if rig.target is None else 60,
                )
            except AssertionError as exc:
                raise AssertionError(f"no takeover from {name}: {tails(rig)}") from exc
            new_pid, new_generation = holder_pid(rig, "echo")
            assert new_pid != pid
            takeovers.append(new_generation)
            time.sleep(5.0 - 2.0)  # frozen 5 s in all: its blocker's sleep is long overdue
        finally:
            child.send_signal(signal.SIGCONT)
        # The resumed host learns it lost the lease (its own clock, then the keeper).
        eventually(lambda n=name: rig.host_log(n).count('"lease.lost"') >= 1, timeout=20)
        time.sleep(1.0)  # the resumed host gets time to do whatever it would wrongly do
        append_jobs(rig, 10)
    head_job = query(rig, "SELECT MAX(\"offset\") FROM streamkit_events WHERE type = 'job'")
    last_job = int(head_job[0][0])
    # Redelivery is allowed (at least once), loss is not: every job is echoed in the end.
    eventually(lambda: {job for _, job, _, _ in echoes(rig)} >= set(_jobs(rig)), timeout=120)
    for _, child in hosts.values():
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 0
    written = echoes(rig)
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


def _jobs(rig: Rig) -> list[int]:
    return [
        int(r[0]) for r in query(rig, "SELECT \"offset\" FROM streamkit_events WHERE type = 'job'")
    ]


def test_a_batch_three_times_the_ttl_commits(rig: Rig) -> None:
    """One host, a batch holding the loop for 3x the ttl: its checkpoint commits, no lease lost."""
    rig.host("a", "hostprocs:Grinder", ttl="1")
    append_jobs(rig, 1, etype="grind", seconds=3.0)
    append_jobs(rig, 1, etype="grind", seconds=0.0)
    last = int(query(rig, 'SELECT MAX("offset") FROM streamkit_events')[0][0])

    def checkpointed() -> int:
        rows = query(
            rig,
            "SELECT reduced_through_offset FROM streamkit_checkpoints WHERE slug = 'grinder'",
        )
        return int(rows[0][0]) if rows else 0

    eventually(lambda: checkpointed() >= last, timeout=60)
    assert '"lease.lost"' not in rig.host_log("a")
    assert query(rig, "SELECT generation FROM streamkit_leases")[0][0] == 1


def test_with_two_hosts_a_long_batch_makes_progress_on_one(rig: Rig) -> None:
    """Two hosts, batches of 3x the ttl each: one host commits them all, the other only waits."""
    rig.host("a", "hostprocs:Grinder", ttl="1")
    rig.host("b", "hostprocs:Grinder", ttl="1")
    for _ in range(3):
        append_jobs(rig, 1, etype="grind", seconds=3.0)
    last = int(query(rig, 'SELECT MAX("offset") FROM streamkit_events')[0][0])
    eventually(
        lambda: (
            query(
                rig,
                "SELECT reduced_through_offset FROM streamkit_checkpoints WHERE slug = 'grinder'",
            )
            == [(last,)]
        ),
        timeout=90,
    )
    # No ping-pong: the lease was never taken over.
    assert query(rig, "SELECT generation FROM streamkit_leases")[0][0] == 1
    for name in ("a", "b"):
        assert '"lease.lost"' not in rig.host_log(name)

"""Schedules with real daemons, kill -9 and SIGSTOP: every slot fired once or on record as missed.

Three hosts run the schedules and tasks processors over one log, SQLite or
PostgreSQL; a schedule fires every second and requests a ``ping`` task per
slot. The host holding the schedules lease is killed (SIGKILL, then a new
host starts) or frozen past its ttl (SIGSTOP, then SIGCONT) in turn, at
random moments, eight rounds in about 45 seconds. Afterwards every second
since the definition is either fired exactly once or inside exactly one
``schedule.missed`` range, never both, and each fired slot's task was
requested once and succeeded once.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import time
from typing import Any

import pytest
from streamkit.processors.schedules import Catchup, Every, RunTask, Schedule, definitions, sync
from support.daemon import HostRig as Rig
from support.daemon import eventually
from test_host_cutover_drills import read_all
from test_host_fencing import freeze, holder_pid

from streamkit import SPEED_TRICKS, open_log

pytestmark = pytest.mark.slow

PROCESSORS = ("hostprocs:Schedules", "hostprocs:ScheduledTasks")

ROUNDS = 8 if SPEED_TRICKS else 4
"""Kills and freezes of the holder, 2 to 4 s apart: the schedule runs for about 45 s.

Four kills and four freezes, each at a random moment of a slot, cover the
ways a holder goes; more rounds repeat them and cost CI's time. The suite's
second pass (``STREAMKIT_PLAIN=1``) proves the plain twins give the same
outcome with half the rounds."""


def define(rig: Rig, schedule: Schedule) -> float:
    """Sync ``schedule`` onto the log; when it was defined (no slot before fires)."""

    async def run() -> float:
        async with open_log(rig.db) as log:
            stream = log.stream("/")
            await sync(stream, [schedule])
            return (await definitions(stream))[schedule.name].defined_at

    return asyncio.run(run())


def decided(events: list[Any]) -> tuple[list[int], list[tuple[int, int, int, str]]]:
    """The slots fired (in log order) and the missed ranges ``(first, last, count, reason)``."""
    fired = [int(e.payload["slot"]) for e in events if e.type == "schedule.fired"]
    missed = [
        (int(p["first"]), int(p["last"]), int(p["count"]), p["reason"])
        for p in (e.payload for e in events if e.type == "schedule.missed")
    ]
    return fired, missed


def decided_through(db: str) -> int:
    fired, missed = decided(read_all(db))
    return max([*fired, *(last for _, last, _, _ in missed), 0])


def test_every_slot_fires_once_or_is_missed_through_kill_9_and_sigstop(rig: Rig) -> None:
    beat = Schedule(
        "beat", Every("1s"), action=RunTask("ping"), catchup=Catchup("all", window="1m")
    )
    defined_at = define(rig, beat)
    hosts: dict[str, subprocess.Popen[bytes]] = {
        name: rig.host(name, *PROCESSORS, ttl="1") for name in ("a", "b", "c")
    }
    eventually(lambda: decided_through(rig.db) > defined_at + 1, 60)
    chooser = random.Random(35)
    kills = freezes = 0
    _, first_generation = holder_pid(rig, "schedules")
    for round_ in range(ROUNDS):
        time.sleep(chooser.uniform(2.0, 4.0))
        pid, generation = holder_pid(rig, "schedules")
        assert generation >= first_generation + round_  # each round moved the lease
        name = next(n for n, child in hosts.items() if child.pid == pid)
        child = hosts[name]
        if round_ % 2 == 0:  # kill and freeze in turn, at random moments
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            del hosts[name]
            hosts[f"r{round_}"] = rig.host(f"r{round_}", *PROCESSORS, ttl="1")
            kills += 1
        else:
            freeze(rig, child)
            time.sleep(2.5)  # past its ttl: another host takes the lease over
            child.send_signal(signal.SIGCONT)
            freezes += 1
    end = time.time()
    eventually(lambda: holder_pid(rig, "schedules")[1] >= first_generation + ROUNDS, 60)
    eventually(lambda: decided_through(rig.db) >= int(end), 90)
    # Pause it, so that the tasks of every slot that fired settle before the hosts stop.
    rig.cli("schedules", "pause", "beat", "--db", rig.db, "--by", "drill")

    def all_succeeded() -> bool:
        events = read_all(rig.db)
        requested = {e.payload["task_id"] for e in events if e.type == "task.requested"}
        done = {e.payload["task_id"] for e in events if e.type == "task.succeeded"}
        return done >= requested

    eventually(all_succeeded, 90)
    # `streamkit schedules list` through a live host shows the same record.
    live = next(iter(hosts))
    shown = json.loads(
        rig.cli("schedules", "list", "--db", rig.db, "--socket", rig.socket(live), "--json").stdout
    )
    (row,) = shown["schedules"]
    so_far, missed_so_far = decided(read_all(rig.db))
    assert row["name"] == "beat"
    assert row["fired"] <= len(so_far)
    assert row["missed"] <= sum(count for _, _, count, _ in missed_so_far)
    assert row["fired"] + row["missed"] >= int(end) - int(defined_at)
    assert row["paused"] is True
    assert row["next_slot"] is None
    for child in hosts.values():
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 0
    events = read_all(rig.db)
    fired, missed = decided(events)
    assert kills >= 1
    assert freezes >= 1
    assert len(fired) == len(set(fired))  # never twice
    missed_slots: list[int] = []
    for first, last, count, _ in missed:
        assert count == last - first + 1  # every second of the range, counted
        missed_slots += range(first, last + 1)
    assert len(missed_slots) == len(set(missed_slots))
    assert not set(fired) & set(missed_slots)
    through = max([*fired, *missed_slots])
    assert through >= int(end)
    assert set(fired) | set(missed_slots) == set(range(int(defined_at) + 1, through + 1))
    # Each fired slot's task: requested once, succeeded once.
    requests = [e.payload["task_id"] for e in events if e.type == "task.requested"]
    assert sorted(requests) == sorted(f"sched/beat/{_slot(s)}" for s in fired)
    succeeded = [e.payload["task_id"] for e in events if e.type == "task.succeeded"]
    assert sorted(succeeded) == sorted(requests)


def _slot(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))

"""Drills of retention with real daemons under live load: kill -9 mid-run, every backend.

A producer appends items all along. Daemons run three processors (one with
effects, two that record every offset they fold) and a ``[[retention]]``
policy that archives all but the newest offsets in small chunks, many
times a second; each daemon is killed (SIGKILL) at a random moment, round
after round, so kills land inside runs. Then one processor is left
offline while retention goes on: the path's start never passes what it
still needs, and when it returns it folds every item it missed. Afterwards:
every item has exactly one effect, each recording processor folded every
item once, in order, the history read with its archive is whole, the
archive proves itself (and a flipped byte in it is found), and no file is
left in it that its records do not name.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.daemon import HostRig as Rig
from support.daemon import eventually

from streamkit import open_log
from streamkit.backends import host_store

pytestmark = pytest.mark.slow

PRODUCER = """
import asyncio, os, sys
from streamkit import open_log

async def main(db, stop):
    n = 0
    async with open_log(db) as log:
        stream = log.stream("/")
        while not os.path.exists(stop):
            n += 1
            await stream.append({"type": "item", "payload": {"n": n}})
            await asyncio.sleep(0.004)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

POLICY = """
retention_interval = 0.05

[[retention]]
path = "/"
keep_last = 30
archive = "archive"
chunk = 25
share = 0.5
"""

ALL = ("hostprocs:Effector", "hostprocs:Tally", "hostprocs:Second")


def host(rig: Rig, name: str, *processors: str) -> subprocess.Popen[bytes]:
    argv = ["--config", str(rig.tmp / "streamkit.toml"), "--db", rig.db, "--lease-ttl", "1"]
    for processor in processors:
        argv += ["--processor", processor]
    return rig.start_host(name, *argv, "--log-format", "json")


def history(db: str) -> list[Any]:
    """The path's whole history, its archive first."""

    async def run() -> list[Any]:
        async with open_log(db) as log:
            events: list[Any] = []
            after = 0
            while True:
                page = await log.stream("/").read(after, 5000, include_archive=True)
                events.extend(page.events)
                if page.at_head or page.scanned_through_offset <= after:
                    return events
                after = page.scanned_through_offset

    return asyncio.run(run())


def facts(db: str) -> tuple[int, dict[str, int], set[str]]:
    """The path's start, each recording processor's cursor, and the recorded segment files."""

    async def run() -> tuple[int, dict[str, int], set[str]]:
        async with open_log(db) as log:
            store = host_store(log)
            found = await store.retention.horizons(time.time(), "/")
            cursors = {
                row["slug"]: row["cursor"] or 0
                for row in await store.durable_status()
                if row["slug"] in ("tally", "second")
            }
            segments = {s.file for s in await store.retention.segments("/")}
        return (found[0].start if found else 1), cursors, segments

    return asyncio.run(run())


def states(db: str) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with open_log(db) as log:
            store = host_store(log)
            return {
                slug: (await store.stored_snapshot(slug))["state"]
                for slug in ("effector", "tally", "second")
            }

    return asyncio.run(run())


def caught_up(rig: Rig, name: str, slugs: tuple[str, ...], offset: int) -> None:
    for slug in slugs:
        eventually(lambda slug=slug: (rig.row(name, slug)["cursor"] or 0) >= offset, 60)


def test_retention_under_load_survives_kill_9_and_an_offline_processor_loses_nothing(
    rig: Rig,
) -> None:
    (rig.tmp / "streamkit.toml").write_text(POLICY)
    stop = rig.tmp / "stop"
    producer = rig.track(
        subprocess.Popen([sys.executable, "-c", PRODUCER, rig.db, str(stop)], env=rig.env)
    )
    chooser = random.Random(11)
    for round_ in range(4):
        daemon = host(rig, f"r{round_}", *ALL)
        if round_ == 0:
            # The first run starts the chunk worker, a process of its own at a lower
            # priority: on a busy machine its first chunk may take longer than a
            # round lasts, so the first daemon lives until retention took something.
            eventually(lambda: facts(rig.db)[0] > 1, 60)
        time.sleep(chooser.uniform(0.4, 1.2))
        daemon.kill()  # mid-run, most rounds: a run starts every 50 ms
        daemon.wait()
    started, _, _ = facts(rig.db)
    assert started > 1, "retention took nothing while the daemons ran"

    # "second" goes offline; retention goes on and must leave what it still needs.
    without = host(rig, "without", "hostprocs:Effector", "hostprocs:Tally")
    _, cursors, _ = facts(rig.db)
    held = cursors["second"]
    for _ in range(20):
        start, _, _ = facts(rig.db)
        assert start <= held + 1, (start, held)
        time.sleep(0.1)
    stop.write_text("")
    assert producer.wait(timeout=30) == 0
    items = [e for e in history(rig.db) if e.type == "item"]
    caught_up(rig, "without", ("effector", "tally"), items[-1].offset)
    without.send_signal(signal.SIGTERM)
    assert without.wait(timeout=30) == 0

    back = host(rig, "back", *ALL)
    caught_up(rig, "back", ("effector", "tally", "second"), items[-1].offset)
    time.sleep(0.3)  # the effects of the last batch land
    back.send_signal(signal.SIGTERM)
    assert back.wait(timeout=30) == 0

    events = history(rig.db)
    items = [e for e in events if e.type == "item"]
    assert [e.payload["n"] for e in items] == list(range(1, len(items) + 1)), "a gap in history"
    effects = sorted(e.payload["source"] for e in events if e.type == "effect")
    assert effects == [e.offset for e in items]  # one each, none missing
    offsets = [e.offset for e in items]
    shown = states(rig.db)
    assert shown["tally"]["offsets"] == offsets
    assert shown["second"]["offsets"] == offsets
    assert shown["effector"] == {"total": sum(e.payload["n"] for e in items), "items": len(items)}

    # A run by hand removes what a killed run left; then the archive is exactly its records.
    rig.cli("retention", "run", "--config", str(rig.tmp / "streamkit.toml"), "--db", rig.db)
    start, _, recorded = facts(rig.db)
    assert {str(f) for f in (rig.tmp / "archive").iterdir()} == recorded
    assert start > held + 1  # "second" is back: what it held went since
    assert rig.cli("verify", "--archive", "--db", rig.db).stdout.endswith(
        "every byte as recorded\n"
    )
    damaged = sorted(recorded)[len(recorded) // 2]
    data = bytearray(Path(damaged).read_bytes())
    data[len(data) // 2] ^= 0x01
    Path(damaged).write_bytes(bytes(data))
    found = rig.cli("verify", "--archive", "--db", rig.db, check=False)
    assert found.returncode == 1
    assert f"DAMAGED: segment {damaged} of / (" in found.stdout

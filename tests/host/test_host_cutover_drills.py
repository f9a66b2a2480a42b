"""Drills of a processor's version change with real daemons: kill -9 and SIGSTOP, every backend.

A daemon runs version 1 of a processor with effects (``hostprocs:Effector``:
one ``effect`` per item, keyed by slug and source offset) while a producer
appends. Daemons running version 2 are started, build it in the shadow and
cut over; they and the version 1 daemon are killed (SIGKILL) at random
moments of the build and of the cutover, round after round, or version 1's
daemon is frozen (SIGSTOP) across the cutover. Afterwards: every item has
exactly one effect, none is missing, version 2 serves, and its state is
what a replay of every item under version 2 gives.
"""

from __future__ import annotations

import asyncio
import json
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
import asyncio, os, random, sys
from streamkit import open_log

async def main(db, stop):
    chooser = random.Random(7)
    async with open_log(db) as log:
        stream = log.stream("/")
        while not os.path.exists(stop):
            await stream.append(*({"type": "item", "payload": {"n": chooser.randint(1, 9)}}
                                  for _ in range(3)))
            await asyncio.sleep(0.01)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def prefill(db: str, count: int) -> None:
    """``count`` items without effects: what a version-2 build has to read first."""

    async def run() -> None:
        async with open_log(db) as log:
            for start in range(0, count, 5000):
                await log.stream("/").append(
                    *(
                        {"type": "item", "payload": {"n": 1, "quiet": True}}
                        for _ in range(min(5000, count - start))
                    )
                )

    asyncio.run(run())


def read_all(db: str) -> list[Any]:
    async def run() -> list[Any]:
        async with open_log(db) as log:
            events: list[Any] = []
            after = 0
            while True:
                page = await log.stream("/").read(after, 5000)
                events.extend(page.events)
                if page.at_head or page.scanned_through_offset <= after:
                    return events
                after = page.scanned_through_offset

    return asyncio.run(run())


def serving(db: str) -> tuple[str, int] | None:
    async def run() -> tuple[str, int] | None:
        async with open_log(db) as log:
            row, _ = await host_store(log).version_rows("effector", "2")
        return None if row is None else (row.reducer_version, row.reduced_through_offset)

    return asyncio.run(run())


def producing(rig: Rig) -> tuple[subprocess.Popen[bytes], Path]:
    stop = rig.tmp / "stop"
    producer = rig.track(
        subprocess.Popen([sys.executable, "-c", PRODUCER, rig.db, str(stop)], env=rig.env)
    )
    return producer, stop


def check_once_each(rig: Rig) -> None:
    """Every item has exactly one effect; version 2 serves; its state is a replay's."""
    final = rig.host("final", "hostprocs:EffectorV2", ttl="1")
    events = read_all(rig.db)
    items = [e for e in events if e.type == "item"]
    eventually(lambda: (rig.row("final", "effector")["cursor"] or 0) >= items[-1].offset, 60)
    eventually(lambda: rig.row("final", "effector")["phase"] == "serving", 60)
    time.sleep(0.3)  # the effects of the last batch land
    final.send_signal(signal.SIGTERM)
    assert final.wait(timeout=30) == 0
    events = read_all(rig.db)
    effects = [e.payload["source"] for e in events if e.type == "effect"]
    acting = [e.offset for e in items if not e.payload.get("quiet")]
    assert sorted(effects) == acting  # one each, none missing
    assert len(effects) == len(set(effects))
    cutovers = [e.payload for e in events if e.type == "streamkit.cutover"]
    assert [(c["from_version"], c["to_version"]) for c in cutovers] == [("1", "2")]
    shown = serving(rig.db)
    assert shown is not None
    assert shown[0] == "2"

    async def state() -> Any:
        async with open_log(rig.db) as log:
            return (await host_store(log).stored_snapshot("effector"))["state"]

    assert asyncio.run(state()) == {
        "total": 10 * sum(e.payload["n"] for e in items),
        "items": len(items),
    }


def test_kill_9_of_either_version_at_random_moments_of_the_build_and_cutover(rig: Rig) -> None:
    prefill(rig.db, 30_000)
    old = rig.host("old", "hostprocs:Effector", ttl="1")
    eventually(lambda: rig.row("old", "effector")["phase"] == "serving", 60)
    producer, stop = producing(rig)
    chooser = random.Random(11)
    try:
        for round_ in range(3):
            new = rig.host(f"new{round_}", "hostprocs:EffectorV2", ttl="1")
            time.sleep(chooser.uniform(0.0, 0.6))
            new.kill()
            new.wait()
            if round_ % 2 == 1 and old.poll() is None:
                old.kill()  # the serving version dies too, mid-way
                old.wait()
                old = rig.host(f"old{round_}", "hostprocs:Effector", ttl="1")
    finally:
        stop.touch()
        producer.wait(timeout=30)
    assert producer.returncode == 0
    check_once_each(rig)


def test_a_manual_cutover_waits_for_the_operator_compares_and_cuts_over_once(rig: Rig) -> None:
    """Version 2 with ``cutover="manual"``: built, it follows version 1 (which keeps serving,
    effects and all) until `streamkit processor cutover`; `processor versions` shows both
    side by side first; HTTP answers the same comparison."""
    prefill(rig.db, 2_000)
    rig.host("old", "hostprocs:Effector", ttl="1")
    eventually(lambda: rig.row("old", "effector")["phase"] == "serving", 60)
    producer, stop = producing(rig)
    try:
        new = rig.host("new", "hostprocs:ManualEffectorV2", ttl="1")
        eventually(lambda: rig.row("new", "effector")["phase"] == "awaiting-cutover", 60)
        waiting = rig.row("new", "effector")["progress"]["through"]
        # Version 1 goes on serving; the built version follows it, and waits.
        eventually(lambda: rig.row("new", "effector")["progress"]["through"] > waiting, 30)
        assert (serving(rig.db) or ("1", 0))[0] == "1"
        assert rig.row("old", "effector")["phase"] == "serving"
        status = rig.cli("status", "--db", rig.db, "--socket", rig.socket("new")).stdout
        assert "awaiting-cutover at" in status
        assert "`streamkit processor cutover effector` switches" in status

        shown = rig.cli("processor", "versions", "effector", "--db", rig.db).stdout
        assert shown.splitlines()[0].startswith("effector  v1  serving  cursor=")
        assert "effector  v2  building  cursor=" in shown
        assert "counted by the running hosts:" in shown
        assert " v1  serving  malformed_payloads=0" in shown
        assert " v2  awaiting-cutover  malformed_payloads=0" in shown
        assert "v2's state differs from the serving one's in " in shown
        assert "  replace /total " in shown

        done = rig.cli("processor", "cutover", "effector", "--db", rig.db, "--json").stdout
        outcome = json.loads(done)
        assert (outcome["version"], outcome["from_version"]) == ("2", "1")
        assert (serving(rig.db) or ("", 0))[0] == "2"
        eventually(lambda: rig.row("old", "effector").get("state") == "retired", 30)
        again = rig.cli("processor", "cutover", "effector", "--db", rig.db, check=False)
        assert again.returncode != 0
        assert "no running host builds a version of it in the shadow" in again.stderr
    finally:
        stop.touch()
        producer.wait(timeout=30)
    assert producer.returncode == 0
    new.send_signal(signal.SIGTERM)
    assert new.wait(timeout=30) == 0
    check_once_each(rig)


def test_a_rollback_with_real_daemons_serves_version_1_again_and_repeats_no_effect(
    rig: Rig,
) -> None:
    """After a cutover to 2 under load, `processor rollback --to 1`: the daemon still running
    version 1 builds it from its kept row and cuts back; every item has exactly one effect,
    by the version serving its offset (or, right after a cutover, by the replaced version's
    last batch), and version 1's state is a replay's."""
    prefill(rig.db, 2_000)
    old = rig.host("old", "hostprocs:Effector", ttl="1")
    eventually(lambda: rig.row("old", "effector")["phase"] == "serving", 60)
    producer, stop = producing(rig)
    try:
        new = rig.host("new", "hostprocs:EffectorV2", ttl="1")
        eventually(lambda: (serving(rig.db) or ("1", 0))[0] == "2", 60)
        eventually(lambda: rig.row("old", "effector").get("state") == "retired", 30)
        time.sleep(0.5)  # version 2 serves a while, effects and all
        rig.cli("processor", "rollback", "effector", "--to", "1", "--db", rig.db)
        eventually(lambda: (serving(rig.db) or ("2", 0))[0] == "1", 60)
        eventually(lambda: rig.row("new", "effector").get("state") == "retired", 30)
        time.sleep(0.5)  # and version 1 again
    finally:
        stop.touch()
        producer.wait(timeout=30)
    assert producer.returncode == 0
    items = [e for e in read_all(rig.db) if e.type == "item"]
    eventually(lambda: (rig.row("old", "effector")["cursor"] or 0) >= items[-1].offset, 60)
    time.sleep(0.3)  # the effects of the last batch land
    for host in (new, old):
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=30) == 0
    events = read_all(rig.db)
    cutovers = [e.payload for e in events if e.type == "streamkit.cutover"]
    assert [(c["from_version"], c["to_version"]) for c in cutovers] == [("1", "2"), ("2", "1")]
    first, back = cutovers[0]["offset"], cutovers[1]["offset"]
    effects = [e.payload for e in events if e.type == "effect"]
    by_source = {effect["source"]: effect["version"] for effect in effects}
    acting = [e.offset for e in items if not e.payload.get("quiet")]
    assert len(effects) == len(by_source)  # none twice
    assert sorted(by_source) == acting  # none missing
    assert first < back
    expected = {o: "1" if o <= first or o > back else "2" for o in acting}
    for start, end, replaced in ((first, back, "1"), (back, acting[-1], "2")):
        # The one window every handover has (docs/rebuilds.md): the replaced
        # version's last batch appended its effects before the fence and lost
        # its checkpoint; the keyed effects stand, once each. Such effects are
        # a run right after the cutover offset, never later.
        after = [o for o in acting if start < o <= end]
        early = [o for o in after if by_source[o] != expected[o]]
        assert all(by_source[o] == replaced for o in early)
        assert early == after[: len(early)]
    assert all(by_source[o] == "1" for o in acting if o <= first)

    async def state() -> Any:
        async with open_log(rig.db) as log:
            return (await host_store(log).stored_snapshot("effector"))["state"]

    assert asyncio.run(state()) == {
        "total": sum(e.payload["n"] for e in items),
        "items": len(items),
    }


def test_sigstop_of_the_serving_version_across_the_cutover(rig: Rig) -> None:
    prefill(rig.db, 20_000)
    old = rig.host("old", "hostprocs:Effector", ttl="1")
    eventually(lambda: rig.row("old", "effector")["phase"] == "serving", 60)
    producer, stop = producing(rig)
    try:
        new = rig.host("new", "hostprocs:EffectorV2", ttl="1")
        old.send_signal(signal.SIGSTOP)  # frozen, holding the serving lease, effects in flight
        time.sleep(3.0)  # three ttls frozen, across the new version's build and cutover
        if rig.target is not None:
            # The cutover fences the frozen host: it does not wait for it to run again (a
            # session frozen inside a transaction is ended by the server after half the
            # lock timeout, before the writers behind its locks give up). A SQLite host
            # frozen inside its write transaction holds the file's lock, so there every
            # writer, the producer included, waits for it to run again.
            eventually(lambda: (serving(rig.db) or ("1", 0))[0] == "2", 60)
        old.send_signal(signal.SIGCONT)
        eventually(lambda: (serving(rig.db) or ("1", 0))[0] == "2", 60)
        eventually(lambda: rig.row("old", "effector").get("state") == "retired", 30)
    finally:
        stop.touch()
        producer.wait(timeout=30)
    assert producer.returncode == 0
    new.send_signal(signal.SIGTERM)  # the final host serves from here, as after a deploy
    assert new.wait(timeout=30) == 0
    check_once_each(rig)

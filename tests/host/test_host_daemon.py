"""`streamkit host` as a real daemon process: CLI clients, SIGTERM, kill -9, two hosts and takeover."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SUPPORT
from support.backends import BACKENDS
from support.daemon import HostRig as Rig
from support.daemon import eventually

from streamkit import open_log
from streamkit._targets import default_socket
from streamkit.backends import host_store
from streamkit.errors import InvalidRequest
from streamkit.host._signals import REPEAT_SIGNAL_WINDOW

pytestmark = pytest.mark.slow


def append_items(db: str, count: int) -> list[int]:
    async def run() -> list[int]:
        async with open_log(db) as log:
            done = await log.stream("/").append(*({"type": "item"} for _ in range(count)))
        return [e.offset for e in done]

    return asyncio.run(run())


def log_items(db: str) -> list[int]:
    """The offsets of the items on ``/``, read through the public API (any backend)."""

    async def read() -> list[int]:
        async with open_log(db) as log:
            stream, found, after = log.stream("/"), [], 0
            while True:
                page = await stream.read(after, 500)
                found += [e.offset for e in page.events if e.type == "item"]
                after = page.scanned_through_offset
                if page.at_head:
                    return found

    return asyncio.run(read())


def checkpoint(db: str, slug: str = "tally") -> tuple[int, list[int]]:
    """The stored checkpoint of ``slug``: its cursor and the offsets its state holds."""

    async def read() -> tuple[dict[str, Any] | None, int]:
        async with open_log(db) as log:
            head = await log.stream("/").head()
            try:
                return await host_store(log).stored_snapshot(slug), head
            except InvalidRequest:
                return None, head

    snapshot, head = asyncio.run(read())
    if snapshot is None:
        return 0, []
    cursor, state = int(snapshot["offset"]), snapshot["state"]
    offsets = [] if state is None else list(state["offsets"])
    # No checkpoint is ahead of its events: nothing past the durable head.
    assert not offsets or offsets[-1] <= head
    return cursor, offsets


def test_daemon_serves_cli_clients_and_stops_on_sigterm(rig: Rig) -> None:
    """Appends from other processes are reduced; status, snapshot, watch work; SIGTERM exits 0."""
    daemon = rig.host("a")
    sock = rig.socket("a")
    offsets = []
    for n in range(2):
        out = rig.cli("append", "--db", rig.db, "item", "--payload", f'{{"n":{n}}}', "--json")
        offsets.append(json.loads(out.stdout)["offset"])
    eventually(lambda: rig.row("a")["cursor"] >= offsets[-1])
    row = rig.row("a")
    assert (row["state"], row["lag"], row["lease_held_here"]) == ("running", 0, True)
    snapshot = json.loads(rig.cli("snapshot", "tally", "--db", rig.db, "--json").stdout)
    assert snapshot["state"]["offsets"] == offsets
    argv = [sys.executable, "-m", "streamkit", "watch", "tally", "--db", rig.db, "--json"]
    watcher = subprocess.Popen(
        [*argv, "--socket", sock, "--limit", "2"],
        env=rig.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    rig.track(watcher)
    assert watcher.stdout is not None
    seed = json.loads(watcher.stdout.readline())
    assert (seed["kind"], seed["state"]["offsets"]) == ("seed", offsets)
    rig.cli("append", "--db", rig.db, "item")
    delta = json.loads(watcher.stdout.readline())
    assert (delta["kind"], delta["from"]) == ("delta", seed["rev"])
    assert watcher.wait(timeout=30) == 0
    watcher.stdout.close()
    assert watcher.stderr is not None
    watcher.stderr.close()
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=30) == 0
    assert not os.path.exists(sock)
    lines = [json.loads(line) for line in rig.host_log("a").splitlines() if line.startswith("{")]
    names = [line["event"] for line in lines]
    for expected in ("lease.acquired", "catch_up.done", "host.started", "lease.released"):
        assert expected in names
    assert names[-1] == "host.stopped"
    # With no host, status reads the database: the lease is released, the cursor kept.
    offline = json.loads(rig.cli("status", "--db", rig.db, "--json").stdout)
    (row,) = offline["processors"]
    assert row["lease"]["released"] is True
    assert row["cursor"] == checkpoint(rig.db)[0]
    assert checkpoint(rig.db)[1] == log_items(rig.db)


def test_second_host_takes_over_after_kill_9(rig: Rig) -> None:
    """Kill -9 the lease holder: the waiting host takes over after the lease expires, no event twice."""
    first = rig.host("a", ttl="1")
    eventually(lambda: rig.row("a")["state"] == "running")
    rig.host("b", ttl="1")
    assert rig.row("b")["state"] == "waiting"
    before = append_items(rig.db, 20)
    eventually(lambda: rig.row("a")["cursor"] >= before[-1])
    first.kill()
    first.wait()
    eventually(lambda: rig.row("b")["state"] == "running")
    after = append_items(rig.db, 20)
    eventually(lambda: rig.row("b")["cursor"] >= after[-1])
    assert rig.row("b")["lease"]["generation"] == 2
    assert checkpoint(rig.db)[1] == before + after == log_items(rig.db)


APPENDER = """
import asyncio, os, sys
from streamkit import open_log
from streamkit._targets import default_socket
from streamkit.backends import host_store
from streamkit.errors import InvalidRequest

async def main(db, stop):
    async with open_log(db) as log:
        stream = log.stream("/")
        while not os.path.exists(stop):
            await stream.append({"type": "item"}, {"type": "item"})
            await asyncio.sleep(0.002)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_kill_9_at_random_moments_loses_nothing(rig: Rig) -> None:
    """Killed repeatedly under load, every durable event ends up reduced exactly once."""
    stop = rig.tmp / "stop"
    appender = rig.track(
        subprocess.Popen([sys.executable, "-c", APPENDER, rig.db, str(stop)], env=rig.env)
    )
    chooser = random.Random(4)
    try:
        for round_ in range(4):
            daemon = rig.host(f"k{round_}", ttl="1")
            time.sleep(chooser.uniform(0.1, 0.6))
            daemon.kill()
            daemon.wait()
            cursor, offsets = checkpoint(rig.db)
            assert len(offsets) == len(set(offsets))
            assert offsets == [o for o in log_items(rig.db) if o <= cursor]
    finally:
        stop.touch()
        appender.wait(timeout=30)
    assert appender.returncode == 0
    final = rig.host("final", ttl="1")
    head = log_items(rig.db)[-1]
    eventually(lambda: (rig.row("final")["cursor"] or 0) >= head)
    final.send_signal(signal.SIGTERM)
    assert final.wait(timeout=30) == 0
    cursor, offsets = checkpoint(rig.db)
    assert offsets == log_items(rig.db)
    assert cursor >= head


SHARED = ("hostprocs:Tally", "hostprocs:Second", "hostprocs:Third", "hostprocs:Fourth")


def test_three_hosts_share_four_processors_and_survive_a_kill_9(rig: Rig) -> None:
    """Three daemons split four processors (status says who runs what); kill -9 one of them
    under load: the others take its processors over and every item is reduced once by each."""
    stop = rig.tmp / "stop"
    children = {name: rig.host(name, *SHARED, ttl="1") for name in ("a", "b", "c")}

    def placement() -> dict[str, str | None]:
        out = rig.cli("status", "--db", rig.db, "--json").stdout
        return {row["slug"]: row["host"] for row in json.loads(out)["processors"]}

    def shared() -> bool:
        hosts = list(placement().values())
        return None not in hosts and sorted(hosts.count(h) for h in set(hosts)) == [1, 1, 2]

    eventually(shared)
    appender = rig.track(
        subprocess.Popen([sys.executable, "-c", APPENDER, rig.db, str(stop)], env=rig.env)
    )
    try:
        time.sleep(0.5)
        victim = next(h for h in placement().values() if h is not None)
        name = next(n for n, child in children.items() if str(child.pid) in str(victim))
        children[name].kill()
        children[name].wait()
        # Within a few ttls the two left run everything between them.
        eventually(lambda: victim not in placement().values() and None not in placement().values())
        time.sleep(0.5)
    finally:
        stop.touch()
        appender.wait(timeout=30)
    assert appender.returncode == 0
    head = log_items(rig.db)[-1]
    for slug in ("tally", "second", "third", "fourth"):
        eventually(lambda slug=slug: checkpoint(rig.db, slug)[0] >= head)
        assert checkpoint(rig.db, slug)[1] == log_items(rig.db), slug


def test_second_signal_exits_at_once(rig: Rig) -> None:
    """SIGTERM waits for background work within the grace; a second signal exits at once."""
    daemon = rig.start_host(
        "g", "--db", rig.db, "--grace", "60", "--processor", "hostprocs:Lingering"
    )
    append_items(rig.db, 1)
    eventually(lambda: rig.row("g", "lingering")["claim_due"] is not None)
    daemon.send_signal(signal.SIGTERM)
    eventually(lambda: "host.stopping" in rig.host_log("g"))
    time.sleep(REPEAT_SIGNAL_WINDOW + 0.1)  # a signal sooner is the first one's echo
    assert daemon.poll() is None  # still giving the background work its grace
    daemon.send_signal(signal.SIGINT)
    assert daemon.wait(timeout=30) == 128 + signal.SIGINT
    assert "host.exit_now" in rig.host_log("g")


def test_a_signal_echoed_at_once_is_one_clean_stop(rig: Rig) -> None:
    """Two SIGTERMs microseconds apart (as `timeout` sends them) stop once, releasing the leases."""
    daemon = rig.host("e")
    append_items(rig.db, 1)
    eventually(lambda: rig.row("e")["cursor"] >= 1)
    os.kill(daemon.pid, signal.SIGTERM)
    os.kill(daemon.pid, signal.SIGTERM)
    os.kill(daemon.pid, signal.SIGINT)
    assert daemon.wait(timeout=30) == 0
    out = rig.host_log("e")
    assert "host.exit_now" not in out
    assert "host.signal_repeated" in out  # (the kernel may merge the two SIGTERMs into one)
    assert "lease.released" in out


def test_a_cli_retry_after_a_frozen_host_never_duplicates(rig: Rig) -> None:
    """An append to a SIGSTOPped host times out with a retry command; re-running it appends once."""
    daemon = rig.host("a")
    daemon.send_signal(signal.SIGSTOP)
    try:
        done = rig.cli(
            "append", "--db", rig.db, "--socket", rig.socket("a"), "item",
            "--payload", '{"n": 7}', "--timeout", "1", check=False,
        )  # fmt: skip
    finally:
        daemon.send_signal(signal.SIGCONT)
    assert done.returncode == 1, done.stderr
    # The safe retry comes first, marked, not buried after the explanation.
    assert done.stderr.startswith("Error: the append's outcome is unknown: ")
    assert "it may still land" in done.stderr
    assert "idempotency_key 'cli/" in done.stderr
    retry = done.stderr.split("RETRY WITH: ", 1)[1].split(" (that key appends it at most once")[0]
    argv = shlex.split(retry)
    assert argv[0] == "streamkit"
    assert "--idempotency-key" in argv
    # The frozen host applies the first request once it runs again.
    eventually(lambda: len(log_items(rig.db)) == 1)
    again = rig.cli(*argv[1:], "--json")
    (offset,) = log_items(rig.db)
    assert json.loads(again.stdout)["offset"] == offset
    assert log_items(rig.db) == [offset]


MARKER = """
from pathlib import Path
from pydantic import BaseModel
from streamkit import StreamProcessor, define_processor_contract

class Empty(BaseModel):
    pass

class Marker(StreamProcessor[Empty]):
    contract = define_processor_contract(
        slug="marker", version="1", description="writes a file where its path says",
        state_schema=Empty, consumes=["never"], emits=[],
    )

    def __init__(self, path: str) -> None:
        Path(path).write_text("here")
"""


def test_relative_paths_in_processor_settings_follow_the_config_file(tmp_path: Path) -> None:
    """Started elsewhere, a host resolves a processor's relative path against its config file."""
    config_dir, elsewhere = tmp_path / "conf", tmp_path / "elsewhere"
    config_dir.mkdir()
    elsewhere.mkdir()
    (config_dir / "markerproc.py").write_text(MARKER)
    sockets = Path(tempfile.mkdtemp(dir="/tmp", prefix="skrel"))
    try:
        (config_dir / "streamkit.toml").write_text(
            'db = "app.db"\n'
            f'socket = "{sockets}/h.sock"\n'
            "[[processors]]\n"
            'class = "markerproc:Marker"\n'
            '[processors.kwargs]\npath = "marker.txt"\n'
        )
        env = {**os.environ, "PYTHONPATH": str(config_dir)}
        child = subprocess.Popen(
            [sys.executable, "-m", "streamkit", "host", "--config", "../conf/streamkit.toml"],
            cwd=elsewhere,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            eventually(lambda: (sockets / "h.sock").exists() or child.poll() is not None)
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=30)
            if child.stderr is not None:
                child.stderr.close()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert (config_dir / "marker.txt").read_text() == "here"
    assert (config_dir / "app.db").exists()
    assert not (elsewhere / "marker.txt").exists()


@pytest.fixture(params=sorted(BACKENDS))
def db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh log target of each backend in turn: a file in ``tmp_path``, or a URL."""
    if request.param == "sqlite":
        yield str(tmp_path / "s.db")
        return
    target = BACKENDS[request.param].fresh()
    try:
        yield target.target
    finally:
        target.remove()


def test_standby_hosts_need_no_flags_and_commands_find_the_lease_holder(
    tmp_path: Path, db: str
) -> None:
    """Two hosts on one log with default settings; after kill -9, status finds the new holder."""
    shutil.copy(SUPPORT / "host.py", tmp_path / "hostprocs.py")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    argv = [sys.executable, "-m", "streamkit", "host", "--db", str(db), "--lease-ttl", "1"]
    argv += ["--processor", "hostprocs:Tally"]
    children = []

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streamkit", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def status() -> dict[str, Any]:
        done = cli("status", "--db", str(db), "--json")
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    try:
        first = subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.DEVNULL)
        children.append(first)
        eventually(lambda: Path(default_socket(db)).exists())
        eventually(lambda: len(status()["hosts"]) == 1)
        second = subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.DEVNULL)
        children.append(second)
        eventually(lambda: len(status()["hosts"]) == 2)
        assert second.poll() is None  # not refused for the taken default socket
        (row,) = status()["processors"]
        holder = row["host"]
        assert row["state"] == "running"
        assert str(first.pid) in holder
        first.kill()
        first.wait()
        # The default socket is dead now; status and snapshot find the host that took over.
        eventually(lambda: status()["processors"][0]["host"] != holder, timeout=30)
        eventually(lambda: status()["processors"][0]["state"] == "running", timeout=30)
        assert str(second.pid) in status()["processors"][0]["host"]
        offsets = append_items(str(db), 2)
        eventually(lambda: (status()["processors"][0]["cursor"] or 0) >= offsets[-1])
        snapshot = cli("snapshot", "tally", "--db", str(db), "--json")
        assert snapshot.returncode == 0, snapshot.stderr
        assert json.loads(snapshot.stdout)["source"] == "engine"
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()


def test_a_rolling_deploy_moves_a_processor_to_newer_code_and_loses_nothing(rig: Rig) -> None:
    """Old code holds the lease; new code joins; a producer writes version 4: the old host stalls
    before it with SCHEMA_AHEAD and stops offering it, the new one takes over from the checkpoint,
    and every event is reduced exactly once, none skipped."""
    from support.upcasting import stored_at, stored_at_v4

    shutil.copy(SUPPORT / "upcasting.py", rig.tmp / "boards.py")
    rig.host("old", "boards:TaskBoard", ttl="1")
    eventually(lambda: rig.row("old", "task-board")["state"] == "running")
    rig.host("new", "boards:NextTaskBoard", ttl="1")
    assert rig.row("new", "task-board")["state"] == "waiting"

    async def produce(*events: dict[str, Any]) -> list[int]:
        async with open_log(rig.db) as log:
            return [e.offset for e in await log.stream("/").append(*events)]

    older = [stored_at(1, f"t{n}", 0, "ana") for n in range(5)]
    older += [stored_at(3, f"u{n}", 1, "bo") for n in range(5)]
    first = asyncio.run(produce(*older))
    eventually(lambda: rig.row("old", "task-board")["cursor"] >= first[-1])
    newer = [stored_at_v4(f"v{n}", 2, "cy", "mon") for n in range(5)]
    newer += [stored_at(3, f"w{n}", 1, "di") for n in range(5)]
    second = asyncio.run(produce(*newer))
    eventually(lambda: rig.row("new", "task-board")["state"] == "running")
    eventually(lambda: rig.row("new", "task-board")["cursor"] >= second[-1])
    old_row = rig.row("old", "task-board")
    assert old_row["state"] == "waiting"
    assert old_row["ahead_of_code"]["offset"] == second[0]
    assert old_row["last_error"]["code"] == "SCHEMA_AHEAD"
    assert rig.row("new", "task-board")["malformed_payloads"] == 0
    shown = rig.cli("status", "--db", rig.db, "--socket", rig.socket("old")).stdout
    assert f"cannot read offset {second[0]} (task.created v4, this code knows v3)" in shown

    async def stored() -> dict[str, Any]:
        async with open_log(rig.db) as log:
            snapshot: dict[str, Any] = await host_store(log).stored_snapshot("task-board")
            return snapshot

    state = asyncio.run(stored())["state"]
    titles = [f"t{n}" for n in range(5)] + [f"u{n}" for n in range(5)]
    titles += [f"v{n}" for n in range(5)] + [f"w{n}" for n in range(5)]
    assert state["titles"] == titles  # each once, in log order: none skipped, none twice

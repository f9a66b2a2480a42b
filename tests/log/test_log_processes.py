"""Several real processes on one log file: commit order, unique offsets, kill -9, following."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from support import SUPPORT

from streamkit import open_log

CHILD = SUPPORT / "log_child.py"

pytestmark = pytest.mark.slow


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> list[list[str]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return [line.split() for line in out.splitlines()]


def run_children(
    db: Path, go: Path, count: int, every: int, tags: list[str]
) -> dict[str, list[list[str]]]:
    procs = {tag: spawn("append", str(db), tag, str(count), str(every), str(go)) for tag in tags}
    go.touch()
    return {tag: finish(proc) for tag, proc in procs.items()}


async def test_processes_append_in_commit_order(tmp_path: Path) -> None:
    """Four processes appending at once get unique, consecutive offsets in commit order."""
    db = tmp_path / "shared.db"
    async with open_log(db):
        pass  # create the file first, so the children race only on appends
    lines = run_children(db, tmp_path / "go", 120, 0, ["a", "b", "c", "d"])
    async with open_log(db) as log:
        events = list((await log.stream("/shared").read(0, 10_000)).events)
    assert [e.offset for e in events] == list(range(1, 481))
    created = [e.created_at for e in events]
    assert created == sorted(created)
    for tag, printed in lines.items():
        mine = [e for e in events if e.payload["tag"] == tag]
        assert [e.payload["i"] for e in mine] == list(range(120))
        assert [int(p[1]) for p in printed] == [e.offset for e in mine]


async def test_processes_with_ephemerals_never_share_an_offset(tmp_path: Path) -> None:
    """Processes mixing ephemerals: every offset handed out is unique; durables skip ephemerals."""
    db = tmp_path / "shared.db"
    async with open_log(db):
        pass
    lines = run_children(db, tmp_path / "go", 90, 3, ["a", "b", "c"])
    handed: list[int] = []
    ephemerals: set[int] = set()
    for printed in lines.values():
        own = [int(p[1]) for p in printed]
        assert own == sorted(own)
        assert len(set(own)) == len(own)
        handed += own
        ephemerals |= {int(p[1]) for p in printed if p[0] == "E"}
    assert len(set(handed)) == len(handed)
    async with open_log(db) as log:
        stream = log.stream("/shared")
        durable = [e.offset for e in (await stream.read(0, 10_000)).events]
        assert sorted(int(p[1]) for ps in lines.values() for p in ps if p[0] == "D") == durable
        assert not ephemerals & set(durable)
        (after,) = await stream.append({"type": "parent.appended"})
        assert after.offset > max(handed)


async def test_kill_9_keeps_every_acknowledged_append(tmp_path: Path) -> None:
    """After kill -9 mid-flight, every acknowledged event is in the log and no offset is reused."""
    db = tmp_path / "shared.db"
    proc = spawn("forever", str(db))
    assert proc.stdout is not None
    seen: list[list[str]] = []
    while len(seen) < 150:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "child exited"
        seen.append(line.split())
    proc.kill()
    rest, _ = proc.communicate(timeout=30)
    # Lines the child finished printing before it died were acknowledged too.
    seen += [line.split() for line in rest.splitlines(keepends=True) if line.endswith("\n")]
    assert proc.returncode == -9
    acked = {int(p[1]): int(p[2]) for p in seen if p[0] == "D"}
    ephemerals = [int(p[1]) for p in seen if p[0] == "E"]
    async with open_log(db) as log:
        stream = log.stream("/shared")
        stored = {e.offset: e.payload["i"] for e in (await stream.read(0, 10_000)).events}
        assert acked.items() <= stored.items()
        (durable,) = await stream.append({"type": "after.crash"})
        (tick,) = await stream.append({"type": "after.crash", "ephemeral": True})
        assert durable.offset > max(ephemerals)
        assert durable.offset > max(stored)
        assert tick.offset > durable.offset


async def test_a_follower_sees_another_process_commits(tmp_path: Path) -> None:
    """A follower in this process receives another process's commits, contiguous and once each."""
    db = tmp_path / "shared.db"
    go = tmp_path / "go"
    async with open_log(db) as log:
        stream = log.stream("/shared")
        follower = stream.follow()
        proc = spawn("append", str(db), "x", "60", "4", str(go))
        go.touch()
        printed = await asyncio.to_thread(finish, proc)
        last = max(int(p[1]) for p in printed if p[0] == "D")
        after, durable = 0, []
        while after < last:
            events, scanned = await asyncio.wait_for(anext(follower), 10)
            assert scanned.after == after
            after = scanned.through
            durable += [e.offset for e in events]
        assert not any(e.ephemeral for e in events)
        assert durable == [int(p[1]) for p in printed if p[0] == "D"]

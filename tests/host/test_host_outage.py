"""The PostgreSQL server stops for 10 s in the middle of a run: hosts and writers ride it out.

A private cluster (the shared test server must stay up for the other tests)
is paused with a fast shutdown while an appender process and a daemon host
are working, then started again. Meanwhile ``status`` says the database is
unreachable; afterwards everything acknowledged is in the log, every key
once, and the processor has reduced each event exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from support import SUPPORT
from support.daemon import DaemonRig, eventually
from support.postgres import postgres_url

pytestmark = pytest.mark.slow

ROOT = SUPPORT.parent.parent
CLUSTER = ROOT / "scripts" / "pg-cluster"

APPENDER = """
import asyncio, os, sys
from streamkit import open_log
from streamkit.errors import StorageError

async def main(db, stop, acked):
    n = 0
    with open(acked, "a", buffering=1) as out:
        async with open_log(db) as log:
            stream = log.stream("/")
            while not os.path.exists(stop):
                event = {"type": "item", "idempotency_key": f"k{n}", "payload": {"n": n}}
                try:
                    (done,) = await stream.append(event)
                except StorageError:
                    await asyncio.sleep(0.1)  # the same key again: a retry lands once
                    continue
                out.write(f"{n} {done.offset}\\n")
                n += 1
                await asyncio.sleep(0.01)

asyncio.run(main(*sys.argv[1:4]))
"""

READ_ALL = """
import asyncio, json, sys
from streamkit import open_log
from streamkit.backends import host_store

async def main(db):
    async with open_log(db) as log:
        stream, after, items = log.stream("/"), 0, []
        while True:
            page = await stream.read(after, 500)
            items += [[e.offset, e.idempotency_key] for e in page.events if e.type == "item"]
            after = page.scanned_through_offset
            if page.at_head:
                break
        snapshot = await host_store(log).stored_snapshot("tally")
        print(json.dumps({"items": items, "cursor": snapshot["offset"],
                          "offsets": snapshot["state"]["offsets"]}))

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture
def cluster() -> Iterator[tuple[Path, str]]:
    postgres_url()  # skips (fails in CI) the same way when there is no server
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="skpgout"))
    url = subprocess.run(
        [sys.executable, str(CLUSTER), "start", str(folder), "--fsync", "off"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        yield folder, url
    finally:
        subprocess.run([sys.executable, str(CLUSTER), "stop", str(folder)], check=False)


def test_a_server_outage_of_10_seconds_loses_nothing_and_reduces_nothing_twice(
    tmp_path: Path, cluster: tuple[Path, str]
) -> None:
    folder, url = cluster
    db = f"{url}?schema=outage"
    (tmp_path / "hostprocs.py").write_text((SUPPORT / "host.py").read_text())
    stop, acked = tmp_path / "stop", tmp_path / "acked.txt"
    with closing(DaemonRig(tmp_path, socket_prefix="sko", tmp_on_pythonpath=True)) as rig:
        rig.start_host(
            "a", "--db", db, "--lease-ttl", "15", "--log-format", "json",
            "--processor", "hostprocs:Tally",
        )  # fmt: skip
        appender = rig.track(
            subprocess.Popen(
                [sys.executable, "-c", APPENDER, db, str(stop), str(acked)], env=rig.env
            )
        )

        def status() -> dict[str, object]:
            done = subprocess.run(
                [sys.executable, "-m", "streamkit", "status", "--db", db, "--socket",
                 rig.socket("a"), "--json"],
                env=rig.env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            result: dict[str, object] = json.loads(done.stdout)
            return result

        eventually(lambda: acked.exists() and len(acked.read_text().splitlines()) > 20)
        subprocess.run([sys.executable, str(CLUSTER), "pause", str(folder)], check=True)
        try:
            down = status()["database"]
            assert isinstance(down, dict)
            assert down["reachable"] is False
            assert down["code"] == "STORAGE_UNAVAILABLE"
            time.sleep(10)
        finally:
            subprocess.run([sys.executable, str(CLUSTER), "resume", str(folder)], check=True)
        before = len(acked.read_text().splitlines())
        eventually(lambda: len(acked.read_text().splitlines()) > before + 20, timeout=60)
        stop.touch()
        assert appender.wait(timeout=60) == 0
        up = status()["database"]
        assert isinstance(up, dict)
        assert up["reachable"] is True

        def final() -> dict[str, list[list[object]] | int | list[int]]:
            done = subprocess.run(
                [sys.executable, "-c", READ_ALL, db],
                env=rig.env, capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            result: dict[str, list[list[object]] | int | list[int]] = json.loads(done.stdout)
            return result

        head = max(offset for offset, _ in final()["items"])  # type: ignore[misc, union-attr]
        eventually(lambda: final()["cursor"] >= head, timeout=60)  # type: ignore[operator]
        state = final()
    items = state["items"]
    assert isinstance(items, list)
    keys = [key for _, key in items]
    assert len(keys) == len(set(keys)), "a retried append landed twice"
    offsets = {offset for offset, _ in items}
    for line in acked.read_text().splitlines():
        _, offset = line.split()
        assert int(offset) in offsets, f"acknowledged offset {offset} is not in the log"
    assert state["offsets"] == sorted(offsets), "not every event reduced exactly once"

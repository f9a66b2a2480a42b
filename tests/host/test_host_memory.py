"""The daemon's memory stays bounded by bytes while clients stall and large events stream in."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from support.daemon import HostRig as Rig
from support.daemon import eventually

from streamkit.control import request_sync

pytestmark = pytest.mark.slow

EVENT_BYTES = 1_000_000
EVENTS = 1_000  # 1 GB in all

PRODUCER = f"""
import asyncio, sys
from streamkit import open_log

async def main(db):
    blob = "x" * {EVENT_BYTES}
    async with open_log(db, synchronous="NORMAL") as log:
        stream = log.stream("/")
        for n in range({EVENTS}):
            await stream.append({{"type": "item", "payload": {{"n": n, "blob": blob}}}})

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with closing(Rig(tmp_path)) as made:
        yield made


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def stalled_client(path: str, request: bytes) -> socket.socket:
    """A client that sends one streaming request and then never reads a byte."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(path)
    client.sendall(request)
    return client


class PeakSampler:
    """Samples a process's RSS every 50 ms in a thread and keeps the highest."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def test_stalled_watcher_and_follower_keep_the_host_bounded_while_1_gb_arrives(rig: Rig) -> None:
    """A watcher and a follower that never read: host RSS grows under 100 MB over 1 GB appended."""
    host = rig.host("m", "hostprocs:Tally")
    sock = rig.socket("m")
    eventually(lambda: rig.row("m")["state"] == "running")
    watcher = stalled_client(sock, b'{"id": 1, "op": "watch", "slug": "tally"}\n')
    follower = stalled_client(sock, b'{"id": 2, "op": "follow", "path": "/", "after": 0}\n')
    try:
        time.sleep(0.5)
        baseline = rss_bytes(host.pid)
        sampler = PeakSampler(host.pid)
        try:
            producer = subprocess.run(
                [sys.executable, "-c", PRODUCER, rig.db],
                env=rig.env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert producer.returncode == 0, producer.stderr
            # The processor keeps up all the while; wait until it has reduced everything.
            eventually(lambda: (rig.row("m")["cursor"] or 0) >= EVENTS, timeout=300)
        finally:
            peak = sampler.stop()
        growth = peak - baseline
        assert growth < 100 * 1024 * 1024, f"host RSS grew by {growth / 2**20:.0f} MiB"

        # One legal read of 10,000 events over 1 MB each: a page cut by bytes, answered.
        page = request_sync(sock, "read", path="/", after=0, limit=10_000, timeout=60)
        events = page["events"]
        assert 1 <= len(events) <= 5
        assert page["scanned_through_offset"] == events[-1]["offset"]
        assert page["at_head"] is False
        assert rss_bytes(host.pid) - baseline < 100 * 1024 * 1024
    finally:
        watcher.close()
        follower.close()
    # The stalled clients are gone; the host serves on.
    assert rig.row("m")["state"] == "running"
    assert os.path.exists(sock)

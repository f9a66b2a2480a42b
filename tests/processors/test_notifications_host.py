"""The notifications processor under the real `streamkit host` daemon: kill -9, restart, no resend."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from streamkit.processors.notifications import read_outbox
from support.daemon import DaemonRig, eventually

from streamkit import open_log

pytestmark = pytest.mark.slow


class Daemon(DaemonRig):
    """Starts `streamkit host` children running one notifications processor; kills them all."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, socket_prefix="skn")
        self.db = str(tmp / "app.db")
        self.outbox = tmp / "outbox.jsonl"
        kwargs = {
            "rules": [
                {
                    "name": "created",
                    "event_type": "task.created",
                    "template": "Task $title",
                    "channel": "outbox",
                }
            ],
            "channels": {"outbox": {"kind": "outbox", "path": str(self.outbox)}},
        }
        self.spec = "streamkit.processors.notifications:NotificationsProcessor" + json.dumps(kwargs)

    def start(self) -> subprocess.Popen[bytes]:
        argv = ["--db", self.db, "--lease-ttl", "1", "--processor", self.spec]
        return self.start_host("n", *argv, log="host")

    def append_tasks(self, first: int, count: int) -> list[int]:
        async def run() -> list[int]:
            async with open_log(self.db) as log:
                done = await log.stream("/").append(
                    *(
                        {"type": "task.created", "payload": {"title": f"T{first + n}"}}
                        for n in range(count)
                    )
                )
            return [e.offset for e in done]

        return asyncio.run(run())

    def logged(self, etype: str) -> list[dict[str, Any]]:
        async def run() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            async with open_log(self.db) as log:
                after = 0
                while True:
                    page = await log.stream("/").read(after)
                    found += [e.payload for e in page.events if e.type == etype]
                    after = page.scanned_through_offset
                    if page.at_head:
                        return found

        return asyncio.run(run())


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with closing(Daemon(tmp_path)) as made:
        yield made


def test_the_daemon_never_resends_across_kill_and_restart(daemon: Daemon) -> None:
    """Killed with -9 and restarted (then stopped and started again), each id is written once."""
    offsets = daemon.append_tasks(1, 5)
    host = daemon.start()
    eventually(lambda: len(daemon.logged("notification.sent")) == 5)
    host.kill()
    host.wait()

    offsets += daemon.append_tasks(6, 3)  # appended while no host runs
    host = daemon.start()
    eventually(lambda: len(daemon.logged("notification.sent")) == 8)
    host.send_signal(signal.SIGTERM)
    assert host.wait(timeout=30) == 0

    # A third start catches up over everything and finds nothing owed.
    catch_ups = daemon.host_log("host").count("catch_up.done")
    host = daemon.start()
    eventually(lambda: daemon.host_log("host").count("catch_up.done") > catch_ups)
    host.send_signal(signal.SIGTERM)
    assert host.wait(timeout=30) == 0

    lines = read_outbox(daemon.outbox)
    ids = [line["id"] for line in lines]
    # Attempts run concurrently, so lines land in any order, but each id once.
    assert sorted(ids) == sorted(f"created@{offset}" for offset in offsets)
    assert len(set(ids)) == len(ids) == 8
    assert sorted(line["body"] for line in lines) == [f"Task T{n}" for n in range(1, 9)]
    sent = sorted(p["notification_id"] for p in daemon.logged("notification.sent"))
    assert sent == sorted(ids)

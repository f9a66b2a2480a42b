"""``streamkit host --http``: the daemon as a real subprocess, served over HTTP on 127.0.0.1."""

from __future__ import annotations

import re
import shutil
import signal
import socket
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from support import ROOT
from support.daemon import DaemonRig, eventually

SUPPORT = ROOT / "tests" / "support"


def free_port() -> int:
    with closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[DaemonRig]:
    shutil.copy(SUPPORT / "host.py", tmp_path / "hostprocs.py")
    made = DaemonRig(tmp_path, socket_prefix="skw", tmp_on_pythonpath=True)
    try:
        yield made
    finally:
        made.close()


def test_the_daemon_serves_http_and_stops_it_on_sigterm(rig: DaemonRig, tmp_path: Path) -> None:
    """Appends over HTTP reach the processor; /healthz is green; SIGTERM ends it cleanly."""
    port = free_port()
    daemon = rig.start_host(
        "w",
        "--db",
        str(tmp_path / "w.db"),
        "--processor",
        "hostprocs:Tally",
        "--http",
        f"127.0.0.1:{port}",
    )
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=10.0) as client:
        eventually(lambda: _answers(client))
        response = client.post("/v1/events", json=[{"type": "item"}, {"type": "item"}])
        assert response.status_code == 201

        def processed() -> bool:
            return client.get("/v1/processors/tally").json()["offset"] == 2

        eventually(processed)
        health = client.get("/healthz")
        assert (health.status_code, health.json()["status"]) == (200, "ok")
        assert "streamkit_processor_cursor" in client.get("/metrics").text
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    assert "http.listening" in rig.host_log("w")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/healthz", timeout=2.0)


def test_a_taken_port_fails_the_start_and_says_so(rig: DaemonRig, tmp_path: Path) -> None:
    """--http on a port something else holds: the host exits non-zero with the reason."""
    with closing(socket.socket()) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(AssertionError, match=re.escape("cannot listen on 127.0.0.1")):
            rig.start_host(
                "t",
                "--db",
                str(tmp_path / "t.db"),
                "--processor",
                "hostprocs:Tally",
                "--http",
                f"127.0.0.1:{port}",
            )


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False

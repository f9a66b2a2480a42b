"""``streamkit host --http``: the daemon as a real subprocess, served over HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from support import ROOT, free_port
from support.daemon import DaemonRig, admin_address, eventually, owner_headers, wait_for_http

from streamkit import open_log
from streamkit.control import ControlClient
from streamkit.errors import InvalidRequest, ProcessorTimeout

SUPPORT = ROOT / "tests" / "support"


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[DaemonRig]:
    shutil.copy(SUPPORT / "host.py", tmp_path / "hostprocs.py")
    made = DaemonRig(tmp_path, socket_prefix="skw", tmp_on_pythonpath=True)
    try:
        yield made
    finally:
        made.close()


def _tally_over_http(
    rig: DaemonRig, tmp_path: Path, name: str
) -> tuple[subprocess.Popen[bytes], str]:
    """A daemon running ``hostprocs:Tally`` on ``<name>.db``, serving HTTP: it and its base URL."""
    port = free_port()
    daemon = rig.start_host(
        name,
        "--db",
        str(tmp_path / f"{name}.db"),
        "--processor",
        "hostprocs:Tally",
        "--http",
        f"127.0.0.1:{port}",
    )
    return daemon, f"http://127.0.0.1:{port}"


def test_the_daemon_serves_http_and_stops_it_on_sigterm(rig: DaemonRig, tmp_path: Path) -> None:
    """Appends over HTTP reach the processor; /healthz is green; SIGTERM ends it cleanly."""
    daemon, base = _tally_over_http(rig, tmp_path, "w")
    with httpx.Client(
        base_url=base, timeout=10.0, headers=owner_headers(tmp_path / "w.db")
    ) as client:
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


def test_a_stop_ends_open_live_streams_cleanly_and_logs_only_json(
    rig: DaemonRig, tmp_path: Path
) -> None:
    """SIGTERM with SSE clients attached: each stream ends with `: stopping`, exit 0, JSON only."""
    port = free_port()
    daemon = rig.start_host(
        "j", "--db", str(tmp_path / "j.db"), "--processor", "hostprocs:Tally",
        "--http", f"127.0.0.1:{port}", "--log-format", "json",
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    received: dict[str, list[str]] = {}
    connected = threading.Barrier(3)
    owner = owner_headers(tmp_path / "j.db")

    def follow(name: str, url: str) -> None:
        lines = received.setdefault(name, [])
        with httpx.stream(
            "GET", url, headers={"Accept": "text/event-stream", **owner}, timeout=30.0
        ) as response:
            for line in response.iter_lines():
                lines.append(line)
                if line == ": connected":
                    connected.wait(10)

    with httpx.Client(base_url=base, timeout=10.0) as client:
        eventually(lambda: _answers(client))
    readers = [
        threading.Thread(target=follow, args=(name, f"{base}{url}"), daemon=True)
        for name, url in (("events", "/v1/events"), ("live", "/v1/processors/tally/live"))
    ]
    for reader in readers:
        reader.start()
    connected.wait(10)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    for reader in readers:
        reader.join(10)
        assert not reader.is_alive(), "a live stream was still open after the host stopped"
    for name, lines in received.items():
        assert ": stopping" in lines, (name, lines)
    log = rig.host_log("j")
    assert "Traceback" not in log
    events = [json.loads(line)["event"] for line in log.splitlines() if line.strip()]
    assert "http.streams_ended" in events
    assert events[-1] == "host.stopped"


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


def test_a_daemon_rebuilding_a_new_version_answers_at_once_and_says_what_serves(
    rig: DaemonRig, tmp_path: Path
) -> None:
    """Never dark: a daemon started with version 2 answers its socket, /healthz and the
    processor's state while it rebuilds (version 1's state, marked stale), /readyz names what
    it waits for and `status` shows the rebuild; once cut over, everything serves version 2."""
    db = tmp_path / "r.db"
    count = 25_000

    async def prefill() -> None:
        async with open_log(db) as log:
            for _ in range(count // 5_000):
                quiet = {"type": "item", "payload": {"n": 1, "quiet": True}}
                await log.stream("/").append(*(quiet for _ in range(5_000)))

    asyncio.run(prefill())
    first = rig.start_host("r1", "--db", str(db), "--processor", "hostprocs:Effector")

    async def cursor(name: str) -> int:
        async with ControlClient(rig.socket(name), timeout=20) as control:
            status = await control.request("status")
        return int(status["processors"][0]["cursor"] or 0)

    eventually(lambda: asyncio.run(cursor("r1")) == count, 60)
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0

    port = free_port()
    started = time.monotonic()
    second = rig.start_host(
        "r2", "--db", str(db), "--processor", "hostprocs:SlowEffectorV2",
        "--http", f"127.0.0.1:{port}",
    )  # fmt: skip
    socket_after = time.monotonic() - started
    base = f"http://127.0.0.1:{port}"
    wait_for_http(base)
    with httpx.Client(base_url=base, timeout=10.0, headers=owner_headers(db)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503, ready.text
        (waiting,) = ready.json()["processors"]
        assert waiting["slug"] == "effector"
        assert waiting["why"].startswith("rebuilding: ")
        assert waiting["why"].endswith(f" of {count}")
        stale = client.get("/v1/processors/effector").json()
        assert (stale["version"], stale["stale"], stale["building_version"]) == ("1", True, "2")
        assert stale["state"] == {"total": count, "items": count}
        shown = subprocess.run(
            [sys.executable, "-m", "streamkit", "status", "--db", str(db),
             "--socket", rig.socket("r2")],
            capture_output=True, text=True, timeout=30, check=True, cwd=tmp_path,
        ).stdout  # fmt: skip
        assert "rebuilding " in shown, shown
        assert f"/{count:,} at " in shown, shown
        assert "(version 1 serves meanwhile)" in shown, shown
        assert "host: not running" not in shown
        # The rebuild takes seconds (a slow reduce); the socket answered long before.
        eventually(lambda: client.get("/readyz").status_code == 200, 120)
        rebuilt_after = time.monotonic() - started
        assert socket_after < rebuilt_after / 2
        fresh = client.get("/v1/processors/effector").json()
        assert (fresh["version"], fresh["source"], "stale" in fresh) == ("2", "engine", False)
        assert fresh["state"] == {"total": 10 * count, "items": count}
        assert client.get("/healthz").status_code == 200
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0
    log = rig.host_log("r2")
    assert "processor.rebuild.started" in log
    assert "processor.rebuild.done" in log


def test_append_then_wait_over_http_and_the_socket_is_never_paced(
    rig: DaemonRig, tmp_path: Path
) -> None:
    """Read-your-writes through the daemon: no pause or hold is applied on the client's behalf.

    The host's processors get a share of 0.00001 (a range of 0.1 ms would earn
    a pause of 10 s), yet a client that appends and then waits for the
    processor over HTTP (``GET .../processed``) or the control socket (``wait``)
    gets every answer, and the host counts no pause and no held write.
    """
    (tmp_path / "streamkit.toml").write_text("processor_share = 0.00001\n")
    _, base = _tally_over_http(rig, tmp_path, "r")
    with httpx.Client(
        base_url=base, timeout=20.0, headers=owner_headers(tmp_path / "r.db")
    ) as client:
        eventually(lambda: _answers(client))
        for n in range(20):
            posted = client.post("/v1/events", json={"type": "item", "payload": {"n": n}})
            offset = posted.json()["events"][0]["offset"]
            done = client.get("/v1/processors/tally/processed", params={"offset": offset})
            assert done.status_code == 200, done.text
            assert done.json()["cursor"] >= offset

        async def over_the_socket() -> None:
            async with ControlClient(rig.socket("r"), timeout=20) as control:
                for n in range(20):
                    (event,) = await control.request(
                        "append", events=[{"type": "item", "payload": {"n": n}}]
                    )
                    await control.request("wait", slug="tally", offset=event["offset"])

        asyncio.run(over_the_socket())
        first = client.get("/v1/processors").json()["host"]["clients_first"]
        assert first == {"pauses": 0, "paused_seconds": 0.0, "held_writes": 0}
        metrics = client.get("/metrics").text
        assert "streamkit_host_clients_first_pauses_total 0.0" in metrics
        assert "streamkit_host_held_writes_total 0.0" in metrics


def test_waiting_for_an_offset_not_reached_is_a_coded_timeout(
    rig: DaemonRig, tmp_path: Path
) -> None:
    """``processed`` past the head answers 504 PROCESSOR_TIMEOUT after its timeout; bad values 400."""
    _, base = _tally_over_http(rig, tmp_path, "t")
    with httpx.Client(
        base_url=base, timeout=20.0, headers=owner_headers(tmp_path / "t.db")
    ) as client:
        eventually(lambda: _answers(client))
        late = client.get("/v1/processors/tally/processed", params={"offset": 5, "timeout": 0.2})
        assert late.status_code == 504
        assert late.json()["code"] == "PROCESSOR_TIMEOUT"
        for bad in ("0", "-1", "nan", "61", "1e999", "x" * 50):
            refused = client.get(
                "/v1/processors/tally/processed", params={"offset": 1, "timeout": bad}
            )
            assert (refused.status_code, refused.json()["code"]) == (400, "INVALID_REQUEST"), bad
        unknown = client.get("/v1/processors/nobody/processed", params={"offset": 1})
        assert unknown.status_code == 404

        async def over_the_socket() -> None:
            async with ControlClient(rig.socket("t"), timeout=20) as control:
                with pytest.raises(ProcessorTimeout):
                    await control.request("wait", slug="tally", offset=5, timeout=0.2)
                with pytest.raises(InvalidRequest):
                    await control.request("wait", slug="tally", offset=1, timeout=0)

        asyncio.run(over_the_socket())


def test_admin_names_each_host_s_page_and_refuses_a_host_without_http(
    rig: DaemonRig, tmp_path: Path
) -> None:
    """``streamkit admin``: the page's address with the token; a host without HTTP says so."""
    _, base = _tally_over_http(rig, tmp_path, "a")
    shown = admin_address(tmp_path / "a.db")
    address, _, token = shown.partition("/#token=")
    assert (address, owner_headers(tmp_path / "a.db")) == (
        base,
        {"Authorization": f"Bearer {token}"},
    )
    with httpx.Client(base_url=base, timeout=10.0) as client:
        eventually(lambda: _answers(client))
        assert client.get("/v1/processors").status_code == 401
        assert (
            client.get("/v1/processors", headers={"Authorization": f"Bearer {token}"}).status_code
            == 200
        )
    rig.start_host("n", "--db", str(tmp_path / "n.db"), "--processor", "hostprocs:Tally")
    refused = subprocess.run(
        [sys.executable, "-m", "streamkit", "admin", "--db", str(tmp_path / "n.db")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert refused.returncode == 1
    assert "serves no HTTP" in refused.stderr


def test_a_slowloris_flood_does_not_silence_the_daemon(rig: DaemonRig, tmp_path: Path) -> None:
    """300 connections trickling a head at a real daemon: /healthz answers, each is cut off."""
    port = free_port()
    (tmp_path / "streamkit.toml").write_text(
        f'[http]\nlisten = "127.0.0.1:{port}"\nhead_timeout = 1\n'
    )
    rig.start_host("l", "--db", str(tmp_path / "l.db"), "--processor", "hostprocs:Tally")
    base = f"http://127.0.0.1:{port}"
    wait_for_http(base)
    trickling = []
    for _ in range(300):
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        trickling.append(conn)
    answers = []
    for _ in range(5):
        answers.append(httpx.get(f"{base}/healthz", timeout=5).status_code)
        for conn in trickling:
            with contextlib.suppress(OSError):  # cut off by the host already
                conn.send(b"a")
        time.sleep(0.4)
    assert answers == [200] * 5
    cut_off = 0
    for conn in trickling:
        conn.settimeout(10)
        with contextlib.suppress(OSError):
            data = conn.recv(65536)
            if not data or data.startswith(b"HTTP/1.1 408"):
                cut_off += 1
        conn.close()
    assert cut_off == 300
    assert "Traceback" not in rig.host_log("l")

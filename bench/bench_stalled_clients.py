"""What stalled HTTP live-stream clients cost a host: its resident memory, per client.

A ``streamkit host --http`` daemon runs one processor whose live view is
``--view-kb`` KB (a wide projection of a small state). ``--clients`` raw
connections open ``GET /v1/processors/big/live`` (or ``/v1/events`` with
``--follow``) with a 4 KiB receive buffer and never read; then 2,000 events
of 1 KB are appended, each a new revision (a delta, and a re-seed for a
watcher that fell behind). The host's VmRSS growth (before the clients to
after the appends) with ``N`` and with ``2N`` stalled clients gives the cost
of each further stalled client: ``(growth(2N) - growth(N)) / N``. What the
host holds once for all of them (a shared seed frame) is not counted.

Usage: ``.venv/bin/python bench/bench_stalled_clients.py [--clients N]
[--view-kb K] [--follow]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from streamkit import open_log

PROCESSOR = """
import os
from pydantic import BaseModel
from streamkit import StreamProcessor, define_processor_contract

VIEW_KB = int(os.environ["VIEW_KB"])


class Items(BaseModel):
    n: int = 0


class Big(StreamProcessor[Items]):
    contract = define_processor_contract(
        slug="big", version="1", state_schema=Items, consumes=["e"]
    )

    def reduce(self, event, state):
        return Items(n=state.n + 1)

    def project_live_state(self, state):
        return {"n": state.n, "wide": ["z" * 1000 for _ in range(VIEW_KB)]}
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _append(db: Path) -> None:
    async with open_log(db) as log:
        for _ in range(4):
            await log.stream("/").append(
                *({"type": "e", "payload": {"x": "y" * 1000}} for _ in range(500))
            )


def _run(clients: int, view_kb: int, follow: bool, history: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="skstall") as directory:
        work = Path(directory)
        (work / "stallprocs.py").write_text(PROCESSOR)
        port, db = _port(), work / "s.db"
        env = {**os.environ, "PYTHONPATH": str(work), "VIEW_KB": str(view_kb)}
        argv = [sys.executable, "-m", "streamkit", "host", "--db", str(db)]
        argv += ["--processor", "stallprocs:Big", "--http", f"127.0.0.1:{port}"]
        with (work / "host.log").open("ab") as log_file:
            host = subprocess.Popen(argv, cwd=work, env=env, stdout=log_file, stderr=log_file)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(400):
                try:
                    if httpx.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            token = subprocess.run(
                [sys.executable, "-m", "streamkit", "admin", "--db", str(db), "--token"],
                capture_output=True,
                text=True,
                check=True,
                cwd=work,
            ).stdout.strip()
            if history:  # the events are there before the clients, who follow from 0
                asyncio.run(_append(db))
            before = _rss_mb(host.pid)
            url = "/v1/events" if follow else "/v1/processors/big/live"
            held = []
            for _ in range(clients):
                conn = socket.socket()
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                conn.connect(("127.0.0.1", port))
                conn.sendall(
                    f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"Accept: text/event-stream\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
                )
                held.append(conn)
            time.sleep(0.5)
            if not history:
                asyncio.run(_append(db))
            time.sleep(3)
            after = _rss_mb(host.pid)
            for conn in held:
                conn.close()
            return before, after
        finally:
            host.send_signal(signal.SIGKILL)
            host.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--view-kb", type=int, default=10_000)
    parser.add_argument("--follow", action="store_true", help="stall followers, not watchers")
    parser.add_argument(
        "--history", action="store_true", help="append first; the clients follow from offset 0"
    )
    opts = parser.parse_args()
    kind = "followers" if opts.follow else "live watchers"
    print(f"| stalled {kind} | view | host RSS growth |")
    print("| ---: | ---: | ---: |")
    growth = {}
    for count in (0, opts.clients, 2 * opts.clients):
        before, after = _run(count, opts.view_kb, opts.follow, opts.history)
        growth[count] = after - before
        print(f"| {count} | {opts.view_kb:,} KB | {growth[count]:.0f} MB |")
    each = (growth[2 * opts.clients] - growth[opts.clients]) / opts.clients
    print(f"\nEach further stalled client: **{each:.1f} MB**")


if __name__ == "__main__":
    main()

"""The HTTP surface against the Unix control socket, and live state fanned out to 100 clients.

A `streamkit host --http` daemon runs as a subprocess on a fresh SQLite file
(``synchronous=FULL``) with one processor (a counter of ``tick`` events).
The clients run in this process, on one asyncio loop, as a service on the
same machine would:

1. **Appends**: N events, 1 per request, from 16 concurrent clients, over
   HTTP (httpx, keep-alive connections) and over the control socket
   (``ControlClient``, one connection per client), in the same run, against
   the same daemon. The HTTP clients are a minimal keep-alive client of the
   bench's own: httpx costs more CPU per request than the host does, and on
   the same machine it would measure itself. Reports events/s and p50/p99
   request latency.
2. **Live, one client**: append one event, then wait until the processor
   has processed it (``GET /v1/processors/count/processed?offset=N`` over
   HTTP, the ``wait`` op over the control socket), repeat: a
   request/response flow that reads its own write. Reports events/s and
   p50/p99 of the pair.
3. **SSE fan-out**: 100 clients follow ``/v1/processors/count/live``; one
   producer appends M events, one every ``--interval`` ms, each changing the
   state (so each is one delta). Reports deltas delivered per second in
   total and the p50/p99 delay from the append's request to each client's
   receipt of its delta.

Usage: ``.venv/bin/python bench/bench_http.py [--appends N] [--deltas M]
[--live N] [--clients 100] [--interval 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx

from streamkit.control import live_server_at
from streamkit.control._client import ControlClient

PROCESSOR = """
from pydantic import BaseModel
from streamkit import StreamProcessor, define_processor_contract

class Count(BaseModel):
    n: int = 0

class Counter(StreamProcessor[Count]):
    contract = define_processor_contract(
        slug="count", version="1", state_schema=Count, consumes=["tick"]
    )

    def reduce(self, event, state):
        return Count(n=state.n + 1)
"""


def _free_port() -> int:
    with closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(workdir: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    (workdir / "benchprocs.py").write_text(PROCESSOR)
    port = _free_port()
    sock = str(Path(tempfile.mkdtemp(dir="/tmp", prefix="skb")) / "h.sock")
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    argv = [sys.executable, "-m", "streamkit", "host", "--db", str(workdir / "b.db")]
    argv += ["--processor", "benchprocs:Counter", "--socket", sock, "--http", f"127.0.0.1:{port}"]
    argv += ["--log-format", "json"]
    with (workdir / "host.log").open("ab") as out:
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=out, cwd=workdir)
    deadline = time.monotonic() + 30
    while not live_server_at(sock):
        if child.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((workdir / "host.log").read_text())
        time.sleep(0.02)
    return child, f"http://127.0.0.1:{port}", sock


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (
        ordered[len(ordered) // 2] * 1000,
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    )


class _RawHttp:
    """A minimal HTTP/1.1 keep-alive client (one connection), so the client's own cost
    does not hide the server's: httpx spends more CPU per request than the host does."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self._host, self._port, self._token = host, port, token
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\n"
            f"Authorization: Bearer {self._token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self._writer.write(head.encode() + body)
        status_line = await self._reader.readline()
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return int(status_line.split()[1]), await self._reader.readexactly(length)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()


async def _timed(
    clients: list[Any], n: int, send: Callable[[Any], Awaitable[None]]
) -> dict[str, float]:
    """``n`` sends spread over ``clients`` at once: events/s and p50/p99 per send; closes them."""
    latencies: list[float] = []

    async def worker(client: Any, count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            await send(client)
            latencies.append(time.perf_counter() - started)

    try:
        began = time.perf_counter()
        await asyncio.gather(*(worker(c, n // len(clients)) for c in clients))
        elapsed = time.perf_counter() - began
    finally:
        for client in clients:
            await client.close()
    p50, p99 = _quantiles(latencies)
    return {"per_s": len(latencies) / elapsed, "p50_ms": p50, "p99_ms": p99}


async def _appends_http(base: str, token: str, n: int, clients: int) -> dict[str, float]:
    host, port = base.removeprefix("http://").split(":")
    connections = [_RawHttp(host, int(port), token) for _ in range(clients)]
    body = json.dumps({"type": "tick"}).encode()
    await connections[0].post("/v1/events", body)

    async def send(connection: _RawHttp) -> None:
        status, answer = await connection.post("/v1/events", body)
        assert status == 201, answer

    return await _timed(connections, n, send)


async def _appends_socket(sock: str, n: int, clients: int) -> dict[str, float]:
    connections = [ControlClient(sock, timeout=30) for _ in range(clients)]
    for connection in connections:
        await connection.connect()

    async def send(connection: ControlClient) -> None:
        await connection.request("append", path="/", events=[{"type": "tick"}])

    return await _timed(connections, n, send)


async def _live_http(base: str, token: str, n: int) -> dict[str, float]:
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"type": "tick"}).encode()

    async def send(connection: _RawHttp) -> None:
        status, answer = await connection.post("/v1/events", body)
        assert status == 201, answer
        offset = json.loads(answer)["events"][0]["offset"]
        status, answer = await connection.request(
            "GET", f"/v1/processors/count/processed?offset={offset}"
        )
        assert status == 200, answer

    return await _timed([_RawHttp(host, int(port), token)], n, send)


async def _live_socket(sock: str, n: int) -> dict[str, float]:
    connection = ControlClient(sock, timeout=30)
    await connection.connect()

    async def send(client: ControlClient) -> None:
        (event,) = await client.request("append", path="/", events=[{"type": "tick"}])
        await client.request("wait", slug="count", offset=event["offset"])

    return await _timed([connection], n, send)


async def _fan_out(
    base: str, token: str, deltas: int, clients: int, interval: float
) -> dict[str, float]:
    sent_at: dict[int, float] = {}  # the counter's value after the append -> request start
    delays: list[float] = []
    received = 0
    ready = 0
    all_ready = asyncio.Event()
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    owner = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=None, headers=owner) as http:
        start_n = (await http.get("/v1/processors/count")).json()["state"]["n"]

        async def follow() -> None:
            nonlocal received, ready
            async with http.stream("GET", "/v1/processors/count/live") as response:
                seeded = False
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = json.loads(line[6:])
                    now = time.perf_counter()
                    if not seeded:
                        seeded = True
                        ready += 1
                        if ready == clients:
                            all_ready.set()
                        continue
                    for op in data.get("patch") or []:
                        value = op.get("value")
                        if op.get("path") == "/n" and value in sent_at:
                            delays.append(now - sent_at[value])
                            received += 1
                            if value >= start_n + deltas:
                                return

        followers = [asyncio.ensure_future(follow()) for _ in range(clients)]
        await asyncio.wait_for(all_ready.wait(), 60)
        began = time.perf_counter()
        for i in range(1, deltas + 1):
            sent_at[start_n + i] = time.perf_counter()
            await http.post("/v1/events", json={"type": "tick"})
            await asyncio.sleep(interval / 1000)
        try:
            await asyncio.wait_for(asyncio.gather(*followers), 60)
        except TimeoutError:
            for task in followers:
                task.cancel()
        elapsed = time.perf_counter() - began
    p50, p99 = _quantiles(delays)
    return {
        "deltas_per_s": received / elapsed,
        "delivered": received,
        "expected": deltas * clients,
        "p50_ms": p50,
        "p99_ms": p99,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=4000)
    parser.add_argument("--live", type=int, default=2000)
    parser.add_argument("--deltas", type=int, default=300)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--interval", type=float, default=5.0, help="ms between appends")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        child, base, sock = _start(Path(directory))
        try:
            # The token, as the host's owner gets it: over the control socket.
            async with ControlClient(sock, timeout=30) as control:
                token = (await control.request("http"))["served"][0]["token"]
            http = await _appends_http(base, token, opts.appends, 16)
            unix = await _appends_socket(sock, opts.appends, 16)
            live_http = await _live_http(base, token, opts.live)
            live_unix = await _live_socket(sock, opts.live)
            fan: dict[str, Any] = await _fan_out(
                base, token, opts.deltas, opts.clients, opts.interval
            )
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(30)
    print(f"### Appends: {opts.appends:,} events, 1 per request, 16 concurrent clients\n")
    print("| transport | events/s | p50 ms | p99 ms |")
    print("| --- | ---: | ---: | ---: |")
    for name, row in (("HTTP (keep-alive)", http), ("control socket", unix)):
        print(f"| {name} | {row['per_s']:,.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |")
    print(f"\nHTTP / socket: **{http['per_s'] / unix['per_s']:.2f}x**\n")
    print(
        f"### Live: {opts.live:,} times one client appends one event, then waits until "
        "the processor has processed it\n"
    )
    print("| transport | events/s | p50 ms | p99 ms |")
    print("| --- | ---: | ---: | ---: |")
    for name, row in (("HTTP (keep-alive)", live_http), ("control socket", live_unix)):
        print(f"| {name} | {row['per_s']:,.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |")
    print()
    print(
        f"### Live state to {opts.clients} SSE clients: {opts.deltas} changes, "
        f"one every {opts.interval:g} ms\n"
    )
    print("| deltas delivered | of | deltas/s (all clients) | p50 ms | p99 ms |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {fan['delivered']:,} | {fan['expected']:,} | {fan['deltas_per_s']:,.0f} | "
        f"{fan['p50_ms']:.2f} | {fan['p99_ms']:.2f} |"
    )


if __name__ == "__main__":
    asyncio.run(main())

"""The HTTP surface over a real uvicorn server on 127.0.0.1 and a real HTTP client (httpx).

Each test starts a host in process with its HTTP service on a free port; the
requests go over a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from starlette.routing import Route
from support import ROOT
from support.host import Fragile, Gated, Offsets, Tally
from support.upcasting import TaskBoard, board_log, stored_at

import streamkit
from streamkit import StreamEvent, StreamProcessor, define_processor_contract, open_log
from streamkit.backends import host_store
from streamkit.cli._host_commands import _status_line as status_line
from streamkit.config import HostConfig
from streamkit.engine._pages import PAGE_SIZE, PageReader
from streamkit.engine._turns import FIRST_READ
from streamkit.errors import HistoryTruncated, InvalidConfig, StorageError
from streamkit.host import ProcessorHost
from streamkit.protocols import RetentionAsk
from streamkit.web import HttpService
from streamkit.web import _routes as routes_module
from streamkit.web import _server as server_module
from streamkit.web import _sse as sse_module
from streamkit.web._app import build_app
from streamkit.web._guard import RequestGuard
from streamkit.web._limits import RequestLimit
from streamkit.web._sse import comment, frame, with_heartbeat

PROBLEM = "application/problem+json"


@dataclass
class Served:
    host: ProcessorHost
    http: HttpService
    client: httpx.AsyncClient
    """Sends the host's token, as its owner would."""
    bare: httpx.AsyncClient
    """Sends no token, as anyone else on the machine."""


Serve = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """Start hosts with an HTTP service; every one is stopped after the test."""
    started: list[Served] = []

    async def start(
        *processors: StreamProcessor[Any], http: dict[str, Any] | None = None, **config: Any
    ) -> Served:
        settings = {"listen": "127.0.0.1:0", **(http or {})}
        host_config = HostConfig(db=tmp_path / f"h{len(started)}.db", http=settings, **config)
        assert host_config.http is not None
        service = HttpService(host_config.http)
        host = ProcessorHost(
            host_config,
            processors=list(processors) or [Tally()],
            serve_control=False,
            services=[service],
        )
        await host.start()
        token = {"Authorization": f"Bearer {service.token}"}
        client = httpx.AsyncClient(base_url=service.url, timeout=10.0, headers=token)
        bare = httpx.AsyncClient(base_url=service.url, timeout=10.0)
        served = Served(host, service, client, bare)
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        await served.client.aclose()
        await served.bare.aclose()
        await served.host.stop(grace=0.5)


def item(n: int = 1, **extra: Any) -> dict[str, Any]:
    return {"type": "item", "payload": {"n": n}, **extra}


async def durable_offsets(served: Served) -> list[int]:
    page = await served.host.read("/", 0, 1000)
    return [e.offset for e in page.events]


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert (body["status"], body["code"], body["title"]) == (status, code, code)
    assert body["detail"]
    return body


# -- events -----------------------------------------------------------------------------


async def test_an_event_posted_is_committed_and_read_back_with_its_proof(serve: Serve) -> None:
    """POST one event: 201 with it committed; GET returns it with scanned_through_offset."""
    served = await serve()
    response = await served.client.post("/v1/events", json=item(7))
    assert response.status_code == 201
    (event,) = response.json()["events"]
    assert (event["type"], event["payload"], event["offset"]) == ("item", {"n": 7}, 1)
    page = (await served.client.get("/v1/events", params={"after": 0})).json()
    assert [e["offset"] for e in page["events"]] == [1]
    assert (page["scanned_through_offset"], page["at_head"]) == (1, True)
    listed = await served.client.post("/v1/events?path=/", json=[item(1), item(2)])
    assert [e["offset"] for e in listed.json()["events"]] == [2, 3]


async def test_an_idempotent_retry_returns_the_first_commit_and_writes_nothing(
    serve: Serve,
) -> None:
    """The same Idempotency-Key and event twice: one event, the retry 200 and marked replayed.

    Another event under the key: 409.
    """
    served = await serve()
    headers = {"Idempotency-Key": "order-7"}
    first = await served.client.post("/v1/events", json=item(1), headers=headers)
    again = await served.client.post("/v1/events", json=item(1), headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    (committed,) = first.json()["events"]
    assert "replayed" not in committed
    assert again.json()["events"] == [{**committed, "replayed": True}]
    other = await served.client.post("/v1/events", json=item(2), headers=headers)
    body = assert_problem(other, 409, "IDEMPOTENCY_CONFLICT")
    assert body["type"] == "/problems/idempotency-conflict"
    described = (await served.client.get(body["type"])).json()
    assert (described["status"], described["retryable"]) == (409, False)
    assert_problem(await served.client.get("/problems/no-such-code"), 404, "NOT_FOUND")
    assert "nothing was appended" in body["detail"] or "nothing was written" in body["detail"]
    assert await durable_offsets(served) == [1]


async def test_a_keyed_append_says_how_long_its_key_answers_after_its_event_goes(
    serve: Serve,
) -> None:
    """``keys_kept_for`` on each keyed event: null (forever) until the path gets a key window."""
    served = await serve()
    first = await served.client.post("/v1/events", json=item(1), headers={"Idempotency-Key": "a"})
    assert first.json()["events"][0]["keys_kept_for"] is None
    unkeyed = await served.client.post("/v1/events", json=item(2))
    assert "keys_kept_for" not in unkeyed.json()["events"][0]
    assert served.host.store is not None
    await served.host.store.retention.set_key_window(
        "/", 86400.0, by="ops", reason="a day of retries", now=time.time()
    )
    later = await served.client.post("/v1/events", json=item(3), headers={"Idempotency-Key": "b"})
    assert later.json()["events"][0]["keys_kept_for"] == 86400.0


async def test_a_keyed_append_whose_key_window_cannot_be_read_writes_nothing(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window is read before the append: when it cannot be, the answer is an error
    and nothing was written (read after, a committed append was answered with an error)."""
    served = await serve()
    assert served.host.store is not None

    async def unreadable(path: str) -> None:
        raise StorageError(f"the key window of {path!r} could not be read (planted)")

    monkeypatch.setattr(served.host.store.retention, "key_window", unreadable)
    refused = await served.client.post("/v1/events", json=item(1), headers={"Idempotency-Key": "a"})
    assert_problem(refused, 503, "STORAGE_ERROR")
    assert await durable_offsets(served) == []
    # An unkeyed append never asks for the window.
    assert (await served.client.post("/v1/events", json=item(2))).status_code == 201
    assert await durable_offsets(served) == [1]


async def test_if_match_is_the_expected_head(serve: Serve) -> None:
    """If-Match: "N" appends only on head N; a stale one is 412 and writes nothing."""
    served = await serve()
    await served.client.post("/v1/events", json=item())
    stale = await served.client.post("/v1/events", json=item(), headers={"If-Match": '"0"'})
    assert_problem(stale, 412, "OFFSET_CONFLICT")
    fresh = await served.client.post("/v1/events", json=item(), headers={"If-Match": '"1"'})
    assert fresh.status_code == 201
    bad = await served.client.post("/v1/events", json=item(), headers={"If-Match": "soon"})
    assert_problem(bad, 400, "INVALID_REQUEST")
    assert await durable_offsets(served) == [1, 2]


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b'{"payload": {}}', {}, 422, "INVALID_EVENT"),
        (b'{"type": "item", "payload": NaN}', {}, 400, "MALFORMED_REQUEST"),
        (b"{not json", {}, 400, "MALFORMED_REQUEST"),
        (b"\xff\xfe", {}, 400, "MALFORMED_REQUEST"),
        (b"", {}, 400, "MALFORMED_REQUEST"),
        (b"[]", {}, 400, "INVALID_REQUEST"),
        (b"[1, 2]", {}, 400, "INVALID_REQUEST"),
        (b'[{"type": "item"}]', {"Idempotency-Key": "k"}, 400, "INVALID_REQUEST"),
        (
            b'{"type": "item", "idempotency_key": "a"}',
            {"Idempotency-Key": "b"},
            400,
            "INVALID_REQUEST",
        ),
        (b'{"type": "item", "payload": "' + b"x" * 2_000_000 + b'"}', {}, 413, "REQUEST_TOO_LARGE"),
    ],
)
async def test_a_refused_append_is_a_problem_and_writes_nothing(
    serve: Serve, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    """Each refusal: its status, problem+json with the code, and nothing in the log."""
    served = await serve(http={"max_request_bytes": 1024 * 1024})
    response = await served.client.post(
        "/v1/events", content=body, headers={"Content-Type": "application/json", **headers}
    )
    assert_problem(response, status, code)
    assert await durable_offsets(served) == []
    assert (await served.client.get("/healthz")).status_code == 200  # still serving


async def sse_events(response: httpx.Response, count: int) -> list[dict[str, Any]]:
    """The first ``count`` SSE events of a streaming response, as {event, id, data}."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            continue
        if not line:
            if current:
                found.append(current)
                current = {}
                if len(found) == count:
                    return found
            continue
        name, _, value = line.partition(": ")
        if name == "data":
            current["data"] = json.loads(value)
        else:
            current[name] = value
    return found


async def test_a_follow_over_sse_resumes_after_last_event_id(serve: Serve) -> None:
    """Accept: text/event-stream follows; id is the offset; Last-Event-ID resumes after it."""
    served = await serve()
    await served.client.post("/v1/events", json=[item(1), item(2)])
    headers = {"Accept": "text/event-stream"}
    async with served.client.stream("GET", "/v1/events", headers=headers) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        first = await sse_events(response, 2)
    assert [(e["event"], e["id"], e["data"]["offset"]) for e in first] == [
        ("event", "1", 1),
        ("event", "2", 2),
    ]
    await served.client.post("/v1/events", json=item(3))
    resumed_headers = {**headers, "Last-Event-ID": "2"}
    async with served.client.stream("GET", "/v1/events", headers=resumed_headers) as response:
        task = asyncio.ensure_future(sse_events(response, 2))
        await asyncio.sleep(0.2)
        await served.client.post("/v1/events", json=item(4))
        resumed = await asyncio.wait_for(task, 10)
    assert [e["data"]["offset"] for e in resumed] == [3, 4]


async def test_events_can_be_read_and_followed_for_some_types(serve: Serve) -> None:
    """?type= filters a page (its proof still holds) and a follow; a bad pattern is a 400."""
    served = await serve()
    await served.client.post(
        "/v1/events",
        json=[{"type": "order.placed"}, item(1), {"type": "order.shipped"}, {"type": "user.left"}],
    )
    page = (await served.client.get("/v1/events?type=order.*&limit=1")).json()
    assert [e["type"] for e in page["events"]] == ["order.placed"]
    assert (page["scanned_through_offset"], page["at_head"]) == (1, False)
    rest = (await served.client.get("/v1/events?type=order.*&type=user.left&after=1")).json()
    assert [e["offset"] for e in rest["events"]] == [3, 4]
    assert rest["at_head"] is True
    headers = {"Accept": "text/event-stream"}
    async with served.client.stream(
        "GET", "/v1/events?type=user.left", headers=headers
    ) as response:
        (only,) = await sse_events(response, 1)
    assert only["data"]["offset"] == 4
    assert_problem(await served.client.get("/v1/events?type=a*b"), 400, "INVALID_REQUEST")


# -- processors -------------------------------------------------------------------------


async def test_processors_status_and_snapshot(serve: Serve) -> None:
    """GET /v1/processors is the status; /v1/processors/{slug} its state; unknown: 404."""
    served = await serve()
    (event,) = (await served.client.post("/v1/events", json=item())).json()["events"]
    await served.host.wait_until_processed("tally", event["offset"])
    status = (await served.client.get("/v1/processors")).json()
    (row,) = status["processors"]
    assert (row["slug"], row["cursor"], row["lag"]) == ("tally", 1, 0)
    snapshot = (await served.client.get("/v1/processors/tally")).json()
    assert (snapshot["offset"], snapshot["state"]["offsets"]) == (1, [1])
    assert "rev" in snapshot
    missing = await served.client.get("/v1/processors/nobody")
    assert_problem(missing, 404, "NOT_FOUND")
    assert_problem(await served.client.get("/nowhere"), 404, "NOT_FOUND")


async def test_live_state_over_sse_is_a_seed_then_deltas(serve: Serve) -> None:
    """The live stream sends a seed {rev, state}, then a delta {from, to, patch} per change."""
    served = await serve()
    async with served.client.stream("GET", "/v1/processors/tally/live") as response:
        task = asyncio.ensure_future(sse_events(response, 2))
        await asyncio.sleep(0.3)
        await served.client.post("/v1/events", json=item())
        seed, delta = await asyncio.wait_for(task, 10)
    assert seed["event"] == "seed"
    assert seed["data"]["state"]["offsets"] == []
    assert delta["event"] == "delta"
    assert delta["data"]["from"] == seed["data"]["rev"]
    assert delta["data"]["to"] == seed["data"]["rev"] + 1
    assert delta["data"]["patch"] == [{"op": "add", "path": "/offsets/0", "value": 1}]
    # The client is gone: its subscription ends, so batches stop publishing for it.
    for _ in range(100):
        if not served.host.watching("/", "tally"):
            break
        await asyncio.sleep(0.02)
    assert not served.host.watching("/", "tally")


async def test_a_skip_over_http_moves_a_stalled_processor_past_its_poison(serve: Serve) -> None:
    """POST skip records the skip event; the processor moves on; bad bodies are refused."""
    served = await serve(Fragile(), retry={"initial_delay": 0.05, "max_delay": 0.05})
    (poison,) = (
        await served.client.post("/v1/events", json={"type": "item", "payload": {"boom": True}})
    ).json()["events"]
    refused = await served.client.post("/v1/processors/fragile/skip", json={"offset": "x"})
    assert_problem(refused, 400, "INVALID_REQUEST")
    skipped = await served.client.post(
        "/v1/processors/fragile/skip", json={"offset": poison["offset"], "reason": "poison"}
    )
    assert skipped.status_code == 201
    assert skipped.json()["event"]["type"] == "streamkit.event-skipped"
    await served.host.wait_until_processed("fragile", skipped.json()["event"]["offset"])


# -- health -----------------------------------------------------------------------------


async def test_healthz_is_ok_while_processors_progress(serve: Serve) -> None:
    """A host whose processors keep up answers 200 with no reasons."""
    served = await serve()
    response = await served.client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok", "reasons": []})


async def healthz_becomes(served: Served, status: int) -> httpx.Response:
    """Poll /healthz every 20 ms until it answers ``status`` (at most 6 s); its last answer."""
    for _ in range(300):
        response = await served.client.get("/healthz")
        if response.status_code == status:
            return response
        await asyncio.sleep(0.02)
    raise AssertionError(f"/healthz never answered {status}: {response.text}")


async def wait_until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    for _ in range(int(within / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def processor_row(served: Served, slug: str) -> dict[str, Any]:
    rows = (await served.client.get("/v1/processors")).json()["processors"]
    (row,) = [row for row in rows if row["slug"] == slug]
    return row


async def test_readyz_says_not_ready_while_a_processor_catches_up_and_healthz_stays_green(
    serve: Serve, tmp_path: Path
) -> None:
    """/readyz 503 naming the processor and its phase; /healthz 200; /metrics and status say
    how far it is; once caught up everything is ready."""
    async with open_log(tmp_path / "h0.db") as log:
        await log.stream("/").append(*(item(n) for n in range(3)))
    gated = Gated()  # its first event's effect waits for the gate: the catch-up holds there
    served = await serve(gated)
    assert (await served.bare.get("/healthz")).status_code == 200
    waiting = await served.bare.get("/readyz")  # open, as /healthz is: a probe has no token
    assert waiting.status_code == 503
    assert waiting.json() == {
        "status": "not ready",
        "processors": [
            {
                "slug": "gated",
                "path": "/",
                "phase": "catching-up",
                "ready": False,
                "why": "catching-up: 0 of 3",
            }
        ],
    }
    row = await processor_row(served, "gated")
    assert row["phase"] == "catching-up"
    assert (row["progress"]["through"], row["progress"]["target"]) == (0, 3)
    found = samples((await served.client.get("/metrics")).text)
    labels = (("path", "/"), ("slug", "gated"))
    assert found[("streamkit_processor_serving", labels)] == 0
    assert found[("streamkit_processor_progress_target_offset", labels)] == 3
    gated.gate.set()
    await served.host.wait_until_processed("gated", 3)
    await wait_until(lambda: served.host.runner("gated").caught_up)
    ready = await served.bare.get("/readyz")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    assert (await processor_row(served, "gated"))["phase"] == "serving"
    found = samples((await served.client.get("/metrics")).text)
    assert found[("streamkit_processor_serving", labels)] == 1
    assert ("streamkit_processor_progress_target_offset", labels) not in found


class TallyV2(Tally):
    """The next release of Tally: the same slug at contract version 2."""

    contract = define_processor_contract(
        slug="tally", version="2", state_schema=Offsets, consumes=["item"], emits=[]
    )


async def test_a_host_rebuilding_a_new_version_answers_and_shows_its_progress(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 2 re-reduces what version 1 checkpointed: the host answers all along, status
    says rebuilding with how far, /readyz waits for it."""
    db = tmp_path / "h0.db"
    async with open_log(db) as log:
        await log.stream("/").append(*(item(n) for n in range(PAGE_SIZE + 100)))
    config = HostConfig(db=db)
    async with ProcessorHost(config, processors=[Tally()], serve_control=False) as first:
        await first.wait_until_processed("tally", PAGE_SIZE + 100)
    gate = asyncio.Event()
    held_at_second_page = asyncio.Event()
    read = PageReader.read

    async def held(self: Any, after: int, limit: int) -> Any:
        if after > 0 and not gate.is_set():
            held_at_second_page.set()
            await gate.wait()
        return await read(self, after, limit)

    monkeypatch.setattr(PageReader, "read", held)
    served = await serve(TallyV2())
    await asyncio.wait_for(held_at_second_page.wait(), 10)
    row = await processor_row(served, "tally")
    assert (row["version"], row["serving_version"], row["phase"]) == ("2", "1", "rebuilding")
    # What serves meanwhile: version 1's last checkpoint, marked stale.
    stale = (await served.client.get("/v1/processors/tally")).json()
    assert (stale["version"], stale["stale"], stale["building_version"]) == ("1", True, "2")
    assert (stale["source"], stale["offset"]) == ("checkpoint", PAGE_SIZE + 100)
    assert len(stale["state"]["offsets"]) == PAGE_SIZE + 100
    progress = row["progress"]
    # The rebuild's first read is FIRST_READ events (its reads are sized in turns after it).
    assert (progress["through"], progress["target"]) == (FIRST_READ, PAGE_SIZE + 100)
    assert progress["gave_way_seconds"] == 0  # nothing else serves on this host
    line = status_line(row, True)  # what `streamkit status` prints of it
    assert f"state=running  rebuilding {FIRST_READ:,}/{PAGE_SIZE + 100:,} at " in line
    assert " ev/s, eta " in line
    assert " (version 1 serves meanwhile)  cursor=" in line
    assert (await served.bare.get("/healthz")).status_code == 200
    not_ready = (await served.bare.get("/readyz")).json()["processors"]
    assert not_ready[0]["why"] == f"rebuilding: {FIRST_READ} of {PAGE_SIZE + 100}"
    gate.set()
    await wait_until(lambda: served.host.runner("tally").caught_up)
    assert (await served.bare.get("/readyz")).status_code == 200
    row = await processor_row(served, "tally")
    assert (row["progress"], row["serving_version"]) == (None, "2")
    fresh = (await served.client.get("/v1/processors/tally")).json()
    assert (fresh["source"], "stale" in fresh) == ("engine", False)


async def test_healthz_goes_red_when_a_processor_stalls(serve: Serve) -> None:
    """A processor whose batches keep failing makes /healthz 503 and names it."""
    served = await serve(
        Fragile(), retry={"initial_delay": 0.01, "max_delay": 0.01, "stall_after": 2}
    )
    await served.client.post("/v1/events", json={"type": "item", "payload": {"boom": True}})
    response = await healthz_becomes(served, 503)
    (reason,) = response.json()["reasons"]
    assert "'fragile'" in reason
    assert "stalled" in reason


async def test_healthz_goes_red_when_a_cursor_stands_behind_a_moving_head(serve: Serve) -> None:
    """A batch hung in its effect: the head moves, the cursor does not, /healthz says stuck."""
    gated = Gated()
    served = await serve(gated, http={"stuck_after": 0.3})
    await served.client.post("/v1/events", json=[item(1)])
    await asyncio.sleep(0.1)
    await served.client.post("/v1/events", json=[item(2)])
    response = await healthz_becomes(served, 503)
    (reason,) = response.json()["reasons"]
    assert "'gated'" in reason
    assert "stuck" in reason
    gated.gate.set()
    await healthz_becomes(served, 200)


async def test_healthz_goes_red_when_the_follow_loop_is_blocked(serve: Serve) -> None:
    """The log's writer thread held off its connection: no look at other commits, 503."""
    served = await serve(http={"follow_stale_after": 0.3})
    assert (await served.client.get("/healthz")).status_code == 200
    log = served.host.log
    assert log is not None
    lock = log.backend.writer._conn_lock  # type: ignore[attr-defined]
    release = threading.Event()

    def hold() -> None:
        with lock:
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        await asyncio.sleep(0.5)
        response = await served.client.get("/healthz")
        assert response.status_code == 503
        (reason,) = response.json()["reasons"]
        assert "follow loop stopped" in reason
    finally:
        release.set()
        holder.join()
    await healthz_becomes(served, 200)


# -- metrics ----------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_metrics_are_the_status_in_prometheus_text(serve: Serve) -> None:
    """Cursor, head, lag, counters and the latency histogram, labelled by slug and path."""
    served = await serve()
    for n in range(3):
        (event,) = (await served.client.post("/v1/events", json=item(n))).json()["events"]
    await served.host.wait_until_processed("tally", event["offset"])
    response = await served.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)
    labels = (("path", "/"), ("slug", "tally"))
    assert found[("streamkit_processor_cursor", labels)] == 3
    assert found[("streamkit_processor_head", labels)] == 3
    assert found[("streamkit_processor_lag_events", labels)] == 0
    assert found[("streamkit_processor_events_reduced_total", labels)] == 3
    assert found[("streamkit_processor_stalled", labels)] == 0
    assert found[("streamkit_processor_running", labels)] == 1
    assert found[("streamkit_processor_latency_seconds_count", labels)] >= 1
    assert found[("streamkit_host_leases_held", ())] == 1
    assert found[("streamkit_host_appended_events_total", ())] >= 3
    assert found[("streamkit_database_reachable", ())] == 1
    build = (("python", platform.python_version()), ("version", streamkit.__version__))
    assert found[("streamkit_build_info", build)] == 1
    assert ("streamkit_host_follow_age_seconds", ()) in found


# -- the token --------------------------------------------------------------------------


def token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "http.token"
    path.write_text("s3cret-token-0123456789\n")
    os.chmod(path, mode)
    return path


async def test_with_a_token_every_request_but_healthz_needs_it(
    serve: Serve, tmp_path: Path
) -> None:
    """No token or a wrong one: 401 problem, nothing written; the right one passes."""
    served = await serve(http={"token_file": str(token_file(tmp_path))})
    assert served.http.token == "s3cret-token-0123456789"
    bare = await served.bare.post("/v1/events", json=item())
    refusal = assert_problem(bare, 401, "UNAUTHORIZED")
    described = await served.bare.get(refusal["type"])  # the type names a page, open to all
    assert described.json()["code"] == "UNAUTHORIZED"
    assert bare.headers["www-authenticate"].startswith("Bearer")
    wrong = await served.bare.get("/v1/processors", headers={"Authorization": "Bearer nope"})
    assert_problem(wrong, 401, "UNAUTHORIZED")
    assert_problem(await served.bare.get("/metrics"), 401, "UNAUTHORIZED")
    assert (await served.bare.get("/healthz")).status_code == 200
    page = await served.bare.get("/")  # the admin page's files carry no data
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert (await served.bare.get("/static/admin.js")).status_code == 200
    good = {"Authorization": "Bearer s3cret-token-0123456789"}
    assert (await served.bare.post("/v1/events", json=item(), headers=good)).status_code == 201
    assert (await served.bare.get("/metrics", headers=good)).status_code == 200
    assert await durable_offsets(served) == [1]


async def test_without_a_token_file_the_host_makes_a_token_and_every_read_and_write_needs_it(
    serve: Serve,
) -> None:
    """The loopback default grants no more than the owner-only socket: no token, no data."""
    served = await serve()
    assert served.http.token is not None
    assert len(served.http.token) >= 32
    for method, url in (
        ("POST", "/v1/events"),
        ("GET", "/v1/events"),
        ("GET", "/v1/processors"),
        ("GET", "/v1/processors/tally/live"),
        ("POST", "/v1/processors/tally/skip"),
        ("GET", "/v1/paths"),
        ("GET", "/metrics"),
    ):
        refused = await served.bare.request(method, url, json=item())
        assert_problem(refused, 401, "UNAUTHORIZED")
    assert await durable_offsets(served) == []
    assert (await served.bare.get("/healthz")).status_code == 200
    assert (await served.client.post("/v1/events", json=item())).status_code == 201
    access = served.host.http_access()
    assert access == [
        {
            "url": served.http.url,
            "token": served.http.token,
            "admin": f"{served.http.url}/#token={served.http.token}",
        }
    ]
    other = await serve()
    assert other.http.token != served.http.token  # made fresh by each host


async def test_open_metrics_serves_metrics_without_the_token(serve: Serve, tmp_path: Path) -> None:
    """open_metrics lets a scraper in without the token; everything else still needs it."""
    served = await serve(http={"token_file": str(token_file(tmp_path)), "open_metrics": True})
    assert (await served.bare.get("/metrics")).status_code == 200
    assert_problem(await served.bare.get("/v1/processors"), 401, "UNAUTHORIZED")


async def test_a_token_file_others_may_read_is_refused_at_start(
    serve: Serve, tmp_path: Path
) -> None:
    """A token readable by the group or others fails the host's start; nothing is served."""
    with pytest.raises(InvalidConfig, match="may be read by other users"):
        await serve(http={"token_file": str(token_file(tmp_path, 0o644))})


def test_listening_off_the_loopback_needs_a_token(tmp_path: Path) -> None:
    """Any address but the loopback without a token is refused by the settings."""
    from streamkit.config import config_from_args

    with pytest.raises(InvalidConfig, match="without a token"):
        config_from_args(db=tmp_path / "a.db", http="0.0.0.0:8700", cwd=tmp_path)
    config = config_from_args(
        db=tmp_path / "a.db", http="0.0.0.0:8700", http_token_file="t", cwd=tmp_path
    )
    assert config.http is not None
    assert config.http.token_file == tmp_path / "t"
    with pytest.raises(InvalidConfig, match="not an address"):
        config_from_args(db=tmp_path / "a.db", http="8700", cwd=tmp_path)


class Page(BaseModel):
    text: str = ""
    edits: int = 0


class Pager(StreamProcessor[Page]):
    """``grow`` makes the text over a megabyte: a change too large to send as a patch."""

    contract = define_processor_contract(
        slug="pager", version="1", state_schema=Page, consumes=["grow", "edit"]
    )

    def reduce(self, event: StreamEvent, state: Page) -> Page:
        if event.type == "grow":
            return Page(text="y" * 1_100_000, edits=state.edits + 1)
        return Page(text=state.text, edits=state.edits + 1)


async def test_a_live_client_is_re_seeded_when_a_delta_cannot_carry_the_change(
    serve: Serve,
) -> None:
    """A change past the patch limit breaks the chain: the stream sends a fresh seed, then deltas."""
    served = await serve(Pager())
    async with served.client.stream("GET", "/v1/processors/pager/live") as response:
        task = asyncio.ensure_future(sse_events(response, 3))
        await asyncio.sleep(0.3)
        await served.client.post("/v1/events", json={"type": "grow"})
        await asyncio.sleep(0.3)
        await served.client.post("/v1/events", json={"type": "edit"})
        first, again, delta = await asyncio.wait_for(task, 10)
    assert (first["event"], first["data"]["state"]["text"]) == ("seed", "")
    assert again["event"] == "seed"
    assert again["data"]["rev"] > first["data"]["rev"]
    assert len(again["data"]["state"]["text"]) == 1_100_000
    assert delta["event"] == "delta"
    assert delta["data"]["from"] == again["data"]["rev"]
    assert delta["data"]["patch"] == [{"op": "replace", "path": "/edits", "value": 2}]


async def test_cors_is_off_unless_origins_are_named(serve: Serve, tmp_path: Path) -> None:
    """No CORS header by default; a named origin gets them, preflight included, token or not."""
    origin = {"Origin": "https://ops.example.com"}
    plain = await serve()
    response = await plain.client.get("/healthz", headers=origin)
    assert "access-control-allow-origin" not in response.headers
    named = await serve(
        http={"cors_origins": ["https://ops.example.com"], "token_file": str(token_file(tmp_path))}
    )
    preflight = await named.client.options(
        "/v1/events",
        headers={
            **origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://ops.example.com"
    refused = await named.bare.get("/v1/processors", headers=origin)
    assert refused.status_code == 401
    other = await named.client.options(
        "/v1/events",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in other.headers


def test_a_wildcard_origin_and_a_bare_port_are_read_as_the_settings_say(tmp_path: Path) -> None:
    """cors_origins refuses "*"; ":8700" listens on the loopback."""
    from streamkit.config import HostConfig

    with pytest.raises(ValueError, match="not an origin"):
        HostConfig(db=tmp_path / "a.db", http={"listen": ":0", "cors_origins": ["*"]})
    config = HostConfig(db=tmp_path / "a.db", http=":8700")
    assert config.http is not None
    assert (config.http.host, config.http.port) == ("127.0.0.1", 8700)


def test_streamkit_toml_takes_http_as_an_address_or_a_table(tmp_path: Path) -> None:
    """``http = "HOST:PORT"`` is short for the [http] table with listen alone."""
    from streamkit.config import load_config

    short = tmp_path / "short.toml"
    short.write_text('db = "app.db"\nhttp = "127.0.0.1:8700"\n')
    config = load_config(short)
    assert config.http is not None
    assert (config.http.host, config.http.port, config.http.token_file) == ("127.0.0.1", 8700, None)
    table = tmp_path / "table.toml"
    table.write_text(
        'db = "app.db"\n[http]\nlisten = "0.0.0.0:9000"\ntoken_file = "t"\nopen_metrics = true\n'
    )
    config = load_config(table)
    assert config.http is not None
    assert (config.http.host, config.http.open_metrics) == ("0.0.0.0", True)
    bad = tmp_path / "bad.toml"
    bad.write_text('db = "app.db"\n[http]\nlisten = "0.0.0.0:9000"\n')
    with pytest.raises(InvalidConfig, match="without a token"):
        load_config(bad)


async def test_requests_past_the_limit_are_a_coded_503_while_healthz_answers(
    serve: Serve,
) -> None:
    """max_connections bounds the requests served at once; /healthz is never turned away."""
    served = await serve(http={"max_connections": 2})
    headers = {"Accept": "text/event-stream"}
    async with (
        served.client.stream("GET", "/v1/events", headers=headers),
        served.client.stream("GET", "/v1/events", headers=headers),
    ):
        busy = await served.client.get("/v1/processors")
        body = assert_problem(busy, 503, "HOST_BUSY")
        assert body["retryable"] is True
        assert busy.headers["retry-after"] == "1"
        assert (await served.bare.get("/healthz")).status_code == 200
    # Once the server has seen the streams end, their slots are free again.
    for _ in range(100):
        if (await served.client.get("/v1/processors")).status_code == 200:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the slots of the ended streams were never freed")


async def _raw(port: int, data: bytes, *, then_wait: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read what comes back until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), then_wait)
    finally:
        writer.close()


async def test_a_trickled_head_is_cut_off_and_healthz_answers_meanwhile(serve: Serve) -> None:
    """300 slowloris connections: each is answered 408 after the head deadline, or evicted as
    the oldest of its client's waiting connections; /healthz answers all along."""
    served = await serve(http={"max_connections": 8, "head_timeout": 1.0})
    port = served.http.port
    assert port is not None
    trickling = []
    for _ in range(300):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ")
        trickling.append((reader, writer))
    checks = []
    for _ in range(5):
        checks.append((await served.bare.get("/healthz")).status_code)
        for _reader, writer in trickling:
            with contextlib.suppress(ConnectionError):  # evicted already: closed by the host
                writer.write(b"a")
        await asyncio.sleep(0.3)
    assert checks == [200] * 5
    # Every trickling connection ends: answered 408 (a write of ours after the host closed
    # it may turn the read into a broken pipe instead); none is still served.
    ended = await asyncio.wait_for(
        asyncio.gather(*(reader.read() for reader, _ in trickling), return_exceptions=True), 10
    )
    for _, writer in trickling:
        writer.close()
    assert all(
        isinstance(answer, ConnectionError)
        or (isinstance(answer, bytes) and (not answer or b"408 Request Timeout" in answer))
        for answer in ended
    ), ended


async def test_a_head_that_never_completes_is_answered_408_as_a_problem(serve: Serve) -> None:
    """One connection stops mid-head: after head_timeout, 408 REQUEST_TIMEOUT and closed."""
    served = await serve(http={"head_timeout": 0.5})
    port = served.http.port
    assert port is not None
    answer = await _raw(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 408 Request Timeout")
    assert b"content-type: application/problem+json" in head
    assert json.loads(body)["code"] == "REQUEST_TIMEOUT"


async def test_a_slow_body_is_refused_and_nothing_is_written(serve: Serve) -> None:
    """A body that stalls past its deadline: 408 REQUEST_TIMEOUT, nothing appended."""
    served = await serve(http={"body_timeout": 0.5})
    port = served.http.port
    assert port is not None
    head = (
        "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {served.http.token}\r\nContent-Length: 100\r\n\r\n"
    )
    answer = await _raw(port, head.encode() + b'{"type": "it')
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"] == "REQUEST_TIMEOUT"
    assert await durable_offsets(served) == []


async def test_a_request_that_is_not_http_is_a_problem_not_plain_text(serve: Serve) -> None:
    """The parser's refusal is 400 MALFORMED_REQUEST as problem+json."""
    served = await serve()
    port = served.http.port
    assert port is not None
    answer = await _raw(port, b"NOT HTTP AT ALL\x00\r\n\r\n")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400")
    assert b"content-type: application/problem+json" in head
    assert json.loads(body)["code"] == "MALFORMED_REQUEST"


async def test_every_http_endpoint_is_documented(serve: Serve) -> None:
    """Each route the app serves (core and installed plugins) is named in docs/http.md."""
    served = await serve()
    guard = build_app(served.host, served.http.settings, "a-token-for-the-route-list")
    assert isinstance(guard, RequestGuard)
    limited = guard.app
    assert isinstance(limited, RequestLimit)
    app = limited.app
    docs = (ROOT / "docs" / "http.md").read_text(encoding="utf-8")
    routes = [r for r in getattr(app, "routes", []) if isinstance(r, Route)]
    assert routes, "the app exposes its routes"
    for route in routes:
        for method in sorted((route.methods or set()) - {"HEAD"}):
            named = f"{method} {route.path}"
            assert f"`{named}" in docs, f"docs/http.md does not document {named}"


async def test_the_event_browser_endpoints(serve: Serve) -> None:
    """/v1/paths, /v1/hosts, one event with who passed it, and a time range over created_at."""
    served = await serve()
    client = served.client
    await client.post("/v1/events", json=item(1))
    await client.post("/v1/events", json=item(2))  # a commit of its own: a later created_at
    (late,) = (await client.post("/v1/events?path=/other", json=item(3))).json()["events"]
    await served.host.wait_until_processed("tally", 2)
    assert (await client.get("/v1/paths")).json() == {
        "paths": [{"path": "/", "head": 2}, {"path": "/other", "head": late["offset"]}]
    }
    (me,) = (await client.get("/v1/hosts")).json()["hosts"]
    assert (me["owner"], me["here"], me["processors"]) == (served.host.owner, True, ["tally@/"])
    one = (await client.get("/v1/events/2")).json()
    assert one["event"]["offset"] == 2
    assert [(p["slug"], p["passed"]) for p in one["processors"]] == [("tally", True)]
    assert_problem(await client.get("/v1/events/99"), 404, "NOT_FOUND")
    assert_problem(await client.get("/v1/events/x"), 400, "INVALID_REQUEST")
    page = (await client.get("/v1/events")).json()
    first, second = page["events"]
    since = (await client.get("/v1/events", params={"since": second["created_at"]})).json()
    assert [e["offset"] for e in since["events"]] == [2]
    until = (await client.get("/v1/events", params={"until": first["created_at"]})).json()
    assert [e["offset"] for e in until["events"]] == [1]
    assert until["until_reached"] is True
    assert_problem(await client.get("/v1/events?since=yesterday"), 400, "INVALID_REQUEST")
    icon = await client.get("/favicon.ico")
    assert (icon.status_code, icon.headers["content-type"]) == (200, "image/svg+xml")


async def test_a_host_answers_to_its_address_localhost_and_the_names_allowed(
    serve: Serve, tmp_path: Path
) -> None:
    """Host checks: the listen address, localhost, allowed_hosts; any IP only on a wildcard listen."""
    served = await serve(http={"allowed_hosts": ["Ops.Example.com"]})
    port = served.http.port
    answers = {}
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        "ops.example.com",
        f"OPS.example.com.:{port}",
        f"10.0.0.7:{port}",
        f"evil.example:{port}",
        "127.0.0.1:x",
        "[::1",
    ):
        answers[host] = (await served.client.get("/v1/paths", headers={"Host": host})).status_code
    assert answers == {
        f"127.0.0.1:{port}": 200,
        f"localhost:{port}": 200,
        "ops.example.com": 200,
        f"OPS.example.com.:{port}": 200,
        f"10.0.0.7:{port}": 400,
        f"evil.example:{port}": 400,
        "127.0.0.1:x": 400,
        "[::1": 400,
    }
    with pytest.raises(ValueError, match="not a host name"):
        await serve(http={"allowed_hosts": ["https://ops.example.com"]})
    wildcard = await serve(http={"listen": "0.0.0.0:0", "token_file": str(token_file(tmp_path))})
    for host, status in (("10.0.0.7:80", 200), ("[fe80::1]:80", 200), ("evil.example", 400)):
        got = await wildcard.client.get("/v1/paths", headers={"Host": host})
        assert got.status_code == status, host


async def test_an_idempotency_key_is_read_as_utf8_like_every_other_transport(
    serve: Serve,
) -> None:
    """``café-ü-1`` over HTTP and through the host's own append name one event."""
    served = await serve()
    key = "café-ü-1"
    sent = await served.client.post(
        "/v1/events", json=item(), headers={"Idempotency-Key": key.encode("utf-8")}
    )
    assert sent.status_code == 201, sent.text
    (event,) = sent.json()["events"]
    assert event["idempotency_key"] == key
    (again,) = await served.host.append("/", [{**item(), "idempotency_key": key}])
    assert again.offset == event["offset"]
    assert await durable_offsets(served) == [event["offset"]]
    bad = await served.client.post(
        "/v1/events", json=item(), headers={"Idempotency-Key": b"caf\xe9"}
    )
    assert_problem(bad, 400, "MALFORMED_REQUEST")
    assert await durable_offsets(served) == [event["offset"]]


async def test_numbers_a_client_sends_are_refused_as_400_not_500(serve: Serve) -> None:
    """5,000 digits, superscript digits, past 2**63: a coded 400 for each, nothing done."""
    served = await serve()
    await served.client.post("/v1/events", json=item())
    for bad in ("1" * 5000, "\u00b2", "9" * 19, "-1", "1.5", "\uff11"):
        for url in (f"/v1/events?after={bad}", f"/v1/events?limit={bad}", f"/v1/events/{bad}"):
            assert_problem(await served.client.get(url), 400, "INVALID_REQUEST")
        sse = await served.client.get(
            "/v1/events",
            headers={"Accept": "text/event-stream", "Last-Event-ID": bad.encode("utf-8")},
        )
        assert_problem(sse, 400, "INVALID_REQUEST")
        posted = await served.client.post(
            "/v1/events", json=item(), headers={"If-Match": f'"{bad}"'.encode()}
        )
        assert_problem(posted, 400, "INVALID_REQUEST")
    assert await durable_offsets(served) == [1]


async def test_a_follow_from_past_the_head_is_refused_naming_the_head(serve: Serve) -> None:
    """SSE with Last-Event-ID (or after) past the durable head: 400 naming it, not silence."""
    served = await serve()
    await served.client.post("/v1/events", json=item())
    refused = await served.client.get(
        "/v1/events", headers={"Accept": "text/event-stream", "Last-Event-ID": "99"}
    )
    body = assert_problem(refused, 400, "INVALID_REQUEST")
    assert body["details"] == {"path": "/", "after": 99, "head": 1}
    refused = await served.client.get("/v1/events?after=2", headers={"Accept": "text/event-stream"})
    assert_problem(refused, 400, "INVALID_REQUEST")
    async with served.client.stream(
        "GET", "/v1/events", headers={"Accept": "text/event-stream", "Last-Event-ID": "1"}
    ) as response:
        assert response.status_code == 200


async def test_a_deeply_nested_body_and_a_wrong_method_are_coded_problems(serve: Serve) -> None:
    """A body nested 100,000 deep is a 400, not a 500; a 405's body says 405."""
    served = await serve()
    deep = "[" * 100_000 + "]" * 100_000
    refused = await served.client.post(
        "/v1/events", content=deep, headers={"Content-Type": "application/json"}
    )
    assert_problem(refused, 400, "MALFORMED_REQUEST")
    wrong = await served.client.delete("/v1/events")
    body = assert_problem(wrong, 405, "INVALID_REQUEST")
    assert wrong.headers["allow"]
    assert body["status"] == 405
    assert await durable_offsets(served) == []


async def test_a_connection_past_the_cap_is_a_coded_503_and_closed(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open connections past max(1,024, 4 x max_connections): 503 HOST_BUSY as problem+json."""
    monkeypatch.setattr(server_module, "_MIN_CONNECTIONS", 4)
    served = await serve(http={"max_connections": 1})
    port = served.http.port
    assert port is not None
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    try:
        answer = await _raw(port, b"")
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503")
        assert b"content-type: application/problem+json" in head
        assert json.loads(body)["code"] == "HOST_BUSY"
    finally:
        for _, writer in held:
            writer.close()
    for _ in range(100):
        with contextlib.suppress(httpx.TransportError):
            if (await served.bare.get("/healthz")).status_code == 200:
                break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("/healthz never answered once the connections closed")


class WideView(Tally):
    """A live view far larger than one write: 300 KB of text besides the offsets."""

    def project_live_state(self, state: Any) -> Any:
        return {"offsets": state.offsets, "text": ["w" * 1000 for _ in range(300)]}


@pytest.mark.speed_trick
async def test_a_seed_larger_than_one_write_arrives_whole_and_is_built_once(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 300 KB seed goes out in slices (no client sees them) and two watchers share its frame."""
    built: list[str | None] = []
    real_frame = routes_module.frame

    def counted(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
        built.append(event)
        return real_frame(data, event=event, id=id)

    monkeypatch.setattr(routes_module, "frame", counted)
    served = await serve(WideView())
    seeds = []
    for _ in range(2):
        async with served.client.stream("GET", "/v1/processors/tally/live") as response:
            (seed,) = await asyncio.wait_for(sse_events(response, 1), 10)
            seeds.append(seed)
    assert seeds[0] == seeds[1]
    assert seeds[0]["event"] == "seed"
    assert seeds[0]["data"]["state"]["text"] == ["w" * 1000] * 300
    assert len(json.dumps(seeds[0]["data"])) > 4 * sse_module.WRITE_CHUNK
    assert built.count("seed") == 1  # one revision, one frame, whoever watches it


async def test_an_event_of_wide_characters_is_measured_as_utf8_over_http(serve: Serve) -> None:
    """200,000 é over HTTP: 400 KB as UTF-8, accepted, though 1.2 MB with escapes."""
    served = await serve()
    sent = await served.client.post(
        "/v1/events", json={"type": "item", "payload": {"n": 1, "text": "\u00e9" * 200_000}}
    )
    assert sent.status_code == 201, sent.text[:300]
    page = (await served.client.get("/v1/events")).json()
    assert page["events"][0]["payload"]["text"] == "\u00e9" * 200_000


async def test_metrics_count_skipped_payloads_per_type_and_version(serve: Serve) -> None:
    """With skip chosen, the per-kind counter carries the stored type and payload version as labels."""
    served = await serve(TaskBoard(), on_malformed="skip")
    unreadable = {"type": "task.created", "payload": {"title": 1}, "payload_version": 3}
    # Written past the host's door, as a producer opening the file itself could.
    async with open_log(served.host.config.db) as log:
        placed = await log.stream("/").append(
            stored_at(3, "a", 1, "ana"), unreadable, {**unreadable, "payload_version": 2}
        )
    await served.host.wait_until_processed("task-board", placed[-1].offset)
    found = samples((await served.client.get("/metrics")).text)
    labels = (("path", "/"), ("slug", "task-board"))
    assert found[("streamkit_processor_malformed_payloads_total", labels)] == 2
    for version in ("2", "3"):
        kind = (*labels, ("type", "task.created"), ("version", version))
        assert found[("streamkit_processor_malformed_payloads_by_type_total", kind)] == 1


async def test_metrics_count_what_the_data_check_at_start_found(
    serve: Serve, tmp_path: Path
) -> None:
    """Per processor, the stored keys its code would skip or stall at (0 when none), and
    whether it stopped at a payload newer than its code."""
    async with open_log(tmp_path / "h0.db") as log:
        await board_log(log, "/")  # what newer code wrote: a task.created v4
    # Skipping the unreadable v3 on the way, so that the board reaches the v4.
    served = await serve(TaskBoard(), Tally(), on_malformed="skip")
    found = samples((await served.client.get("/metrics")).text)
    name = "streamkit_processor_schema_check_problems"
    # The v4 (ahead of this code), and the v3 payload the start-time sample found unreadable.
    assert found[(name, (("path", "/"), ("slug", "task-board")))] == 2
    assert found[(name, (("path", "/"), ("slug", "tally")))] == 0
    rows = (await served.client.get("/v1/processors")).json()["processors"]
    (board,) = [row for row in rows if row["slug"] == "task-board"]
    assert [(p["version"], p["outcome"]) for p in board["schema_check"]["problems"]] == [
        (3, "current"),
        (4, "ahead"),
    ]
    # Then it reaches the newer payload and stops there: a gauge says so, apart from a stall.
    runner = served.host.runner("task-board")
    await wait_until(lambda: runner.failures.ahead_of_code is not None)
    found = samples((await served.client.get("/metrics")).text)
    ahead = "streamkit_processor_ahead_of_code"
    assert found[(ahead, (("path", "/"), ("slug", "task-board")))] == 1
    assert found[(ahead, (("path", "/"), ("slug", "tally")))] == 0


async def test_a_payload_the_hosts_processors_cannot_read_is_refused_at_the_door(
    serve: Serve,
) -> None:
    """422 INVALID_EVENT naming the field, nothing written; an unnamed version is stamped."""
    served = await serve(TaskBoard())
    assert served.host.log is not None
    stream = served.host.log.stream("/")
    head = await stream.head()
    bad = {"type": "task.created", "payload": {"title": "x", "priority": "high", "owner": "o"}}
    body = assert_problem(
        await served.client.post("/v1/events", json=[stored_at(3, "a", 1, "ana"), bad]),
        422,
        "INVALID_EVENT",
    )
    assert "priority" in body["detail"]
    assert "nothing was appended" in body["detail"]
    assert await stream.head() == head
    # The current shape without a version is stored at the definition's version (3);
    # an older one named is lifted to be checked, and stored as it was written.
    current = {"type": "task.created", "payload": {"title": "b", "priority": 1, "owner": "bo"}}
    response = await served.client.post("/v1/events", json=[current, stored_at(1, "c", 0, "cy")])
    assert response.status_code == 201, response.text
    events = response.json()["events"]
    assert [e.get("payload_version", 1) for e in events] == [3, 1]
    no_priority = {"title": "d", "assignee": "di"}  # version 2 had a required priority
    assert_problem(
        await served.client.post(
            "/v1/events",
            json={"type": "task.created", "payload": no_priority, "payload_version": 2},
        ),
        422,
        "INVALID_EVENT",
    )


async def test_events_read_as_a_processor_come_in_its_current_shape(serve: Serve) -> None:
    """as=<slug>: old events lifted with a note, unreadable ones as stored with why, SSE too."""
    served = await serve(TaskBoard())
    async with open_log(served.host.config.db) as log:
        placed = await log.stream("/").append(
            stored_at(1, "a", 0, "ana"),
            {"type": "note", "payload": {}},
            {"type": "task.retired", "payload": {}},
        )
    plain = (await served.client.get("/v1/events")).json()["events"]
    assert plain[0]["type"] == "task.opened"
    assert "upcast" not in plain[0]
    page = (await served.client.get("/v1/events", params={"as": "task-board"})).json()
    first, note, retired = page["events"]
    assert (first["type"], first["payload_version"], first["offset"]) == (
        "task.created",
        3,
        placed[0].offset,
    )
    assert first["payload"] == {"title": "a", "priority": 0, "owner": "ana"}
    assert first["upcast"] == {"from_type": "task.opened", "from_version": 1}
    assert "upcast" not in note
    assert retired["type"] == "task.retired"
    assert "DROP" in retired["upcast"]["unreadable"]
    assert page["scanned_through_offset"] == placed[-1].offset
    assert_problem(
        await served.client.get("/v1/events", params={"as": "nobody"}), 400, "INVALID_REQUEST"
    )
    async with served.client.stream(
        "GET",
        "/v1/events",
        params={"as": "task-board", "after": 0},
        headers={"Accept": "text/event-stream"},
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                followed = json.loads(line[len("data:") :])
                break
    assert followed["type"] == "task.created"
    assert followed["upcast"]["from_version"] == 1


async def test_a_follow_from_below_the_path_s_start_is_refused_before_it_opens(
    serve: Serve,
) -> None:
    """History retention took: 400 HISTORY_TRUNCATED before the 200, as the plain read says,
    not a stream that opens and ends (an EventSource would reconnect to it for ever)."""
    served = await serve()
    for n in range(5):
        await served.client.post("/v1/events?path=/other", json=item(n))
    assert served.host.log is not None
    run = await host_store(served.host.log).retention.run(RetentionAsk("/other", through=3))
    assert run.events == 3
    plain = await served.client.get("/v1/events?path=/other&after=0")
    assert_problem(plain, 400, "HISTORY_TRUNCATED")
    refused = await served.client.get(
        "/v1/events?path=/other&after=0", headers={"Accept": "text/event-stream"}
    )
    body = assert_problem(refused, 400, "HISTORY_TRUNCATED")
    assert body["details"]["path"] == "/other"
    async with served.client.stream(
        "GET", "/v1/events?path=/other&after=3", headers={"Accept": "text/event-stream"}
    ) as response:
        assert response.status_code == 200


async def test_a_refusal_a_stream_meets_after_it_opened_is_its_last_frame() -> None:
    """Headers are sent: the refusal goes as an ``error`` event with the problem, then the end."""

    async def source() -> AsyncIterator[bytes]:
        yield frame("{}", event="first", id="1")
        raise HistoryTruncated(
            "history before 4 was deleted; nothing was read",
            details={"path": "/", "start": 4},
        )

    frames = [bytes(chunk) async for chunk in with_heartbeat(source())]
    assert frames[0] == comment("connected")
    assert frames[1].startswith(b"event: first")
    last = frames[-1].decode()
    assert last.startswith("event: error\ndata: ")
    problem = json.loads(last.split("data: ", 1)[1])
    assert (problem["code"], problem["status"]) == ("HISTORY_TRUNCATED", 400)
    assert problem["details"] == {"path": "/", "start": 4}

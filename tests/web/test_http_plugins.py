"""Routes that processors add over ``streamkit.http``: the tasks and the dead-letter queue."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from streamkit.processors.dlq import DlqProcessor, dead_lettered_event
from streamkit.processors.tasks import TasksProcessor, task_requested_event

from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
from streamkit.web import HttpService
from streamkit.web._plugins import plugin_routes


async def _never(args: dict[str, Any], ctx: Any) -> None:
    raise AssertionError("a task scheduled an hour ahead ran now")


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    config = HostConfig(db=tmp_path / "p.db", http="127.0.0.1:0")
    assert config.http is not None
    service = HttpService(config.http)
    host = ProcessorHost(
        config,
        processors=[
            TasksProcessor(handlers={"work": _never}),
            DlqProcessor(),
        ],
        serve_control=False,
        services=[service],
    )
    await host.start()
    try:
        token = {"Authorization": f"Bearer {service.token}"}
        async with httpx.AsyncClient(base_url=service.url, timeout=10.0, headers=token) as made:
            yield made
    finally:
        await host.stop(grace=0.5)


def test_the_first_party_processors_register_their_routes() -> None:
    """The installed entry points add the tasks and dlq routes (the core imports neither)."""
    paths = {(route.method, route.path) for route in plugin_routes()}
    assert {
        ("GET", "/v1/tasks"),
        ("POST", "/v1/tasks/{task_id}/cancel"),
        ("GET", "/v1/dlq"),
        ("POST", "/v1/dlq/replay"),
        ("GET", "/v1/dlq/replays"),
        ("GET", "/v1/tasks/{task_id}"),
        ("GET", "/v1/finished-tasks"),
        ("GET", "/v1/dlq/record"),
    } <= paths


async def eventually(check: Any) -> Any:
    """Poll ``check`` every 50 ms until it answers something truthy (at most 10 s)."""
    async with asyncio.timeout(10):
        while True:
            found = await check()
            if found:
                return found
            await asyncio.sleep(0.05)


async def test_tasks_are_listed_and_cancelled_over_http(client: httpx.AsyncClient) -> None:
    """A scheduled task shows as scheduled; POST cancel: 202, then it is cancelled."""
    later = time.time() + 3600
    event = task_requested_event(task_id="t1", name="work", not_before=later)
    assert (await client.post("/v1/events", json=event)).status_code == 201

    async def listed() -> list[dict[str, Any]]:
        return list((await client.get("/v1/tasks")).json()["tasks"])

    (task,) = await eventually(listed)
    assert (task["task_id"], task["status"]) == ("t1", "scheduled")
    cancel = await client.post("/v1/tasks/t1/cancel", json={"reason": "not needed"})
    assert cancel.status_code == 202
    assert cancel.json()["event"]["type"] == "task.cancel-requested"

    async def cancelled() -> bool:
        body = (await client.get("/v1/tasks")).json()
        return not body["tasks"] and body["counts"].get("cancelled") == 1

    await eventually(cancelled)
    shown = (await client.get("/v1/tasks/t1")).json()
    assert (shown["status"], shown["live"]) == ("cancelled", None)
    assert [e["type"] for e in shown["events"]] == [
        "task.requested",
        "task.cancel-requested",
        "task.cancelled",
    ]
    missing = await client.get("/v1/tasks/nobody")
    assert (missing.status_code, missing.json()["code"]) == (404, "NOT_FOUND")
    refused = await client.post("/v1/tasks/t1/cancel", json=["not", "an", "object"])
    assert refused.status_code == 400
    assert refused.json()["code"] == "INVALID_REQUEST"


async def _fine(args: dict[str, Any], ctx: Any) -> str:
    return "done"


async def _broken(args: dict[str, Any], ctx: Any) -> None:
    raise RuntimeError(f"broken {args.get('n')}")


async def test_finished_tasks_are_listed_newest_first_with_durations_and_filters(
    tmp_path: Path,
) -> None:
    """Succeeded, dead-lettered and cancelled tasks; filtered by status and name; refusals."""
    config = HostConfig(db=tmp_path / "f.db", http="127.0.0.1:0")
    assert config.http is not None
    service = HttpService(config.http)
    host = ProcessorHost(
        config,
        processors=[TasksProcessor(handlers={"fine": _fine, "broken": _broken})],
        serve_control=False,
        services=[service],
    )
    await host.start()
    try:
        token = {"Authorization": f"Bearer {service.token}"}
        async with httpx.AsyncClient(base_url=service.url, timeout=10.0, headers=token) as client:
            events = [
                task_requested_event(task_id="ok-1", name="fine"),
                task_requested_event(task_id="bad-1", name="broken", args={"n": 1}, max_attempts=1),
                task_requested_event(task_id="ok-2", name="fine"),
                task_requested_event(task_id="later", name="fine", not_before=time.time() + 3600),
            ]
            for event in events:
                assert (await client.post("/v1/events", json=event)).status_code == 201
            assert (await client.post("/v1/tasks/later/cancel", json={})).status_code == 202

            async def all_four() -> list[dict[str, Any]]:
                body = (await client.get("/v1/finished-tasks")).json()
                return list(body["tasks"]) if len(body["tasks"]) == 4 else []

            tasks = await eventually(all_four)
            offsets = [task["offset"] for task in tasks]
            assert offsets == sorted(offsets, reverse=True)  # newest first
            by_id = {task["task_id"]: task for task in tasks}
            assert by_id["ok-1"]["status"] == "succeeded"
            assert by_id["ok-1"]["name"] == "fine"
            assert by_id["ok-1"]["attempts"] == 1
            assert by_id["ok-1"]["seconds"] >= by_id["ok-1"]["ran_seconds"] >= 0
            assert by_id["bad-1"]["status"] == "dead-lettered"
            assert by_id["bad-1"]["error"].endswith("RuntimeError: broken 1")
            assert by_id["later"]["status"] == "cancelled"
            assert by_id["later"]["ran_seconds"] is None  # it never ran

            failed = await client.get("/v1/finished-tasks?status=dead-lettered")
            assert [t["task_id"] for t in failed.json()["tasks"]] == ["bad-1"]
            fine = await client.get("/v1/finished-tasks?name=fine&status=succeeded")
            assert {t["task_id"] for t in fine.json()["tasks"]} == {"ok-1", "ok-2"}
            one = await client.get("/v1/finished-tasks?limit=1")
            assert one.json()["tasks"] == tasks[:1]
            for query in ("status=lost", "limit=0", "limit=x"):
                refused = await client.get(f"/v1/finished-tasks?{query}")
                assert (refused.status_code, refused.json()["code"]) == (400, "INVALID_REQUEST")
    finally:
        await host.stop(grace=0.5)


async def test_dead_letters_are_listed_and_replayed_over_http(client: httpx.AsyncClient) -> None:
    """A dead-lettered record is pending; POST replay: 202, then the report is in the state."""
    record = dead_lettered_event(
        record_id="charge/order-7",
        origin="billing",
        operation="charge",
        payload={"order": 7},
        error="card declined",
        attempts=3,
        request_type="charge.requested",
    )
    assert (await client.post("/v1/events", json=record)).status_code == 201
    listing = (await client.get("/v1/dlq", params={"status": "pending"})).json()
    assert [r["record_id"] for r in listing["records"]] == ["charge/order-7"]
    bad = await client.get("/v1/dlq", params={"status": "lost"})
    assert (bad.status_code, bad.json()["code"]) == (400, "INVALID_REQUEST")
    replay = await client.post("/v1/dlq/replay", json={"ids": ["charge/order-7"]})
    assert replay.status_code == 202
    assert replay.json()["event"]["type"] == "dlq.replay-requested"

    async def reported() -> list[dict[str, Any]]:
        return list((await client.get("/v1/dlq/replays")).json()["replays"])

    (report,) = await eventually(reported)
    assert report["request_offset"] == replay.json()["event"]["offset"]
    assert report["report"]["replayed"] == ["charge/order-7"]

    (after,) = (await client.get("/v1/dlq")).json()["records"]
    assert after["record_id"] == "charge/order-7"
    assert after["status"] in ("replaying", "succeeded")
    assert (await client.get("/v1/dlq", params={"status": "pending"})).json()["records"] == []
    shown = (await client.get("/v1/dlq/record", params={"id": "charge/order-7"})).json()
    assert shown["record"]["payload"] == {"order": 7}
    assert [e["type"] for e in shown["history"]][:2] == [
        "dlq.dead-lettered",
        "dlq.record-replaying",
    ]
    missing = await client.get("/v1/dlq/record", params={"id": "nope"})
    assert (missing.status_code, missing.json()["code"]) == (404, "NOT_FOUND")


async def test_metrics_carry_the_dlq_depth_and_the_tasks_by_status(
    client: httpx.AsyncClient,
) -> None:
    """The processors' gauges join /metrics: pending dead letters, tasks per status."""
    later = time.time() + 3600
    await client.post(
        "/v1/events", json=task_requested_event(task_id="t1", name="work", not_before=later)
    )
    record = dead_lettered_event(
        record_id="r1", origin="billing", operation="charge", payload={}, error="no", attempts=1
    )
    await client.post("/v1/events", json=record)

    async def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        found = {}
        for family in text_string_to_metric_families((await client.get("/metrics")).text):
            for sample in family.samples:
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        ready = found.get(("streamkit_dlq_records", (("path", "/"), ("status", "pending"))))
        return found if ready == 1 else None

    found = await eventually(scraped)
    assert found[("streamkit_tasks", (("path", "/"), ("status", "scheduled")))] == 1
    assert found[("streamkit_tasks", (("path", "/"), ("status", "running")))] == 0
    assert found[("streamkit_tasks_events", (("outcome", "requested"), ("path", "/")))] == 1

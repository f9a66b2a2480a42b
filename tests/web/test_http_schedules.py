"""The schedules processor over HTTP and in /metrics: define, watch fire, pause, delete."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from streamkit.processors.schedules import SchedulesProcessor
from streamkit.processors.tasks import TasksProcessor
from support.schedule_bodies import BODIES

from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
from streamkit.web import HttpService
from streamkit.web._plugins import plugin_routes

ran: list[str] = []


async def _ping(args: dict[str, Any], ctx: Any) -> str:
    ran.append(ctx.task_id)
    return "pong"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    config = HostConfig(db=tmp_path / "s.db", http="127.0.0.1:0")
    assert config.http is not None
    service = HttpService(config.http)
    host = ProcessorHost(
        config,
        processors=[SchedulesProcessor(), TasksProcessor(handlers={"ping": _ping})],
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


def test_the_schedules_routes_are_registered() -> None:
    paths = {(route.method, route.path) for route in plugin_routes()}
    assert {
        ("GET", "/v1/schedules"),
        ("POST", "/v1/schedules"),
        ("POST", "/v1/schedules/{name}/pause"),
        ("POST", "/v1/schedules/{name}/resume"),
        ("POST", "/v1/schedules/{name}/delete"),
        ("POST", "/v1/schedules/{name}/backfill"),
    } <= paths


async def eventually(check: Any, seconds: float = 15) -> Any:
    async with asyncio.timeout(seconds):
        while True:
            found = await check()
            if found:
                return found
            await asyncio.sleep(0.05)


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


async def test_a_schedule_defined_over_http_fires_shows_its_record_and_pauses(
    client: httpx.AsyncClient,
) -> None:
    request = {"name": "beat", "every": "1s", "task": "ping", "overlap": "allow_all", "by": "ann"}
    added = await client.post("/v1/schedules", json=request)
    assert added.status_code == 202
    assert added.json()["event"]["payload"]["by"] == "ann"

    async def fired_twice() -> dict[str, Any] | None:
        (row,) = (await client.get("/v1/schedules")).json()["schedules"]
        return row if row["fired"] >= 2 else None

    row = await eventually(fired_twice)
    assert row["name"] == "beat"
    assert row["next_slot"] > row["through"]
    assert row["lateness_p50"] is not None
    assert row["lateness_p99"] >= row["lateness_p50"] >= 0
    await eventually(lambda: asyncio.sleep(0, result=len(ran) >= 2))
    assert all(task_id.startswith("sched/beat/") for task_id in ran)

    # The processor's row in the status says it too (its status_summary).
    listed = (await client.get("/v1/processors")).json()
    rows = listed["processors"] if isinstance(listed, dict) else listed
    (summary,) = [row["summary"] for row in rows if row["slug"] == "schedules"]
    assert summary["schedules"] == 1
    assert summary["paused"] == 0
    assert summary["fired"] >= 2
    metrics = (await client.get("/metrics")).text
    slots = samples(metrics, "streamkit_schedule_slots")
    assert slots[(("outcome", "fired"), ("path", "/"), ("schedule", "beat"))] >= 2
    assert samples(metrics, "streamkit_schedule_paused") == {
        (("path", "/"), ("schedule", "beat")): 0.0
    }
    assert samples(metrics, "streamkit_schedule_next_slot_timestamp_seconds")
    quantiles = samples(metrics, "streamkit_schedule_lateness_seconds")
    assert {dict(labels)["quantile"] for labels in quantiles} == {"0.5", "0.99"}

    paused = await client.post("/v1/schedules/beat/pause", json={"by": "ops"})
    assert paused.status_code == 202

    async def shown_paused() -> bool:
        (row,) = (await client.get("/v1/schedules")).json()["schedules"]
        return bool(row["paused"]) and row["next_slot"] is None

    await eventually(shown_paused)
    metrics = (await client.get("/metrics")).text
    assert samples(metrics, "streamkit_schedule_paused") == {
        (("path", "/"), ("schedule", "beat")): 1.0
    }

    await asyncio.sleep(1.5)  # slots come due while it is paused
    assert (await client.post("/v1/schedules/beat/resume", json={})).status_code == 202

    async def missed_while_paused() -> bool:
        (row,) = (await client.get("/v1/schedules")).json()["schedules"]
        return (row.get("missed_by") or {}).get("paused", 0) >= 1

    await eventually(missed_while_paused)
    assert (await client.post("/v1/schedules/beat/delete", json={})).status_code == 202

    async def gone() -> bool:
        return (await client.get("/v1/schedules")).json()["schedules"] == []

    await eventually(gone)


async def test_bad_schedule_requests_are_refused_and_nothing_is_written(
    client: httpx.AsyncClient,
) -> None:
    bad_cron = await client.post(
        "/v1/schedules", json={"name": "x", "cron": "61 * * * *", "task": "ping"}
    )
    assert bad_cron.status_code == 400
    assert bad_cron.json()["code"] == "INVALID_REQUEST"
    assert "no schedule was made" in bad_cron.json()["detail"]
    both = await client.post(
        "/v1/schedules", json={"name": "x", "cron": "@daily", "every": "1m", "task": "ping"}
    )
    assert both.status_code == 400
    extra = await client.post(
        "/v1/schedules", json={"name": "x", "every": "1m", "task": "ping", "when": "soon"}
    )
    assert extra.status_code == 400
    assert "'when'" in extra.json()["detail"]
    two_actions = await client.post(
        "/v1/schedules", json={"name": "x", "every": "1m", "task": "ping", "event": "report.due"}
    )
    assert two_actions.status_code == 400
    assert '"task"' in two_actions.json()["detail"]
    # A wall time Berlin always skips (the last Sunday of March, 02:30), gap "skip": the
    # timing has no slot, refused at the door rather than walked to year 9999 on each pass.
    no_slot = await client.post(
        "/v1/schedules",
        json={
            "name": "x",
            "cron": "30 2 * 3 0L",
            "tz": "Europe/Berlin",
            "gap": "skip",
            "task": "ping",
        },
    )
    assert (no_slot.status_code, no_slot.json()["code"]) == (400, "INVALID_REQUEST")
    assert "has no slot" in no_slot.json()["detail"]
    missing = await client.post("/v1/schedules/nobody/pause", json={})
    assert (missing.status_code, missing.json()["code"]) == (404, "NOT_FOUND")
    events = (await client.get("/v1/events")).json()
    assert [e for e in events["events"] if e["type"].startswith("schedule.")] == []


async def test_every_metric_the_host_exports_is_documented(client: httpx.AsyncClient) -> None:
    """docs/metrics.md names each family /metrics serves, the core's and the plugins'."""
    request = {"name": "beat", "every": "1s", "task": "ping", "overlap": "allow_all"}
    assert (await client.post("/v1/schedules", json=request)).status_code == 202

    async def fired() -> bool:
        return (
            "streamkit_schedule_last_fired_timestamp_seconds{"
            in (await client.get("/metrics")).text
        )

    await eventually(fired)
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text(encoding="utf-8")
    families = {f.name for f in text_string_to_metric_families((await client.get("/metrics")).text)}
    assert {"streamkit_schedule_slots", "streamkit_tasks", "streamkit_processor_lag_events"} <= (
        families
    )
    undocumented = sorted(
        name for name in families if f"`{name}`" not in docs and f"`{name}_total`" not in docs
    )
    assert undocumented == []


_BAD_DEFINITIONS = {
    "every that overflows": {"every": "99999999999w"},
    "window that overflows": {"window": "99999999999d"},
    "jitter that overflows": {"jitter": "99999999999w"},
    "tz a number": {"every": None, "cron": "@daily", "tz": 5},
    "tz null": {"every": None, "cron": "@daily", "tz": None},
    "tz of 5,000 characters": {"every": None, "cron": "@daily", "tz": "A" * 5000},
    "catchup a list": {"catchup": ["all"]},
    "catchup an object": {"catchup": {"policy": "all"}},
    "max_attempts -5": {"max_attempts": -5},
    "max_attempts 0": {"max_attempts": 0},
    "max_attempts 10^9": {"max_attempts": 10**9},
    "max_attempts x": {"max_attempts": "x"},
    "timeout_s 0": {"timeout_s": 0},
    "timeout_s -1": {"timeout_s": -1},
    "timeout_s 1e308": {"timeout_s": 1e308},
    "timeout_s [1]": {"timeout_s": [1]},
    "an empty task name": {"task": ""},
    "a task name of 5,000 characters": {"task": "t" * 5000},
    "by a number": {"by": 5},
}


@pytest.mark.parametrize("bad", list(_BAD_DEFINITIONS), ids=list(_BAD_DEFINITIONS))
async def test_a_definition_is_checked_whole_at_the_door(
    client: httpx.AsyncClient, bad: str
) -> None:
    """Issue 55: each of these answered 202 (and stopped every schedule) or 500."""
    body: dict[str, Any] = {"name": "x", "every": "1m", "task": "ping", **_BAD_DEFINITIONS[bad]}
    body = {k: v for k, v in body.items() if v is not None or k == "tz"}
    refused = await client.post("/v1/schedules", json=body)
    assert (refused.status_code, refused.json()["code"]) == (400, "INVALID_REQUEST"), refused.text
    assert refused.json()["details"]["field"]
    events = (await client.get("/v1/events")).json()["events"]
    assert [e for e in events if e["type"].startswith("schedule.")] == []


async def test_the_change_verbs_refuse_a_bad_by_and_an_endless_backfill(
    client: httpx.AsyncClient,
) -> None:
    defined = await client.post("/v1/schedules", json={"name": "x", "every": "1h", "task": "ping"})
    assert defined.status_code == 202

    async def listed() -> bool:
        return bool((await client.get("/v1/schedules")).json()["schedules"])

    await eventually(listed)
    for verb in ("pause", "resume", "delete"):
        refused = await client.post(f"/v1/schedules/x/{verb}", json={"by": [1]})
        assert (refused.status_code, refused.json()["details"]) == (400, {"field": "by"}), verb
    backfill = await client.post(
        "/v1/schedules/x/backfill",
        json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T05:00:00Z", "by": 5},
    )
    assert (backfill.status_code, backfill.json()["details"]) == (400, {"field": "by"})
    endless = await client.post(
        "/v1/schedules/x/backfill",
        json={"from": "0001-01-01T00:00:00Z", "to": "9999-12-31T00:00:00Z"},
    )
    assert (endless.status_code, endless.json()["code"]) == (400, "INVALID_REQUEST")
    assert "more than" in endless.json()["detail"]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    verb=st.sampled_from(["", "/x/pause", "/x/resume", "/x/delete", "/x/backfill"]),
    body=BODIES,
)
async def test_any_json_to_a_schedules_verb_is_a_coded_answer_and_stops_no_schedule(
    client: httpx.AsyncClient, verb: str, body: Any
) -> None:
    """Random JSON to each verb: success or a coded 4xx, never a 500; and whatever was
    accepted, a healthy every-second schedule keeps firing (checked once below)."""
    answer = await client.post(f"/v1/schedules{verb}", json=body)
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:
        assert answer.json()["code"], answer.text  # a coded refusal, as problem+json


async def test_no_accepted_definition_stops_another_schedule(client: httpx.AsyncClient) -> None:
    """The definitions the door lets through, side by side with a healthy one: it fires."""
    accepted = [
        {"name": "rare", "cron": "0 0 29 2 *", "task": "ping"},
        {"name": "big", "every": "1s", "task": "ping", "max_attempts": 1000, "timeout_s": 604800},
        {"name": "shifted", "cron": "30 2 * 3 0L", "tz": "Europe/Berlin", "task": "ping"},
        {"name": "long", "every": "36500d", "task": "ping", "catchup": "all", "window": "1s"},
    ]
    for body in accepted:
        assert (await client.post("/v1/schedules", json=body)).status_code == 202, body
    ran.clear()
    healthy = {"name": "healthy", "every": "1s", "task": "ping"}
    assert (await client.post("/v1/schedules", json=healthy)).status_code == 202

    async def fired_twice() -> bool:
        return len([t for t in ran if t.startswith("sched/healthy/")]) >= 2

    await eventually(fired_twice)


async def test_a_stored_definition_the_door_now_refuses_stops_no_schedule_on_a_host(
    client: httpx.AsyncClient,
) -> None:
    """Definitions an older release let in (a timing with no slot, a task the tasks
    processor refuses), written straight to the log: refused on record, listed as refused,
    and the healthy schedule fires on."""
    base = {
        "defined_at": time.time(),
        "catchup": {"policy": "skip", "window_s": 60.0, "max_runs": 100},
    }
    never = {
        **base,
        "name": "never",
        "timing": {"cron": "30 2 * 3 0L", "tz": "Europe/Berlin", "gap": "skip", "fold": "first"},
        "action": {
            "kind": "run_task",
            "name": "ping",
            "args": {},
            "max_attempts": 5,
            "timeout_s": 60,
        },
    }
    endless = {
        **base,
        "name": "endless",
        "timing": {"every_seconds": 1.0, "anchor": "1970-01-01T00:00:00+00:00"},
        "action": {
            "kind": "run_task",
            "name": "ping",
            "args": {},
            "max_attempts": -5,
            "timeout_s": 60,
        },
    }
    for payload in (never, endless):
        written = await client.post(
            "/v1/events", json={"type": "schedule.defined", "payload": payload}
        )
        assert written.status_code == 201, written.text
    ran.clear()
    healthy = {"name": "healthy", "every": "1s", "task": "ping"}
    assert (await client.post("/v1/schedules", json=healthy)).status_code == 202

    async def fired_twice() -> bool:
        return len([t for t in ran if t.startswith("sched/healthy/")]) >= 2

    await eventually(fired_twice)
    rows = {r["name"]: r for r in (await client.get("/v1/schedules")).json()["schedules"]}
    assert "has no slot" in rows["never"]["refused"]
    assert "max_attempts" in rows["endless"]["refused"]
    assert rows["healthy"]["refused"] is None
    assert not [t for t in ran if t.startswith(("sched/never/", "sched/endless/"))]

"""The processor host in-process: engines over a real file, leases with fencing, claims, retries, skips."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs
from support.host import Echo, Fragile, Gated, Hoarder, Lingering, Offsets, Sleeper, Tally, Typed
from support.upcasting import TaskBoard, board_log, stored_at

from streamkit import (
    LIVE_STATE_CHANGED,
    EventDefinition,
    InvalidRequest,
    ProcessEventArgs,
    StreamProcessor,
    apply_delta,
    define_processor_contract,
    open_log,
)
from streamkit.backends import host_store
from streamkit.backends._host_store import LogHostStore
from streamkit.cli import stored_snapshot
from streamkit.config import HostConfig
from streamkit.engine._strays import CANCEL_WAIT
from streamkit.errors import InvalidConfig, InvalidEvent, SchemaCheckFailed
from streamkit.host import ProcessorHost
from streamkit.host._runner import MIN_BATCH_GRACE, ProcessorRunner
from streamkit.log import Log
from streamkit.records import StoredType


def make_config(tmp_path: Path, **overrides: Any) -> HostConfig:
    data: dict[str, Any] = {
        "db": str(tmp_path / "h.db"),
        "lease": {"ttl": 5.0, "heartbeat": 0.05},
        "retry": {"initial_delay": 0.01, "max_delay": 0.04, "stall_after": 3},
        "shutdown_grace": 1.0,
    }
    data.update(overrides)
    return HostConfig.model_validate(data)


HostFactory = Callable[..., ProcessorHost]


@pytest.fixture
async def hosts(tmp_path: Path) -> AsyncIterator[HostFactory]:
    """Builds hosts without a control socket and stops every one at the end."""
    made: list[ProcessorHost] = []

    def build(*processors: StreamProcessor[Any], **kwargs: Any) -> ProcessorHost:
        config = kwargs.pop("config", None) or make_config(tmp_path)
        host = ProcessorHost(config, processors=processors, serve_control=False, **kwargs)
        made.append(host)
        return host

    try:
        yield build
    finally:
        for host in made:
            await host.stop(grace=0.0)


async def items(db: Path, count: int, etype: str = "item", **payload: Any) -> list[int]:
    """Append from a second Log on the same file (as another process would); return offsets."""
    async with open_log(db) as log:
        committed = await log.stream("/").append(
            *({"type": etype, "payload": dict(payload, n=i)} for i in range(count))
        )
    return [event.offset for event in committed]


async def stored_checkpoint(db: Path, slug: str) -> tuple[int, str | None] | None:
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT reduced_through_offset, state FROM streamkit_checkpoints WHERE slug = ?",
            (slug,),
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else (int(row[0]), row[1])


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def stalled_on_poison(
    tmp_path: Path, hosts: HostFactory
) -> tuple[ProcessorHost, ProcessorRunner, int]:
    """A started host running Fragile, stalled on one poison item: (host, runner, its offset)."""
    host = hosts(Fragile())
    await host.start()
    (poison,) = await items(tmp_path / "h.db", 1, boom=True)
    runner = host.runner("fragile")
    await wait_for(lambda: runner.failures.stalled)
    return host, runner, poison


# -- the core -------------------------------------------------------------------------------


async def test_host_reduces_own_and_foreign_appends(tmp_path: Path, hosts: HostFactory) -> None:
    """Appends through the host and from another connection are both reduced and checkpointed."""
    host = hosts(Tally())
    await host.start()
    own = await host.append("/", [{"type": "item"}, {"type": "other"}])
    foreign = await items(tmp_path / "h.db", 2)
    await host.wait_until_processed("tally", foreign[-1])
    snapshot = await host.snapshot("tally")
    assert snapshot["state"]["offsets"] == [own[0].offset, *foreign]
    # Cursors count ephemeral offsets (live-state deltas) too, so they may pass the last item.
    assert snapshot["offset"] >= foreign[-1]
    await host.stop()
    assert (await stored_checkpoint(tmp_path / "h.db", "tally") or (0,))[0] >= foreign[-1]


async def test_restart_resumes_from_checkpoint(tmp_path: Path, hosts: HostFactory) -> None:
    """A new host catches up from the checkpoint: every event is reduced exactly once."""
    db = tmp_path / "h.db"
    first = hosts(Tally())
    await first.start()
    offsets = await items(db, 3)
    await first.wait_until_processed("tally", offsets[-1])
    await first.stop()
    offsets += await items(db, 2)
    second = hosts(Tally())
    await second.start()
    await second.wait_until_processed("tally", offsets[-1])
    assert (await second.snapshot("tally"))["state"]["offsets"] == offsets


async def test_status_reports_cursor_head_lag_lease(tmp_path: Path, hosts: HostFactory) -> None:
    """status names each processor's version, path, cursor, head, lag and the lease held here."""
    host = hosts(Tally())
    await host.start()
    offsets = await items(tmp_path / "h.db", 2)
    await host.wait_until_processed("tally", offsets[-1])
    status = await host.status()
    (row,) = status["processors"]
    assert (row["slug"], row["version"], row["path"], row["state"]) == (
        "tally",
        "1",
        "/",
        "running",
    )
    assert (row["head"], row["lag"]) == (2, 0)
    assert row["cursor"] >= 2
    assert row["lease"]["owner"] == host.owner
    assert row["lease_held_here"] is True
    assert row["events_reduced"] == 2
    assert status["host"]["owner"] == host.owner


async def test_snapshot_status_and_the_log_name_one_offset_past_an_ephemeral(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """An ephemeral takes an offset past the durable head: snapshot says the head, as status does."""
    host = hosts(Tally())
    await host.start()
    (item,) = await host.append("/", [{"type": "item"}])
    (blip,) = await host.append("/", [{"type": "item", "ephemeral": True}])
    await host.wait_until_processed("tally", blip.offset)
    snapshot = await host.snapshot("tally")
    (row,) = (await host.status())["processors"]
    assert blip.offset == item.offset + 1
    assert snapshot["offset"] == row["cursor"] == row["head"] == item.offset
    await host.stop()
    # From the checkpoint alone (no host): the same number.
    async with open_log(tmp_path / "h.db") as log:
        stored = await stored_snapshot(log, "tally")
        raw = await host_store(log).stored_snapshot("tally")
    assert raw["cursor"] == blip.offset  # the checkpoint counts the ephemeral's offset...
    assert stored["offset"] == stored["cursor"] == item.offset  # ...what is shown does not


async def test_one_slug_on_two_paths_is_refused(tmp_path: Path) -> None:
    """Checkpoints are per slug, so running one slug on two paths is refused before starting."""
    with pytest.raises(InvalidConfig, match="may run on one path only"):
        ProcessorHost(make_config(tmp_path), processors=[("/a", Tally()), ("/b", Tally())])


# -- leases ---------------------------------------------------------------------------------


async def test_second_host_waits_then_takes_over_on_release(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A second host waits while the lease is held and takes over once the first releases it."""
    db = tmp_path / "h.db"
    first = hosts(Tally(), owner="first")
    second = hosts(Tally(), owner="second")
    await first.start()
    await second.start()
    assert second.runner("tally").state == "waiting"
    offsets = await items(db, 2)
    await first.wait_until_processed("tally", offsets[-1])
    await first.stop()
    await wait_for(lambda: second.runner("tally").state == "running")
    offsets += await items(db, 2)
    await second.wait_until_processed("tally", offsets[-1])
    assert (await second.snapshot("tally"))["state"]["offsets"] == offsets
    status = await second.status()
    assert status["processors"][0]["lease"]["generation"] == 2


async def test_a_wait_for_the_engine_is_woken_by_the_takeover_itself(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """``next_engine`` answers at once when no engine is on its way, and a patient wait
    (``wait_until_processed`` on a host still waiting for the lease) is woken by the
    engine being built, whatever its timeout."""
    db = tmp_path / "h.db"
    first = hosts(Tally(), owner="first")
    second = hosts(Tally(), owner="second")
    await first.start()
    await second.start()
    runner = second.runner("tally")
    assert runner.engine is None
    assert await runner.next_engine(3600.0, patient=False) is None
    with pytest.raises(InvalidRequest, match="not running in this host"):
        await second.live_snapshot("tally")
    (offset,) = await items(db, 1)
    coming = asyncio.create_task(runner.next_engine(3600.0))
    processed = asyncio.create_task(second.wait_until_processed("tally", offset, 3600.0))
    await asyncio.sleep(0)
    assert not coming.done()
    await first.stop()
    engine = await asyncio.wait_for(coming, 30)
    assert engine is not None
    assert engine is runner.engine
    await asyncio.wait_for(processed, 30)
    assert await runner.next_engine(0.0, than=engine) is None


async def test_a_heartbeat_that_trips_on_an_unexpected_error_keeps_beating(
    hosts: HostFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug under one beat (not a coded error) is logged; the next beats still take the lease."""
    first = hosts(Tally(), owner="first")
    second = hosts(Tally(), owner="second")
    await first.start()
    tripped: list[bool] = []
    load_skips = LogHostStore.load_skips

    async def tripping(self: LogHostStore) -> dict[tuple[str, str], dict[int, int]]:
        if self is second.store and not tripped:  # once, in a beat of the second host
            tripped.append(True)
            raise RuntimeError("a bug in one beat")
        return await load_skips(self)

    await second.start()
    with capture_logs() as logs:
        monkeypatch.setattr(LogHostStore, "load_skips", tripping)
        await wait_for(lambda: bool(tripped))
        await first.stop()
        await wait_for(lambda: second.runner("tally").state == "running")
    (line,) = [entry for entry in logs if entry["event"] == "host.heartbeat_failed"]
    assert "a bug in one beat" in line["error"]


async def test_a_hand_off_during_a_catch_up_waits_for_one_batch_not_the_backlog(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """Handing off mid catch-up: the batch ends at the event in flight, checkpointed; the rest
    is left unread (the next holder runs no effect of it twice)."""
    db = tmp_path / "h.db"
    offsets = await items(db, 2_000)
    delivered = asyncio.Event()

    class Announcing(Gated):
        def process_event(self, args: ProcessEventArgs[Offsets]) -> None:
            super().process_event(args)
            delivered.set()

    gated = Announcing()
    host = hosts(gated)
    await host.start()
    runner = host.runner("gated")
    engine = runner.engine
    assert engine is not None
    await asyncio.wait_for(delivered.wait(), 10)  # in the first page, held by its gate
    handing = asyncio.ensure_future(runner.hand_off(grace=1.0))
    await asyncio.sleep(0.05)
    gated.gate.set()
    held = await asyncio.wait_for(handing, 30)
    assert held is not None
    # The event held by the gate was delivered and checkpointed; 1,999 are the next holder's.
    assert engine.cursor == offsets[0]
    stored = await stored_checkpoint(db, "gated")
    assert stored is not None
    assert stored[0] == offsets[0]
    assert gated.caught_up == []  # no at-head pass: it never was at the head


def freeze_renewals(host: ProcessorHost) -> None:
    """Stop a host's lease keeper, as if the process froze: its lease rows stop changing."""
    leases = host._leases
    assert leases is not None
    leases._keeper.stop()


async def test_unrenewed_lease_is_taken_over_and_old_holder_is_fenced(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A lease left unrenewed for a ttl of the watcher's own time is taken; the old holder stops."""
    db = tmp_path / "h.db"
    config = make_config(tmp_path, lease={"ttl": 0.5, "heartbeat": 0.05})
    first = hosts(Tally(), owner="first", config=config)
    await first.start()
    offsets = await items(db, 1)
    await first.wait_until_processed("tally", offsets[-1])
    second = hosts(Tally(), owner="second", config=config)
    await second.start()
    assert second.runner("tally").state == "waiting"
    freeze_renewals(first)
    await wait_for(lambda: second.runner("tally").state == "running")
    offsets += await items(db, 2)
    await second.wait_until_processed("tally", offsets[-1])
    # The first host's own clock says its lease lapsed: its next batch starts nothing.
    await wait_for(lambda: first.runner("tally").state == "waiting")
    assert first.runner("tally").engine is None
    assert first.runner("tally").failures.last_error is not None
    assert first.runner("tally").failures.last_error["code"] == "LEASE_LOST"
    assert (await second.snapshot("tally"))["state"]["offsets"] == offsets
    cursor, _state = await stored_checkpoint(db, "tally") or (0, None)
    assert cursor >= offsets[-1]
    status = await second.status()
    assert status["processors"][0]["lease"]["generation"] == 2


async def test_a_wall_clock_an_hour_fast_cannot_take_a_live_lease(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A host whose clock runs an hour ahead waits for a holder that keeps renewing."""
    config = make_config(tmp_path, lease={"ttl": 0.3, "heartbeat": 0.05})
    first = hosts(Tally(), owner="first", config=config)
    await first.start()
    fast = hosts(Tally(), owner="fast", config=config, clock=lambda: time.time() + 3600)
    await fast.start()
    await asyncio.sleep(1.2)  # four ttls of the fast host watching a live lease
    assert fast.runner("tally").state == "waiting"
    assert first.runner("tally").state == "running"
    assert (await first.status())["processors"][0]["lease"]["generation"] == 1


async def test_a_dead_host_with_a_fast_clock_does_not_pin_its_lease(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A holder whose clock ran an hour fast stops renewing; another takes over after one ttl."""
    db = tmp_path / "h.db"
    config = make_config(tmp_path, lease={"ttl": 0.3, "heartbeat": 0.05})
    fast = hosts(Tally(), owner="fast", config=config, clock=lambda: time.time() + 3600)
    await fast.start()
    offsets = await items(db, 1)
    await fast.wait_until_processed("tally", offsets[-1])
    honest = hosts(Tally(), owner="honest", config=config)
    await honest.start()
    freeze_renewals(fast)
    taken_at = time.monotonic()
    await wait_for(lambda: honest.runner("tally").state == "running")
    # Its expires_at says an hour from now; the watcher never consulted it.
    assert time.monotonic() - taken_at < 5.0
    await honest.wait_until_processed("tally", offsets[-1])


async def test_stolen_lease_writes_nothing_and_reacquires(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """With its lease taken, the host's checkpoint write is fenced off; once free it takes it again."""
    db = tmp_path / "h.db"
    host = hosts(Tally(), owner="mine", config=make_config(tmp_path, lease={"ttl": 1.0}))
    await host.start()
    before = await items(db, 1)
    await host.wait_until_processed("tally", before[-1])
    conn = sqlite3.connect(db)
    try:
        conn.execute(
            "UPDATE streamkit_leases SET owner = 'thief', generation = generation + 1,"
            " expires_at = ?",
            (time.time() + 0.5,),
        )
        conn.commit()
        later = await items(db, 1)
        await wait_for(lambda: host.runner("tally").state == "waiting")
        stored = (await stored_checkpoint(db, "tally") or (0,))[0]
        assert before[-1] <= stored < later[0]
        # The thief never renews: watched for a ttl, its row is stale, and the
        # heartbeat takes the lease back and catches up.
        await wait_for(lambda: host.runner("tally").state == "running", within=5)
        await host.wait_until_processed("tally", later[-1])
        generation = conn.execute("SELECT generation FROM streamkit_leases").fetchone()[0]
    finally:
        conn.close()
    assert generation == 3
    assert (await host.snapshot("tally"))["state"]["offsets"] == [*before, *later]


async def test_a_lease_taken_mid_batch_cancels_the_batch_and_its_append(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """The lease goes while a blocker sleeps: its append is refused and no later event starts."""
    db = tmp_path / "h.db"
    host = hosts(Echo(), owner="mine")
    await host.start()
    await items(db, 3, etype="job")
    await asyncio.sleep(0.1)  # the first job's blocker is asleep
    conn = sqlite3.connect(db)
    try:
        conn.execute(
            "UPDATE streamkit_leases SET owner = 'thief', generation = generation + 1, beat = 0"
        )
        conn.commit()
    finally:
        conn.close()
    await wait_for(lambda: host.runner("echo").state == "waiting")
    await asyncio.sleep(1.0)  # long enough for all three blockers, had they gone on
    async with open_log(db) as log:
        page = await log.stream("/").read()
    assert [e.type for e in page.events] == ["job", "job", "job"]
    error = host.runner("echo").failures.last_error
    assert error is not None
    assert error["code"] == "LEASE_LOST"
    assert "'thief'" in error["error"]


async def test_status_counts_malformed_payloads_and_reduce_failures(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """With skip chosen by the host's config for every processor, a payload failing its
    schema and a raising reduce are counted in status, with the last one."""
    db = tmp_path / "h.db"
    host = hosts(Typed(), config=make_config(tmp_path, on_malformed="skip", on_reduce_error="skip"))
    await host.start()
    async with open_log(db) as log:
        committed = await log.stream("/").append(
            {"type": "order", "payload": {"order": 1}},
            {"type": "order", "payload": {"order": "not a number"}},
            {"type": "order", "payload": {"order": 13}},
        )
    await host.wait_until_processed("typed", committed[-1].offset)
    (row,) = (await host.status())["processors"]
    assert row["malformed_payloads"] == 1
    assert row["last_malformed"]["offset"] == committed[1].offset
    assert row["last_malformed"]["type"] == "order"
    assert row["reduce_failures"] == 1
    assert row["last_reduce_failure"]["offset"] == committed[2].offset
    assert "unlucky order" in row["last_reduce_failure"]["error"]


async def test_a_host_stalls_at_a_malformed_payload_and_a_raising_reduce_by_default(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """By default the host's processor stalls at once before a malformed payload, is marked
    stalled with the error, and a skip of that event moves it on to stall at the reduce that
    raises, whose status keeps the reduce's traceback; a second skip lets it serve again."""
    db = tmp_path / "h.db"
    host = hosts(Typed())
    await host.start()
    async with open_log(db) as log:
        committed = await log.stream("/").append(
            {"type": "order", "payload": {"order": 1}},
            {"type": "order", "payload": {"order": "not a number"}},
            {"type": "order", "payload": {"order": 13}},
            {"type": "order", "payload": {"order": 2}},
        )
    offsets = [event.offset for event in committed]

    async def row() -> dict[str, Any]:
        (found,) = (await host.status())["processors"]
        return found

    async def stalled_at(offset: int) -> None:
        for _ in range(500):
            found = await row()
            if found["stalled"] and found["stalled_at"] == offset:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never stalled at {offset}: {found}")

    await stalled_at(offsets[1])
    found = await row()
    assert found["state"] == "stalled"
    assert found["cursor"] == offsets[0]
    assert found["failures"] == 1  # stalled at the first failure: a retry cannot pass it
    assert found["last_error"]["code"] == "PAYLOAD_MALFORMED"
    assert found["malformed_payloads"] == 0
    await host.skip("typed", offsets[1], by="test", reason="a test")
    await stalled_at(offsets[2])
    found = await row()
    assert found["cursor"] == offsets[1]
    assert found["last_error"]["code"] == "REDUCE_FAILED"
    assert "unlucky order" in found["last_error"]["error"]
    assert "raise ValueError" in found["last_error"]["traceback"]
    assert found["reduce_failures"] == 0
    skip = await host.skip("typed", offsets[2], by="test", reason="a test")
    for _ in range(500):
        found = await row()
        # The skip's own event is the head; the stall ends when the item that moved the
        # cursor completes, a moment after the cursor moved.
        if found["cursor"] == skip.offset and not found["stalled"]:
            break
        await asyncio.sleep(0.01)
    assert (found["cursor"], found["stalled"], found["state"]) == (skip.offset, False, "running")
    assert (await host.snapshot("typed"))["state"]["offsets"] == [offsets[0], offsets[3]]


async def test_the_first_batch_failure_names_the_failing_offset(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A batch [ok, poison, ok] fails at the poison's offset in its very first batch.failed line."""
    db = tmp_path / "h.db"
    host = hosts(Fragile())
    await host.start()
    with capture_logs() as logs:
        async with open_log(db) as log:
            committed = await log.stream("/").append(
                {"type": "item", "payload": {}},
                {"type": "item", "payload": {"boom": True}},
                {"type": "item", "payload": {}},
            )
        await wait_for(lambda: any(e["event"] == "batch.failed" for e in logs))
    first = next(e for e in logs if e["event"] == "batch.failed")
    assert first["offset"] == committed[1].offset
    assert first["failures"] == 1


# -- claims -----------------------------------------------------------------------------------


async def test_wakeup_claim_is_a_table_row_and_revives(tmp_path: Path, hosts: HostFactory) -> None:
    """A requested wakeup is stored as a claim (not an event) and the alarm revives at that time."""
    sleeper = Sleeper()
    host = hosts(sleeper)
    await host.start()
    at = time.time() + 0.3
    (alarm,) = await host.append("/", [{"type": "alarm", "payload": {"at": at}}])
    await host.wait_until_processed("sleeper", alarm.offset)
    await wait_for(lambda: host.runner("sleeper").claim_due is not None)
    assert host.log is not None
    claims = await host.log.stream("/").claims()
    assert claims == {"sleeper": pytest.approx(at)}
    await asyncio.wait_for(sleeper.woke.wait(), 5)
    assert time.time() >= at
    page = await host.log.stream("/").read()
    assert [e.type for e in page.events] == ["alarm"]
    await wait_for(lambda: host.runner("sleeper").claim_due is None)


async def test_claim_left_by_a_dead_host_revives_at_start(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A due claim found in the table at start revives the processor, then is released."""
    db = tmp_path / "h.db"
    async with open_log(db) as log:
        await log.stream("/").claim(time.time() - 5, claimant="sleeper")
    sleeper = Sleeper()
    host = hosts(sleeper)
    await host.start()
    await asyncio.wait_for(sleeper.eventless.wait(), 5)
    assert host.log is not None
    log = host.log
    deadline = time.monotonic() + 5
    while await log.stream("/").claims():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def test_new_lease_holder_runs_the_at_head_pass_without_waiting_for_the_claim(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A claim a dead host left (due in 20 min) does not delay recovery: the start runs the pass."""
    db = tmp_path / "h.db"
    async with open_log(db) as log:
        await log.stream("/").claim(time.time() + 1200, claimant="sleeper")
    sleeper = Sleeper()
    host = hosts(sleeper)
    await host.start()
    await asyncio.wait_for(sleeper.eventless.wait(), 5)


# -- failures, stalls, skips --------------------------------------------------------------------


async def test_failing_batch_backs_off_stalls_and_skip_moves_on(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A poison event is retried with backoff, reported stalled at its offset, and skipped on request."""
    db = tmp_path / "h.db"
    fragile = Fragile()
    host = hosts(fragile)
    await host.start()
    first = await items(db, 1)
    (poison,) = await items(db, 1, boom=True)
    after = await items(db, 1)
    runner = host.runner("fragile")
    await wait_for(lambda: runner.failures.stalled)
    (row,) = (await host.status())["processors"]
    assert (row["state"], row["stalled_at"]) == ("stalled", poison)
    assert first[0] <= row["cursor"] < poison
    assert "poison at" in row["last_error"]["error"]
    await asyncio.sleep(0.1)
    # Backoff, not a hot loop: a handful of attempts in this time, not thousands.
    assert 3 <= fragile.attempts[poison] < 40
    skip = await host.skip("fragile", poison, by="tester", reason="bad payload")
    await host.wait_until_processed("fragile", after[-1])
    assert (await host.snapshot("fragile"))["state"]["offsets"] == [*first, *after]
    await wait_for(lambda: not runner.failures.stalled)
    assert skip.type == "streamkit.event-skipped"
    assert skip.payload == {
        "slug": "fragile",
        "offset": poison,
        "type": "item",  # the skip names the event it hides
        "by": "tester",
        "reason": "bad payload",
    }
    await host.stop()
    # The skip is durable: a new host never delivers the poison event to that processor.
    again = Fragile()
    second = hosts(again)
    await second.start()
    more = await items(db, 1)
    await second.wait_until_processed("fragile", more[-1])
    assert poison not in again.attempts
    assert (await second.snapshot("fragile"))["state"]["offsets"] == [*first, *after, *more]


async def test_a_runner_far_behind_reads_the_log_and_passes_the_head_once(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """Commits beyond a stuck processor's byte budget are dropped and re-read: none lost.

    The runner's follower is the one buffer between a commit and the engine:
    past ``limits.subscriber_bytes`` it drops what it holds and reads the log
    instead, page by page; the at-head pass runs at the end of that backlog,
    not after each page.
    """
    db = tmp_path / "h.db"
    gated = Gated()
    config = make_config(tmp_path, limits={"subscriber_bytes": 64 * 1024})
    host = hosts(gated, config=config)
    await host.start()
    (first,) = await items(db, 1)
    runner = host.runner("gated")
    await wait_for(lambda: runner.cursor is not None and gated.caught_up != [])
    offsets = [first]
    with capture_logs() as logs:
        for _ in range(30):  # 1,500 events of 1 KB in 30 commits: far past 64 KiB
            offsets += await items(db, 50, blob="x" * 1000)
        await asyncio.sleep(0.2)  # the host's polls take the last commits in
        passes_before = len(gated.caught_up)
        gated.gate.set()
        await host.wait_until_processed("gated", offsets[-1])
    assert (await host.snapshot("gated"))["state"]["offsets"] == offsets
    assert any(entry["event"] == "processor.backlog_dropped" for entry in logs)
    # Three pages of 500 re-read after the drop, one pass at their end (a straggling
    # push may add one): a pass per page would be three or more.
    assert len(gated.caught_up) - passes_before <= 2


async def test_a_payload_newer_than_the_code_stalls_the_processor_at_it_in_status(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """SCHEMA_AHEAD through a host: stalled at the newer event, everything before it reduced."""
    db = tmp_path / "h.db"
    async with open_log(db) as log:
        older = await log.stream("/").append(
            stored_at(1, "a", 0, "ana"), stored_at(3, "b", 1, "bo")
        )
        (newer,) = await log.stream("/").append(
            {**stored_at(3, "c", 1, "cy"), "payload_version": 4}
        )
        await log.stream("/").append(stored_at(3, "d", 1, "di"))
    host = hosts(TaskBoard())
    await host.start()
    runner = host.runner("task-board")
    await wait_for(lambda: runner.failures.stalled)
    (row,) = (await host.status())["processors"]
    assert (row["state"], row["stalled_at"], row["cursor"]) == (
        "stalled",
        newer.offset,
        older[-1].offset,
    )
    assert row["last_error"]["code"] == "SCHEMA_AHEAD"
    assert await stored_checkpoint(db, "task-board") is not None
    assert (await stored_checkpoint(db, "task-board") or (0,))[0] == older[-1].offset


UNREADABLE = {
    "type": "task.created",
    "payload": {"title": "x", "priority": "high"},
    "payload_version": 3,
}


async def test_a_processor_set_to_stall_on_malformed_stops_there_until_an_operator_skips(
    tmp_path: Path,
) -> None:
    """on_malformed = "stall" from the host config: stalled before the payload, then skipped."""
    db = tmp_path / "h.db"
    async with open_log(db) as log:
        first, bad, after = await log.stream("/").append(
            stored_at(3, "a", 1, "ana"), UNREADABLE, stored_at(3, "c", 1, "cy")
        )
    config = make_config(
        tmp_path,
        processors=[{"class": "support.upcasting:TaskBoard", "on_malformed": "stall"}],
    )
    host = ProcessorHost(config, serve_control=False)
    try:
        await host.start()
        runner = host.runner("task-board")
        await wait_for(lambda: runner.failures.stalled)
        (row,) = (await host.status())["processors"]
        assert (row["state"], row["stalled_at"], row["stopped_at"], row["cursor"]) == (
            "stalled",
            bad.offset,
            bad.offset,
            first.offset,
        )
        assert row["last_error"]["code"] == "PAYLOAD_MALFORMED"
        assert f"--offset {bad.offset}" in row["last_error"]["error"]
        assert (row["malformed_payloads"], row["malformed_by_type"]) == (0, [])
        assert (await stored_checkpoint(db, "task-board") or (0,))[0] == first.offset
        await host.skip("task-board", bad.offset, by="tester", reason="a producer's bug")
        # The engine stopped there is replaced by one that reads past the skipped event.
        await wait_for(lambda: (runner.engine.cursor if runner.engine else 0) >= after.offset)
        assert (await host.snapshot("task-board"))["state"]["titles"] == ["a", "c"]
        # The stall is over once the item that moved the cursor completes, a moment after.
        await wait_for(lambda: not runner.failures.stalled)
        (row,) = (await host.status())["processors"]
        assert (row["stalled"], row["stopped_at"]) == (False, None)
    finally:
        await host.stop(grace=0.0)


async def test_status_shows_skipped_payloads_per_type_and_version_and_dropped_events(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """With "skip" chosen: every kind counted with its first offsets; DROPs counted beside."""
    db = tmp_path / "h.db"
    async with open_log(db) as log:
        committed = await log.stream("/").append(
            stored_at(1, "a", 0, "ana"),
            UNREADABLE,
            {"type": "task.retired", "payload": {}},
            {**UNREADABLE, "payload_version": 2},
            UNREADABLE,
        )
    host = hosts(TaskBoard(), config=make_config(tmp_path, on_malformed="skip"))
    await host.start()
    await host.wait_until_processed("task-board", committed[-1].offset)
    (row,) = (await host.status())["processors"]
    offsets = [event.offset for event in committed]
    assert row["malformed_payloads"] == 3
    assert row["malformed_by_type"] == [
        {"type": "task.created", "version": 2, "count": 1, "first_offsets": [offsets[3]]},
        {
            "type": "task.created",
            "version": 3,
            "count": 2,
            "first_offsets": [offsets[1], offsets[4]],
        },
    ]
    assert row["dropped_events"] == 1
    assert row["stopped_at"] is None
    assert (await host.snapshot("task-board"))["state"]["titles"] == ["a"]


async def test_the_data_check_at_start_warns_refuses_or_stays_off(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """schema_check: "refuse" stops the start before any lease; "warn" starts, logs and shows
    the problem in status; "off" does not look."""
    db = tmp_path / "h.db"
    async with open_log(db) as log:
        offsets = await board_log(log, "/")  # holds a task.created v4: newer than TaskBoard
    refusing = hosts(TaskBoard(), config=make_config(tmp_path, schema_check="refuse"))
    with pytest.raises(SchemaCheckFailed) as refused:
        await refusing.start()
    assert (
        f"task-board on /: task.created v4: 1 events ({offsets[6]}..{offsets[6]}): AHEAD"
        in refused.value.message
    )
    assert "the host did not start and nothing was written" in refused.value.message
    async with open_log(db) as log:
        assert await host_store(log).leases() == []
        assert await log.stream("/").head() == offsets[-1]

    with capture_logs() as logs:
        # The default ("auto") warns: no other version of the board serves.
        warning = hosts(TaskBoard())
        await warning.start()
    (row,) = (await warning.status())["processors"]
    assert row["schema_check"]["ok"] is False
    sampled, ahead = row["schema_check"]["problems"]  # in (type, version) order
    assert (ahead["type"], ahead["version"], ahead["outcome"]) == ("task.created", 4, "ahead")
    # The sample of each key (200 by default) found the v3 payload no release could read.
    assert (sampled["type"], sampled["version"]) == ("task.created", 3)
    assert "validated 3, 1 malformed: the processor would stall at" in sampled["text"]
    warned = [entry for entry in logs if entry["event"] == "host.schema_check"]
    assert sorted(entry["problem"] for entry in warned) == sorted(
        f"task-board on /: {problem['text']}" for problem in (ahead, sampled)
    )
    await warning.stop(grace=0.0)

    cheap = hosts(TaskBoard(), config=make_config(tmp_path, schema={"sample": 0}))
    await cheap.start()  # [schema] sample = 0: the summary alone, as before
    (row,) = (await cheap.status())["processors"]
    assert [problem["outcome"] for problem in row["schema_check"]["problems"]] == ["ahead"]
    await cheap.stop(grace=0.0)

    off = hosts(TaskBoard(), config=make_config(tmp_path, schema_check="off"))
    await off.start()
    (row,) = (await off.status())["processors"]
    assert row["schema_check"] is None


async def test_a_new_version_that_cannot_read_what_the_serving_one_reduced_does_not_start(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A version 2 whose model renamed a field and added a required one (same definition
    version, so the summary alone says ok) is refused at start by the default check, which
    samples the stored payloads; version 1 keeps serving; "warn" lets it start."""
    db = tmp_path / "h.db"
    serving = hosts(Typed())
    await serving.start()
    async with open_log(db) as log:
        placed = await log.stream("/").append(
            *({"type": "order", "payload": {"order": n}} for n in range(100, 139))
        )
    await serving.wait_until_processed("typed", placed[-1].offset)
    await serving.stop(grace=0.0)

    class Renamed(BaseModel):
        number: int
        currency: str

    class TypedV2(Typed):
        contract = define_processor_contract(
            slug="typed",
            version="2",
            state_schema=Offsets,
            events={"order": EventDefinition(description="an order", payload_schema=Renamed)},
            consumes=["order"],
        )

    new = hosts(TypedV2())
    with pytest.raises(SchemaCheckFailed) as refused:
        await new.start()
    message = refused.value.message
    assert "a new version would skip or stall at events the version serving now" in message
    assert "typed v2 on / (v1 serves, through 39): order v1: 39 events (1..39)" in message
    assert "validated 39, 39 malformed: the processor would stall at 1" in message
    async with open_log(db) as log:
        store = host_store(log)
        serving_row, own = await store.version_rows("typed", "2")
        assert serving_row is not None
        assert serving_row.reducer_version == "1"
        assert own is None  # nothing was written for version 2
    warned = hosts(TypedV2(), config=make_config(tmp_path, schema_check="warn"))
    await warned.start()
    (row,) = (await warned.status())["processors"]
    assert row["schema_check"]["ok"] is False


async def test_a_commit_during_the_data_check_at_start_is_not_a_summary_behind(
    tmp_path: Path, hosts: HostFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits right after the summary is read: the head was read first, so
    the check does not take the summary for one behind its log (and refuse to start)."""
    db = tmp_path / "h.db"
    other = open_log(db)
    await other.stream("/").append(stored_at(3, "a", 1, "ana"))
    read_summary = Log.stored_types

    async def then_a_commit(log: Log, path: str | None = None) -> list[StoredType]:
        found = await read_summary(log, path)
        await other.stream("/").append(stored_at(3, "b", 1, "bo"))
        return found

    monkeypatch.setattr(Log, "stored_types", then_a_commit)
    try:
        host = hosts(TaskBoard(), config=make_config(tmp_path, schema_check="refuse"))
        await host.start()
        (row,) = (await host.status())["processors"]
        assert row["schema_check"] == {"ok": True, "problems": []}
    finally:
        await other.aclose()


async def test_a_forged_skip_is_refused_and_one_in_the_log_is_not_obeyed(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """The API refuses a forged skip; one planted without its record is ignored; a real one works."""
    db = tmp_path / "h.db"
    host, runner, poison = await stalled_on_poison(tmp_path, hosts)
    forged = {"slug": "fragile", "offset": poison, "by": "mallory", "reason": "forged"}
    async with open_log(db) as log:
        with pytest.raises(InvalidEvent, match="reserved"):
            await log.stream("/").append({"type": "streamkit.event-skipped", "payload": forged})
        # As a log written before the namespace was reserved could hold: the event with
        # no skip record beside it (the control path, with a seal that writes nothing).
        planted = await log.append_control(
            "/", {"type": "streamkit.event-skipped", "payload": forged}, lambda conn, events: None
        )
    after = await items(db, 1)
    assert planted.offset > poison
    await asyncio.sleep(0.5)  # time for the host to see (and ignore) the planted event
    assert runner.failures.stalled
    assert runner.skipped == set()
    assert runner.failures.stalled_at == poison
    # The operator's verb still works, and the processor then sees everything else.
    await host.skip("fragile", poison, by="tester", reason="really poison")
    await host.wait_until_processed("fragile", after[-1])
    assert poison not in (await host.snapshot("fragile"))["state"]["offsets"]
    assert after[-1] in (await host.snapshot("fragile"))["state"]["offsets"]


async def test_a_skip_recorded_by_another_process_is_obeyed_at_the_next_heartbeat(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A skip written straight to the file (the CLI when no host answers) unsticks a running host."""
    db = tmp_path / "h.db"
    host, runner, poison = await stalled_on_poison(tmp_path, hosts)
    with capture_logs() as logs:
        async with open_log(db) as log:  # another process: not through this host
            recorded = await host_store(log).record_skip(
                "/", "fragile", poison, by="alice", reason="order 17 has no customer"
            )
        after = await items(db, 1)
        await host.wait_until_processed("fragile", after[-1])
    assert runner.skipped == {poison}
    await wait_for(lambda: not runner.failures.stalled)
    assert poison not in (await host.snapshot("fragile"))["state"]["offsets"]
    (line,) = [entry for entry in logs if entry["event"] == "processor.event_skipped"]
    assert (line["by"], line["reason"], line["recorded_at"]) == (
        "alice",
        "order 17 has no customer",
        recorded.offset,
    )


async def test_a_path_is_followed_for_watchers_only_while_watched(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """No watcher, no follower of the host's own; the first starts one, the last stops it."""
    host = hosts(Tally())
    await host.start()
    assert host._watch_feeds.feed("/") is None
    first = host.subscribe("/", "tally")
    second = host.subscribe("/", "tally")
    watch = host._watch_feeds.feed("/")
    assert watch is not None
    assert watch.following
    await host.append("/", [{"type": "item"}])
    deltas = await asyncio.wait_for(first.get(), 5)
    assert deltas
    assert deltas[0]["to"] > deltas[0]["from"]
    host.unsubscribe(first)
    assert watch.following  # the second still watches
    assert await asyncio.wait_for(second.get(), 5)
    host.unsubscribe(second)
    assert not watch.following
    # Watched again later: fed again, from the head as it is then.
    third = host.subscribe("/", "tally")
    await host.append("/", [{"type": "item"}])
    assert await asyncio.wait_for(third.get(), 5)
    host.unsubscribe(third)


class CountedTally(Tally):
    """Tally that counts its live-state projections."""

    def __init__(self) -> None:
        super().__init__()
        self.projections = 0

    def project_live_state(self, state: Offsets) -> Offsets:
        self.projections += 1
        return state


async def live_deltas_seen(
    host: ProcessorHost, work: Callable[[], Any], *, expect: int = 0
) -> list[dict[str, Any]]:
    """The live-state deltas the host's log pushes while ``work()`` runs and is processed.

    Waits for ``expect`` deltas; with none expected, gives stray ones a moment to show.
    """
    assert host.log is not None
    follower = host.log.stream("/").follow(0)
    seen: list[dict[str, Any]] = []

    async def collect() -> None:
        async for events, _ in follower:
            seen.extend(e.to_dict()["payload"] for e in events if e.type == LIVE_STATE_CHANGED)

    collector = asyncio.get_running_loop().create_task(collect())
    try:
        await work()
        runner = host.runner("tally")
        head = await host.log.stream("/").head()
        await wait_for(lambda: (runner.cursor or 0) >= head)
        if expect:
            await wait_for(lambda: len(seen) >= expect)
        else:
            await asyncio.sleep(0.2)
    finally:
        follower.close()
        await asyncio.gather(collector, return_exceptions=True)
    return seen


async def test_a_processor_nobody_watches_publishes_nothing(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """Unwatched, a host's batches never project the live state nor append a delta."""
    processor = CountedTally()
    host = hosts(processor)
    await host.start()

    async def work() -> None:
        for _ in range(3):
            await host.append("/", [{"type": "item"}])

    assert await live_deltas_seen(host, work) == []
    assert processor.projections == 0
    assert (await host.snapshot("tally"))["state"]["offsets"] == [1, 2, 3]


async def test_a_watcher_gets_the_present_then_deltas_and_leaving_stops_them(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A watcher arriving late is seeded with the present, then follows deltas; after it, none."""
    processor = CountedTally()
    host = hosts(processor)
    await host.start()
    await host.append("/", [{"type": "item"}, {"type": "item"}])
    runner = host.runner("tally")
    await wait_for(lambda: runner.cursor == 2)
    watch = host.watch("tally")
    seed = await anext(watch)
    assert (seed["kind"], seed["state"]["offsets"]) == ("seed", [1, 2])
    assert host.watching("/", "tally")
    (committed,) = await host.append("/", [{"type": "item"}])
    delta = await asyncio.wait_for(anext(watch), 5)
    assert (delta["kind"], delta["from"]) == ("delta", seed["rev"])
    held = apply_delta(seed["state"], delta["patch"])
    assert held["offsets"] == [1, 2, committed.offset]
    await watch.aclose()
    assert not host.watching("/", "tally")
    projected = processor.projections

    async def work() -> None:
        await host.append("/", [{"type": "item"}])

    assert await live_deltas_seen(host, work) == []
    assert processor.projections == projected


async def test_a_host_told_to_publish_always_publishes_unwatched(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """live_state = "always": every batch publishes its delta though nobody watches."""
    host = hosts(Tally(), config=make_config(tmp_path, live_state="always"))
    await host.start()

    async def work() -> None:
        await host.append("/", [{"type": "item"}])

    (delta,) = await live_deltas_seen(host, work, expect=1)
    assert delta["key"] == "tally"
    assert apply_delta({"offsets": [], "pings": 0}, delta["patch"])["offsets"] == [1]


async def test_a_second_skip_says_who_skipped_it_and_why(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """The same skip again returns the first record; another reason is refused naming the first."""
    host, _, poison = await stalled_on_poison(tmp_path, hosts)
    first = await host.skip("fragile", poison, by="ann", reason="bad payload")
    again = await host.skip("fragile", poison, by="ann", reason="bad payload")
    assert again.offset == first.offset
    with pytest.raises(InvalidRequest) as caught:
        await host.skip("fragile", poison, by="bob", reason="another reason")
    message = caught.value.message
    assert "already skipped" in message
    assert "'ann'" in message
    assert "'bad payload'" in message
    assert "nothing was written" in message


async def test_skip_refuses_missing_and_processed_offsets(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """Skipping an offset with no event, or one already checkpointed, is refused and writes nothing."""
    host = hosts(Tally())
    await host.start()
    offsets = await items(tmp_path / "h.db", 1)
    await host.wait_until_processed("tally", offsets[-1])
    with pytest.raises(InvalidRequest, match="no durable event at offset 9"):
        await host.skip("tally", 9, by="t", reason="")
    with pytest.raises(InvalidRequest, match="already checkpointed"):
        await host.skip("tally", offsets[-1], by="t", reason="")
    with pytest.raises(InvalidRequest, match="not run by this host"):
        await host.skip("nope", 1, by="t", reason="")
    assert host.log is not None
    page = await host.log.stream("/").read()
    assert [e.type for e in page.events] == ["item"]


# -- shutdown ----------------------------------------------------------------------------------


async def test_stop_abandons_background_work_keeps_claim_releases_lease(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """Stop cancels background work after the grace, keeps its claim and releases the lease."""
    db = tmp_path / "h.db"
    lingering = Lingering()
    host = hosts(lingering)
    await host.start()
    offsets = await items(db, 1)
    await host.wait_until_processed("lingering", offsets[-1])
    await wait_for(lambda: host.runner("lingering").claim_due is not None)
    await host.stop(grace=0.05)
    assert lingering.cancelled == 1
    conn = sqlite3.connect(db)
    try:
        (expires,) = conn.execute("SELECT expires_at FROM streamkit_leases").fetchone()
        claims = conn.execute("SELECT slug FROM streamkit_claims").fetchall()
    finally:
        conn.close()
    assert expires == float("-inf")
    assert claims == [("lingering",)]


async def test_poison_inside_a_catch_up_page_is_pinned_exactly(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """Retries go one event at a time, so the stall names the poison offset, not its page."""
    db = tmp_path / "h.db"
    before = await items(db, 3)
    (poison,) = await items(db, 1, boom=True)
    await items(db, 3)
    host = hosts(Fragile())
    await host.start()
    runner = host.runner("fragile")
    await wait_for(lambda: runner.failures.stalled)
    assert runner.failures.stalled_at == poison
    # The events before the poison were checkpointed on the way.
    assert (await stored_checkpoint(db, "fragile") or (0,))[0] >= before[-1]


async def test_latched_refusal_stalls_and_a_skip_rebuilds_the_engine(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A state too large to checkpoint stalls the processor; skipping the event lets a new engine on."""
    db = tmp_path / "h.db"
    host = hosts(Hoarder())
    await host.start()
    first = await items(db, 1)
    (big,) = await items(db, 1, etype="big")
    runner = host.runner("hoarder")
    await wait_for(lambda: runner.failures.stalled)
    assert runner.failures.stalled_at == big
    assert runner.failures.last_error is not None
    assert runner.failures.last_error["code"] == "REDUCE_CHECKPOINT_TOO_LARGE"
    await host.skip("hoarder", big, by="tester", reason="too big")
    after = await items(db, 1)
    await wait_for(lambda: not runner.failures.stalled)
    await host.wait_until_processed("hoarder", after[-1])
    assert (await host.snapshot("hoarder"))["state"]["offsets"] == [*first, *after]


class Stubborn(Tally):
    """Its blocker swallows every cancel: a batch that nothing can stop."""

    holding = False

    def __init__(self) -> None:
        self.released = asyncio.Event()  # the test's way out, so its loop can close

    def process_event(self, args: ProcessEventArgs[Offsets]) -> None:
        if args.event is None:
            return

        async def hold() -> None:
            self.holding = True
            while not self.released.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await self.released.wait()

        args.block_processor_while(hold)


async def test_a_stop_passes_a_batch_whose_blocker_ignores_its_cancel(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """The stop ends within its bounds, the lease released; the batch is counted a stray."""
    stubborn = Stubborn()
    host = hosts(stubborn)
    await host.start()
    await items(tmp_path / "h.db", 1)
    engine = host.runner("tally").engine
    assert engine is not None
    await wait_for(lambda: stubborn.holding)
    began = time.monotonic()
    with capture_logs() as logs:
        await host.stop(grace=0.1)
    assert time.monotonic() - began < MIN_BATCH_GRACE + CANCEL_WAIT + 3
    events = [entry["event"] for entry in logs]
    assert "processor.batch_abandoned" in events
    assert "lease.released" in events
    await asyncio.sleep(CANCEL_WAIT + 0.2)
    assert engine.statistics().incidents["refusing_cancel"] == ["a batch of tally"]
    assert engine.statistics().incidents["refused_cancel"] == 1
    stubborn.released.set()
    await wait_for(lambda: not engine.statistics().incidents["refusing_cancel"])


async def test_a_state_that_outgrows_the_ceiling_is_reported_stalled_at_that_event(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """The event whose reduce makes the deferred state too large: status says stalled there."""
    from engine.test_engine_state_ceiling import Hoard, blob, first_too_large

    host = hosts(Hoard())
    await host.start()
    crossing = first_too_large()
    runner = host.runner("hoard")
    offsets = []
    async with open_log(tmp_path / "h.db") as log:
        for n in range(1, crossing + 1):
            (event,) = await log.stream("/").append(blob(n))
            offsets.append(event.offset)
            if n < crossing:
                await host.wait_until_processed("hoard", event.offset)
    await wait_for(lambda: runner.failures.stalled, within=30)
    (row,) = (await host.status())["processors"]
    assert row["stalled_at"] == offsets[-1]
    assert "REDUCE_CHECKPOINT_TOO_LARGE" in str(row["last_error"])
    assert row["cursor"] == offsets[-2]


async def test_a_skip_of_another_event_than_the_stalled_one_needs_ahead(
    tmp_path: Path, hosts: HostFactory
) -> None:
    """A processor stalled at one event: a skip of a later one is refused, nothing written,
    naming both; with ahead it is recorded, and names the event it hides."""
    db = tmp_path / "h.db"
    host = hosts(Fragile())
    await host.start()
    offsets = await items(db, 1)
    poison = (await items(db, 1, boom=True))[0]
    later = (await items(db, 1))[0]
    await host.wait_until_processed("fragile", offsets[-1])
    runner = host.runner("fragile")
    for _ in range(500):
        if runner.failures.stalled:
            break
        await asyncio.sleep(0.01)
    assert runner.failures.stalled_at == poison
    async with open_log(db) as log:
        head = await log.stream("/").head()
    with pytest.raises(InvalidRequest) as refused:
        await host.skip("fragile", later, by="ops", reason="typo")
    assert refused.value.details["reason"] == "not_where_it_stands"
    assert f"is stalled at offset {poison}, not {later} (a 'item' event)" in str(refused.value)
    assert "needs --ahead" in str(refused.value)
    async with open_log(db) as log:
        assert await log.stream("/").head() == head  # nothing was written
    skip = await host.skip("fragile", later, by="ops", reason="on purpose", ahead=True)
    assert (skip.payload["offset"], skip.payload["type"]) == (later, "item")


async def test_an_unknown_slug_is_answered_with_the_closest_one(hosts: HostFactory) -> None:
    """A mistyped processor slug is refused naming the slug it probably meant."""
    host = hosts(Tally())
    await host.start()
    with pytest.raises(InvalidRequest) as refused:
        host.runner("taly")
    assert "processor 'taly' is not run by this host (did you mean 'tally'? this host runs: " in (
        str(refused.value)
    )

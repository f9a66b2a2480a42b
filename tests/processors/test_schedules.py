"""The schedules processor over a memory stream and a manual clock: fired once, or missed on record."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import takewhile
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from pydantic import BaseModel
from streamkit.processors.schedules import (
    SCHEDULE_FIRED,
    SCHEDULE_MISSED,
    AppendEvent,
    Catchup,
    Cron,
    Every,
    RunTask,
    Schedule,
    SchedulesProcessor,
    SchedulesState,
    backfill_event,
    defined_event,
    definitions,
    deleted_event,
    paused_event,
    resumed_event,
    sync,
)
from streamkit.processors.schedules._processor import _fire_each
from streamkit.processors.schedules._requests import schedule_from_request
from streamkit.processors.schedules._slot_events import fired_events
from streamkit.processors.tasks import (
    TASK_CANCEL_REQUESTED,
    TASK_REQUESTED,
    TASK_SUCCEEDED,
    TaskRequested,
)
from streamkit.testing import (
    ManualClock,
    MemoryStorage,
    MemoryStream,
    memory_storage,
    memory_stream,
    settle,
)
from support.schedule_bodies import PLAUSIBLE

from streamkit import (
    EventDefinition,
    InvalidContract,
    InvalidEvent,
    InvalidRequest,
    ProcessorEngine,
    define_processor_contract,
)
from streamkit.cli import main
from streamkit.errors import StorageBusy, StreamkitError
from streamkit.events import prepare_events

# A minute boundary: 2023-11-14T22:14:00Z.
T0 = 1_700_000_040.0


class Rig:
    def __init__(self) -> None:
        self.clock = ManualClock(T0)
        self.stream: MemoryStream = memory_stream(clock=self.clock)
        self.storage: MemoryStorage = memory_storage()
        self.engine: ProcessorEngine[SchedulesState] | None = None

    def start(self) -> ProcessorEngine[SchedulesState]:
        """A new engine and processor (as after a restart) over the same stream and storage."""
        self.stream.engines.clear()
        self.engine = ProcessorEngine(
            SchedulesProcessor(clock=self.clock),
            stream=self.stream,
            storage=self.storage,
            clock=self.clock,
        )
        self.stream.engines.append(self.engine)
        return self.engine

    async def at(self, seconds: float) -> None:
        """Move the clock to ``T0 + seconds`` and revive (what a due wakeup does)."""
        self.clock.now = T0 + seconds
        assert self.engine is not None
        await self.engine.revive()
        await settle()
        await self.engine.catch_up_from_log()

    def of_type(self, etype: str) -> list[Any]:
        return [e.payload for e in self.stream.events if e.type == etype]

    async def state(self) -> SchedulesState:
        assert self.engine is not None
        _, state = await self.engine.snapshot()
        return state


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    try:
        yield made
    finally:
        made.storage.close()


def minutely(name: str = "tick", **options: Any) -> Schedule:
    """Every minute; each slot fires whatever earlier tasks do (no tasks processor runs here)."""
    options.setdefault("overlap", "allow_all")
    return Schedule(name, Every("1m"), action=RunTask("ping", {"n": 1}), **options)


def settled(task_id: str, request_offset: int) -> dict[str, Any]:
    """The tasks processor's word that ``task_id`` succeeded."""
    return {
        "type": TASK_SUCCEEDED,
        "payload": {"task_id": task_id, "request_offset": request_offset, "attempt": 1},
    }


def offset_of(rig: Rig, task_id: str) -> int:
    return next(
        e.offset
        for e in rig.stream.events
        if e.type == TASK_REQUESTED and e.payload["task_id"] == task_id
    )


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_slot_fires_once_with_its_task_and_the_next_wakeup_is_asked_for(rig: Rig) -> None:
    engine = rig.start()
    await rig.stream.append(defined_event(minutely(), at=T0))
    await settle()
    assert rig.of_type(SCHEDULE_FIRED) == []  # nothing due at the instant of definition
    assert engine.statistics().claimed_at == T0 + 60
    await rig.at(60)
    (fired,) = rig.of_type(SCHEDULE_FIRED)
    assert fired == {
        "name": "tick",
        "slot": T0 + 60,
        "fire_at": T0 + 60,
        "task_id": fired["task_id"],
    }
    assert fired["task_id"] == f"sched/tick/{iso(T0 + 60)}"
    (task,) = rig.of_type(TASK_REQUESTED)
    assert (task["task_id"], task["name"], task["args"]) == (fired["task_id"], "ping", {"n": 1})
    assert engine.statistics().claimed_at == T0 + 120
    # A second pass at the same instant (any event, a revive) fires nothing again.
    await rig.at(61)
    assert len(rig.of_type(SCHEDULE_FIRED)) == 1
    entry = (await rig.state()).schedules["tick"]
    assert (entry.fired, entry.missed, entry.through, entry.last_slot) == (1, 0, T0 + 60, T0 + 60)


async def test_a_decision_made_again_after_a_crash_appends_nothing_new(rig: Rig) -> None:
    """The second guard: the keys and bodies of a slot's events are the slot's alone."""
    schedule = minutely()
    await rig.stream.append(*fired_events(schedule, datetime.fromtimestamp(T0 + 60, UTC)))
    again = await rig.stream.append(*fired_events(schedule, datetime.fromtimestamp(T0 + 60, UTC)))
    assert [e.offset for e in again] == [1, 2]  # the events already written, returned
    assert len(rig.stream.events) == 2


async def test_a_restarted_processor_does_not_fire_what_its_predecessor_fired(rig: Rig) -> None:
    rig.start()
    await rig.stream.append(defined_event(minutely(), at=T0))
    await settle()
    await rig.at(60)
    rig.start()  # a new incarnation, from the checkpoint
    await rig.at(90)
    await rig.at(120)
    assert [p["slot"] for p in rig.of_type(SCHEDULE_FIRED)] == [T0 + 60, T0 + 120]


async def test_a_host_asleep_for_a_day_fires_by_its_policy_and_records_every_other_slot(
    rig: Rig,
) -> None:
    rig.start()
    await rig.stream.append(
        defined_event(minutely("skipper"), at=T0),
        defined_event(minutely("latest", catchup=Catchup("latest")), at=T0),
        defined_event(minutely("all", catchup=Catchup("all", window="10m", max_runs=3)), at=T0),
    )
    await settle()
    day = 24 * 3600
    await rig.at(day + 5)
    fired: dict[str, list[float]] = {}
    for p in rig.of_type(SCHEDULE_FIRED):
        fired.setdefault(p["name"], []).append(p["slot"] - T0)
    assert fired == {"skipper": [day], "latest": [day], "all": [day - 120, day - 60, day]}
    missed = {(p["name"], p["reason"]): p["count"] for p in rig.of_type(SCHEDULE_MISSED)}
    assert missed == {
        ("skipper", "window"): 1439,
        ("latest", "coalesced"): 1439,
        ("all", "window"): 1430,
        ("all", "max_runs"): 7,
    }
    state = await rig.state()
    for name, entry in state.schedules.items():
        assert entry.through == T0 + day, name
        assert entry.fired + entry.missed == 1440, name  # every slot of the day, once


async def test_a_paused_schedule_records_its_slots_as_missed_and_fires_after_resume(
    rig: Rig,
) -> None:
    rig.start()
    await rig.stream.append(defined_event(minutely(), at=T0))
    await settle()
    await rig.at(60)
    await rig.stream.append(paused_event("tick", at=T0 + 70, by="ops"))
    await rig.at(300)
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60]
    (paused,) = rig.of_type(SCHEDULE_MISSED)
    assert (paused["reason"], paused["count"]) == ("paused", 4)  # 120, 180, 240, 300
    assert rig.engine is not None
    assert rig.engine.statistics().claimed_at is None  # paused: no wakeup for it
    rig.clock.now = T0 + 330
    await rig.stream.append(resumed_event("tick", at=T0 + 330))
    await rig.at(400)
    await rig.at(420)
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60, 360, 420]
    entry = (await rig.state()).schedules["tick"]
    assert (entry.fired, entry.missed, entry.paused) == (3, 4, False)


async def test_jitter_delays_a_slot_by_the_same_amount_on_every_host(rig: Rig) -> None:
    engine = rig.start()
    schedule = minutely(jitter="20s")
    await rig.stream.append(defined_event(schedule, at=T0))
    await settle()
    claimed = engine.statistics().claimed_at
    assert claimed is not None
    assert T0 + 60 <= claimed < T0 + 80
    await rig.at(60)
    if claimed > T0 + 60:
        assert rig.of_type(SCHEDULE_FIRED) == []  # not before its jittered instant
    await rig.at(claimed - T0)
    (fired,) = rig.of_type(SCHEDULE_FIRED)
    assert fired["fire_at"] == claimed
    assert fired["slot"] == T0 + 60


async def test_a_cron_schedule_fires_at_the_end_of_the_spring_gap(rig: Rig) -> None:
    spring = datetime(2026, 3, 28, 12, tzinfo=UTC).timestamp()  # Berlin jumps on the 29th
    rig.clock.now = spring
    rig.start()
    nightly = Schedule("nightly", Cron("30 2 * * *", tz="Europe/Berlin"), action=RunTask("report"))
    await rig.stream.append(defined_event(nightly, at=spring))
    await settle()
    gap_end = datetime(2026, 3, 29, 1, 0, tzinfo=UTC).timestamp()  # 03:00 CEST
    assert rig.engine is not None
    assert rig.engine.statistics().claimed_at == gap_end
    await rig.at(gap_end - T0)
    (fired,) = rig.of_type(SCHEDULE_FIRED)
    assert fired["slot"] == gap_end


async def test_a_deleted_schedule_fires_no_more_and_its_history_stays(rig: Rig) -> None:
    rig.start()
    await rig.stream.append(defined_event(minutely(), at=T0))
    await settle()
    await rig.at(60)
    await rig.stream.append(deleted_event("tick", by="ops"))
    await rig.at(600)
    assert len(rig.of_type(SCHEDULE_FIRED)) == 1
    assert (await rig.state()).schedules == {}
    assert rig.engine is not None
    assert rig.engine.statistics().claimed_at is None


async def test_a_definition_that_does_not_read_back_is_reported_and_the_others_fire(
    rig: Rig,
) -> None:
    rig.start()
    good = defined_event(minutely("good"), at=T0)
    bad = defined_event(minutely("bad"), at=T0)
    bad["payload"]["timing"] = {"cron": "0 3 * * *", "tz": "Mars/Olympus"}
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(good, bad)
        await settle()
        await rig.at(60)
    assert [p["name"] for p in rig.of_type(SCHEDULE_FIRED)] == ["good"]
    (refused,) = [e for e in logs if e["event"] == "schedule.definition_refused"]
    assert refused["name"] == "bad"
    assert "Mars/Olympus" in refused["error"]


async def test_a_stored_timing_with_no_slot_is_refused_and_the_others_fire(rig: Rig) -> None:
    """A definition written before the door refused it (an older release): a wall time Berlin
    always skips. The processor refuses it on record and every other schedule fires."""
    rig.start()
    good = defined_event(minutely("good"), at=T0)
    bad = defined_event(minutely("never"), at=T0)
    bad["payload"]["timing"] = {
        "cron": "30 2 * 3 0L",
        "tz": "Europe/Berlin",
        "gap": "skip",
        "fold": "first",
    }
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(good, bad)
        await settle()
        await rig.at(60)
        await rig.at(120)
    assert [p["name"] for p in rig.of_type(SCHEDULE_FIRED)] == ["good", "good"]
    (refused,) = [e for e in logs if e["event"] == "schedule.definition_refused"]
    assert refused["name"] == "never"
    assert "has no slot" in refused["error"]


def test_the_cli_refuses_a_timing_with_no_slot_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    add = ["schedules", "add", "never", "--cron", "30 2 * 3 0L", "--tz", "Europe/Berlin"]
    code = main([*add, "--gap", "skip", "--task", "ping", "--db", str(db)], out=io.StringIO())
    assert code == 1
    err = capsys.readouterr().err
    assert "has no slot" in err
    assert "[INVALID_REQUEST]" in err
    assert not db.exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--every", "99999999999w", "--task", "ping"],
        ["--every", "1m", "--window", "99999999999d", "--task", "ping"],
        ["--every", "1m", "--jitter", "99999999999w", "--task", "ping"],
        ["--cron", "@daily", "--tz", "A" * 5000, "--task", "ping"],
        ["--every", "1m", "--task", ""],
        ["--every", "1m", "--task", "t" * 5000],
    ],
    ids=["every", "window", "jitter", "tz", "empty-task", "long-task"],
)
def test_the_cli_refuses_what_the_door_refuses_with_a_coded_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    """No traceback, no 500: the coded refusal, and nothing written."""
    db = tmp_path / "bad.db"
    code = main(["schedules", "add", "x", *flags, "--db", str(db)], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 1
    assert "[INVALID_REQUEST]" in err
    assert "Traceback" not in err
    assert not db.exists()


async def test_sync_appends_only_what_differs_and_deletes_only_when_asked(rig: Rig) -> None:
    stream = rig.stream
    first = await sync(stream, [minutely("a"), minutely("b")], clock=rig.clock)
    assert (first.added, first.changed, first.unchanged) == (("a", "b"), (), ())
    same = await sync(stream, [minutely("a"), minutely("b")], clock=rig.clock)
    assert (same.added, same.changed, same.unchanged) == ((), (), ("a", "b"))
    assert len(stream.events) == 2  # nothing appended
    hourly = Schedule("a", Every("1h"), action=RunTask("ping", {"n": 1}))
    older = await sync(stream, [hourly], clock=rig.clock)  # an older host's shorter list
    assert (older.changed, older.deleted) == (("a",), ())
    assert sorted(await definitions(stream)) == ["a", "b"]  # b survives without prune
    pruned = await sync(stream, [hourly], prune=True, clock=rig.clock)
    assert pruned.deleted == ("b",)
    assert sorted(await definitions(stream)) == ["a"]
    with pytest.raises(InvalidRequest, match="named twice"):
        await sync(stream, [hourly, hourly], clock=rig.clock)


def test_a_schedule_refuses_bad_names_and_a_jitter_as_long_as_its_window() -> None:
    with pytest.raises(InvalidRequest, match="schedule name"):
        minutely("no spaces")
    with pytest.raises(InvalidRequest, match="jitter"):
        minutely(jitter="1m")  # the default skip window is one minute
    assert minutely(jitter="1m", catchup=Catchup("skip", window="5m")).jitter == timedelta(
        minutes=1
    )


async def test_overlap_skip_misses_slots_while_the_last_task_runs(rig: Rig) -> None:
    rig.start()
    await rig.stream.append(defined_event(minutely(overlap="skip"), at=T0))
    await settle()
    await rig.at(60)
    await rig.at(120)
    await rig.at(180)
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60]
    assert [
        (p["reason"], p["first"] - T0, p["last"] - T0) for p in rig.of_type(SCHEDULE_MISSED)
    ] == [
        ("overlap", 120, 120),
        ("overlap", 180, 180),
    ]
    first = f"sched/tick/{iso(T0 + 60)}"
    assert (await rig.state()).schedules["tick"].running == [first]
    await rig.stream.append(settled(first, offset_of(rig, first)))
    await rig.at(240)
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60, 240]
    assert (await rig.state()).schedules["tick"].running == [f"sched/tick/{iso(T0 + 240)}"]


async def test_overlap_buffer_one_waits_for_the_task_and_misses_beyond_one(rig: Rig) -> None:
    rig.start()
    await rig.stream.append(
        defined_event(minutely(overlap="buffer_one", catchup=Catchup("all", window="10m")), at=T0)
    )
    await settle()
    await rig.at(60)
    await rig.at(180)  # 120 waits; 180 finds the buffer full
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60]
    assert [p["slot"] - T0 for p in rig.of_type("schedule.buffered")] == [120]
    assert [(p["reason"], p["count"]) for p in rig.of_type(SCHEDULE_MISSED)] == [("buffer_full", 1)]
    first = f"sched/tick/{iso(T0 + 60)}"
    await rig.stream.append(settled(first, offset_of(rig, first)))
    await settle()
    # The waiting slot fires as soon as the task settled, under its own slot's key.
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60, 120]
    entry = (await rig.state()).schedules["tick"]
    assert (entry.buffered, entry.fired, entry.missed) == ([], 2, 1)


async def test_overlap_buffer_all_keeps_up_to_max_buffered(rig: Rig) -> None:
    rig.start()
    await rig.stream.append(
        defined_event(
            minutely(overlap="buffer_all", max_buffered=2, catchup=Catchup("all", window="10m")),
            at=T0,
        )
    )
    await settle()
    await rig.at(60)
    await rig.at(300)
    assert [p["slot"] - T0 for p in rig.of_type("schedule.buffered")] == [120, 180]
    assert [(p["reason"], p["first"] - T0, p["count"]) for p in rig.of_type(SCHEDULE_MISSED)] == [
        ("buffer_full", 240, 2)
    ]


async def test_overlap_cancel_other_cancels_the_running_task_and_fires(rig: Rig) -> None:
    rig.start()
    await rig.stream.append(defined_event(minutely(overlap="cancel_other"), at=T0))
    await settle()
    await rig.at(60)
    await rig.at(120)
    await rig.at(121)  # a second pass before anything settled: one cancel, not two
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60, 120]
    (cancel,) = rig.of_type(TASK_CANCEL_REQUESTED)
    assert cancel["task_id"] == f"sched/tick/{iso(T0 + 60)}"
    assert cancel["requested_by"] == "schedules"


async def test_allow_all_fires_every_slot_whatever_runs(rig: Rig) -> None:
    rig.start()
    await rig.stream.append(defined_event(minutely(overlap="allow_all"), at=T0))
    await settle()
    for t in (60, 120, 180):
        await rig.at(t)
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60, 120, 180]
    assert len((await rig.state()).schedules["tick"].running) == 3


async def test_a_deletion_puts_the_slots_that_came_due_undecided_on_record(rig: Rig) -> None:
    rig.start()
    await rig.stream.append(
        defined_event(minutely("paused-one"), at=T0), defined_event(minutely("idle"), at=T0)
    )
    await settle()
    await rig.stream.append(paused_event("paused-one", at=T0 + 10))
    await settle()
    # No pass runs for three minutes (no wakeup for the paused one; the other's is not
    # served: the host was down), then both are deleted.
    rig.clock.now = T0 + 200
    await rig.stream.append(deleted_event("paused-one"), deleted_event("idle"))
    await settle()
    missed = {p["name"]: (p["reason"], p["count"]) for p in rig.of_type(SCHEDULE_MISSED)}
    assert missed == {"paused-one": ("paused", 3), "idle": ("deleted", 3)}
    assert rig.of_type(SCHEDULE_FIRED) == []


async def test_a_backfill_fires_the_missed_slots_of_its_range_once(rig: Rig) -> None:
    rig.start()
    schedule = minutely()  # skip: a minute's grace
    await rig.stream.append(defined_event(schedule, at=T0))
    await settle()
    await rig.at(60)
    await rig.at(600)  # 120..540 missed (window), 600 fires
    assert [p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED)] == [60, 600]
    first = datetime.fromtimestamp(T0 + 60, UTC)
    last = datetime.fromtimestamp(T0 + 300, UTC)
    await rig.stream.append(backfill_event(schedule, first, last, by="ops"))
    await settle()
    fired = sorted(p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED))
    assert fired == [60, 120, 180, 240, 300, 600]  # 60 kept its first firing
    (done,) = rig.of_type("schedule.backfilled")
    assert (done["slots"], done["refused"]) == (5, None)
    entry = (await rig.state()).schedules["tick"]
    assert (entry.backfill, entry.fired) == (None, 6)
    assert all(late < 60 for late in entry.lateness)  # a backfill's age is not lateness
    # A second pass does nothing more.
    await rig.at(610)
    assert len(rig.of_type(SCHEDULE_FIRED)) == 6


async def test_a_backfill_after_a_redefinition_keeps_what_fired_and_fires_the_rest(
    rig: Rig,
) -> None:
    """Issue 55: slots that fired under the old args met IDEMPOTENCY_CONFLICT (same key, new
    body), the backfill was resent every pass and never done. A slot that fired keeps its
    first firing; the missed ones fire under the new definition; the backfill is done."""
    rig.start()
    schedule = minutely()
    await rig.stream.append(defined_event(schedule, at=T0))
    await settle()
    await rig.at(60)
    await rig.at(600)  # 60 and 600 fire; 120..540 missed
    redefined = Schedule("tick", Every("1m"), action=RunTask("ping", {"v": 2}), overlap="allow_all")
    await rig.stream.append(defined_event(redefined, at=T0 + 601))
    await settle()
    first = datetime.fromtimestamp(T0 + 60, UTC)
    last = datetime.fromtimestamp(T0 + 300, UTC)
    await rig.stream.append(backfill_event(redefined, first, last, by="ops"))
    await settle()
    fired = sorted(p["slot"] - T0 for p in rig.of_type(SCHEDULE_FIRED))
    assert fired == [60, 120, 180, 240, 300, 600]
    (done,) = rig.of_type("schedule.backfilled")
    assert (done["slots"], done["kept"], done["refused"]) == (5, 1, None)
    requested = {
        e.payload["task_id"]: e.payload["args"]
        for e in rig.stream.events
        if e.type == TASK_REQUESTED
    }
    slot_60 = datetime.fromtimestamp(T0 + 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert requested[f"sched/tick/{slot_60}"] == {"n": 1}  # its first firing, kept
    assert sum(1 for args in requested.values() if args == {"v": 2}) == 4
    assert (await rig.state()).schedules["tick"].backfill is None
    await rig.at(610)
    assert len(rig.of_type("schedule.backfilled")) == 1  # done once, not resent


async def test_a_backfill_stops_at_a_refusal_that_cannot_change_and_says_why() -> None:
    """A refusal that a retry cannot change ends the backfill with its reason (the done event
    says it) instead of resending it every pass; one that may change is raised (retried)."""

    class Appends:
        def __init__(self, error: StreamkitError) -> None:
            self.error = error
            self.calls = 0

        async def append(self, *events: Any) -> list[Any]:
            self.calls += 1
            if any(
                e["type"] == TASK_REQUESTED and "00:02:00" in e["payload"]["task_id"]
                for e in events
            ):
                raise self.error
            return []

    schedule = minutely()
    slots = [datetime(2026, 5, 4, 0, minute, tzinfo=UTC) for minute in (1, 2, 3)]
    refused = InvalidEvent("the payload does not validate", details={})
    kept, why = await _fire_each(Appends(refused), schedule, slots)  # type: ignore[arg-type]
    assert kept == 0
    assert why is not None
    assert why.startswith("slot 2026-05-04T00:02:00+00:00 was refused: ")
    with pytest.raises(StorageBusy):
        await _fire_each(Appends(StorageBusy("busy", details={})), schedule, slots)  # type: ignore[arg-type]


async def test_a_backfill_of_too_many_slots_is_refused_before_and_by_the_processor(
    rig: Rig,
) -> None:
    second = Schedule("sec", Every("1s"), action=RunTask("ping"), overlap="allow_all")
    first = datetime.fromtimestamp(T0, UTC)
    with pytest.raises(InvalidRequest, match="more than 1000 slots"):
        backfill_event(second, first, first + timedelta(hours=1))
    rig.start()
    await rig.stream.append(defined_event(second, at=T0))
    await settle()
    await rig.at(3600)
    # Written by hand, past the request's check: the processor refuses it, fires none.
    await rig.stream.append(
        {
            "type": "schedule.backfill-requested",
            "payload": {"name": "sec", "first": T0, "last": T0 + 3000},
        }
    )
    await settle()
    (done,) = rig.of_type("schedule.backfilled")
    assert done["slots"] == 0
    assert "more than 1000 slots" in done["refused"]


TRANSITIONS = {
    # zone: (spring-forward day, fall-back day), 2026
    "Europe/Berlin": (datetime(2026, 3, 29, tzinfo=UTC), datetime(2026, 10, 25, tzinfo=UTC)),
    "America/New_York": (datetime(2026, 3, 8, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)),
}


@pytest.mark.parametrize("zone", sorted(TRANSITIONS))
@pytest.mark.parametrize("which", ["spring", "fall"])
@pytest.mark.parametrize(("expr", "label"), [("30 2 * * *", "daily"), ("0 * * * *", "hourly")])
async def test_a_cron_schedule_across_a_transition_fires_each_wall_slot_once(
    zone: str, which: str, expr: str, label: str
) -> None:
    """The processor, woken at each wakeup it asks for over two days around the change."""
    from zoneinfo import ZoneInfo

    tz = ZoneInfo(zone)
    day = TRANSITIONS[zone][0 if which == "spring" else 1]
    local_day = day.date()
    start = datetime.combine(local_day - timedelta(days=1), datetime.min.time(), tz).timestamp()
    end = datetime.combine(local_day + timedelta(days=2), datetime.min.time(), tz).timestamp()
    rig = Rig()
    try:
        rig.clock.now = start
        engine = rig.start()
        schedule = Schedule("s", Cron(expr, tz=zone), action=RunTask("ping"), overlap="allow_all")
        await rig.stream.append(defined_event(schedule, at=start))
        await settle()
        woken: list[float] = []
        while (wake := engine.statistics().claimed_at) is not None and wake <= end:
            assert wake not in woken, f"woken twice for {wake}"
            woken.append(wake)
            rig.clock.now = wake
            await engine.revive()
            await settle()
        slots = [p["slot"] for p in rig.of_type(SCHEDULE_FIRED)]
        assert rig.of_type(SCHEDULE_MISSED) == []  # every wakeup on time: nothing missed
        assert slots == sorted(set(slots))  # ascending, none twice
        expected = [
            s.timestamp()
            for s in takewhile(
                lambda s: s.timestamp() <= end,
                schedule.timing.forward(datetime.fromtimestamp(start, UTC)),
            )
        ]
        assert slots == expected
        walls = [datetime.fromtimestamp(s, tz) for s in slots]
        if label == "daily":
            # One run each local day; on the spring day at the gap's end (03:00), else 02:30.
            assert len({w.date() for w in walls}) == len(walls)
            on_day = [w for w in walls if w.date() == day.date()]
            wanted = "03:00" if which == "spring" and zone == "Europe/Berlin" else "02:30"
            if which == "spring" and zone == "America/New_York":
                wanted = "03:00"
            assert [w.strftime("%H:%M") for w in on_day] == [wanted]
            if which == "fall" and zone == "Europe/Berlin":
                # 02:30 happened twice that night: it fired at the first, in summer time.
                assert on_day[0].utcoffset() == timedelta(hours=2)
        else:
            # Hourly: each wall hour once; the skipped hour shifts onto the next, the
            # repeated one fires at its first occurrence only.
            hours = [w.strftime("%m-%d %H") for w in walls]
            assert len(hours) == len(set(hours))
            # That local day has 23 wall hours in spring (one skipped) and 24 in fall (one
            # repeated, fired once), 25 real hours notwithstanding.
            on_day = [w for w in walls if w.date() == day.date()]
            assert len(on_day) == (23 if which == "spring" else 24)
    finally:
        rig.storage.close()


class ReportDue(BaseModel):
    kind: str = "daily"


REPORTS = define_processor_contract(
    slug="reports",
    version="1",
    state_schema=SchedulesState,
    events={
        "report.due": EventDefinition(
            description="a report is due", payload_schema=ReportDue, version=1, upcasters={}
        )
    },
    consumes=["report.due"],
)


def reports_rig() -> Rig:
    """A rig whose schedules processor may append the reports contract's events."""
    rig = Rig()
    rig.stream.engines.clear()
    rig.engine = ProcessorEngine(
        SchedulesProcessor(clock=rig.clock, emits=[REPORTS]),
        stream=rig.stream,
        storage=rig.storage,
        clock=rig.clock,
    )
    rig.stream.engines.append(rig.engine)
    return rig


async def test_an_append_event_schedule_appends_its_event_once_per_slot() -> None:
    rig = reports_rig()
    try:
        due = Schedule("reports", Every("1m"), action=AppendEvent("report.due", {"kind": "daily"}))
        await rig.stream.append(defined_event(due, at=T0))
        await settle()
        await rig.at(60)
        await rig.at(61)
        (event,) = [e for e in rig.stream.events if e.type == "report.due"]
        assert event.payload == {"kind": "daily"}
        assert event.metadata == {"schedule": "reports", "slot": iso(T0 + 60)}
        (fired,) = rig.of_type(SCHEDULE_FIRED)
        assert fired["task_id"] is None
        assert rig.of_type(TASK_REQUESTED) == []
    finally:
        rig.storage.close()


async def test_a_slot_whose_events_are_refused_is_missed_on_record_and_the_others_fire() -> None:
    """Issue 55: an event the schedule's contract refuses (a payload that does not fit) failed
    the whole pass, every schedule with it. Its slots go on record, missed for "refused"."""
    rig = reports_rig()
    try:
        bad = Schedule("bad", Every("1m"), action=AppendEvent("report.due", {"kind": 5}))
        await rig.stream.append(defined_event(bad, at=T0), defined_event(minutely("good"), at=T0))
        await settle()
        with structlog.testing.capture_logs() as logs:
            for at in (60, 120, 180):
                await rig.at(at)
        assert [p["name"] for p in rig.of_type(SCHEDULE_FIRED)] == ["good"] * 3
        missed = rig.of_type("schedule.missed")
        assert [(m["name"], m["reason"], m["count"]) for m in missed] == [("bad", "refused", 1)] * 3
        assert rig.engine.statistics().batch_failures == 0
        refused = [e for e in logs if e["event"] == "schedule.slot_refused"]
        assert refused
        assert "report.due" in refused[0]["error"]
        assert [e for e in rig.stream.events if e.type == "report.due"] == []
    finally:
        rig.storage.close()


async def test_an_event_the_processor_may_not_append_misses_its_slots_on_record(rig: Rig) -> None:
    rig.start()  # no emits: it may append no report.due
    due = Schedule("reports", Every("1m"), action=AppendEvent("report.due"))
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(defined_event(due, at=T0))
        await settle()
        await rig.at(60)
        await rig.at(120)
    assert [e for e in rig.stream.events if e.type == "report.due"] == []
    assert [(p["reason"], p["count"]) for p in rig.of_type(SCHEDULE_MISSED)] == [
        ("undeclared", 1),
        ("undeclared", 1),
    ]
    assert any(e["event"] == "schedule.undeclared_event" for e in logs)
    assert rig.engine is not None
    assert rig.engine.statistics().batch_failures == 0  # refused before any append: no wedge


def test_emits_takes_a_contract_or_its_import_path_and_refuses_anything_else() -> None:
    assert "report.due" in SchedulesProcessor(emits=[REPORTS]).contract.emits
    named = SchedulesProcessor(emits=["streamkit.processors.tasks:TASKS_CONTRACT"])
    assert "task.succeeded" in named.contract.emits
    with pytest.raises(InvalidContract, match="cannot import"):
        SchedulesProcessor(emits=["nowhere:THING"])
    with pytest.raises(InvalidContract, match="not a processor contract"):
        SchedulesProcessor(emits=["streamkit.processors.tasks:TASK_REQUESTED"])


def test_sync_can_come_first_on_a_fresh_deploy(tmp_path: Path) -> None:
    """`schedules sync` on a log not made yet: a dry run creates nothing and would add every
    schedule; the sync itself creates the log and adds them; again, nothing changes."""
    (tmp_path / "streamkit.toml").write_text(
        'db = "app.db"\n\n[[schedules]]\nname = "nightly"\nevery = "1h"\ntask = "reports.nightly"\n'
    )
    config = str(tmp_path / "streamkit.toml")

    def sync(*flags: str) -> str:
        out = io.StringIO()
        assert main(["schedules", "sync", "--config", config, *flags], out=out) == 0
        return out.getvalue()

    assert sync("--dry-run").splitlines()[0] == "1 would be added: nightly"
    assert not (tmp_path / "app.db").exists()
    assert sync().splitlines()[0] == "1 were added: nightly"
    assert (tmp_path / "app.db").exists()
    assert sync().splitlines()[-1] == "1 unchanged"


@settings(max_examples=300, deadline=None)
@given(body=PLAUSIBLE)
def test_no_definition_the_door_accepts_can_have_its_slots_refused(body: dict[str, Any]) -> None:
    """Random requests: refused at the door (coded), or a schedule that has a slot and whose
    slot's events the log and the tasks processor take. So no accepted definition can fail a
    pass of the processor, for itself or for the others."""
    fields = {k: v for k, v in body.items() if k not in ("by", "from", "to")}
    try:
        schedule = schedule_from_request(fields)
    except InvalidRequest:
        return
    slot = next(schedule.timing.forward(datetime(2026, 5, 4, tzinfo=UTC)), None)
    assert slot is not None, schedule.spec()
    events = fired_events(schedule, slot)
    prepare_events(events)  # the log's door: refuses nothing here
    for event in events:
        if event["type"] == TASK_REQUESTED:
            TaskRequested.model_validate(event["payload"])

"""The dead-letter queue: records from any origin, replay page by page, reports, bounded state."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamkit.processors.dlq import (
    DEAD_LETTERED,
    MAX_QUEUED_REPLAYS,
    RECORD_ABANDONED,
    RECORD_REPLAYING,
    RECORD_SUCCEEDED,
    REPLAY_COMPLETED,
    REPLAY_PROGRESS,
    DlqProcessor,
    DlqRecord,
    DlqState,
    ReplayContext,
    ReplayRef,
    dead_lettered_event,
    find_head,
    iter_records,
    replay_requested_event,
)
from streamkit.processors.tasks import (
    TASK_REQUESTED,
    TASK_SUCCEEDED,
    TASKS_CONTRACT,
    TaskContext,
    TaskRequested,
    TasksProcessor,
    TasksState,
    task_requested_event,
)
from streamkit.testing import (
    ManualClock,
    MemoryStorage,
    MemoryStream,
    memory_storage,
    memory_stream,
    reduce_processor,
    settle,
)
from support.waits import until

from streamkit import (
    EventDefinition,
    InvalidEvent,
    ProcessorEngine,
    StreamProcessor,
    define_processor_contract,
    open_log,
)

T0 = 1_700_000_000.0


def record(rid: str, operation: str = "op", **extra: Any) -> dict[str, Any]:
    """A dead-lettered event input for record ``rid``."""
    fields: dict[str, Any] = {
        "record_id": rid,
        "origin": "test",
        "operation": operation,
        "payload": {"n": rid},
        "error": "it broke",
        "attempts": 3,
    }
    fields.update(extra)
    return dead_lettered_event(**fields)


class Rig:
    """A memory stream, a clock and engines for the processors a test runs."""

    def __init__(self) -> None:
        self.clock = ManualClock(T0)
        self.stream: MemoryStream = memory_stream(clock=self.clock)
        self.storages: list[MemoryStorage] = []

    def start(self, processor: StreamProcessor[Any]) -> ProcessorEngine[Any]:
        """Build an engine over the shared stream with its own storage, fed by pushes."""
        storage = memory_storage()
        self.storages.append(storage)
        engine = ProcessorEngine(processor, stream=self.stream, storage=storage, clock=self.clock)
        self.stream.engines.append(engine)
        return engine

    def of_type(self, etype: str) -> list[Any]:
        """Payloads of ``etype`` in the log."""
        return [e.payload for e in self.stream.events if e.type == etype]


@pytest.fixture
def rig() -> Iterator[Rig]:
    """A fresh rig; its storages are closed afterwards."""
    made = Rig()
    try:
        yield made
    finally:
        for storage in made.storages:
            storage.close()


async def records(stream: MemoryStream, **kwargs: Any) -> dict[str, DlqRecord]:
    """Every record the log shows, by id."""
    return {r.record_id: r async for r in iter_records(stream, **kwargs)}


def test_dead_lettered_helper_validates_and_reduce_counts() -> None:
    """The helper refuses a bad record; the reduce counts records without keeping them."""
    with pytest.raises(InvalidEvent, match="attempts"):
        record("r", attempts=-1)
    state = reduce_processor(DlqProcessor(), [record(f"rec-{i}") for i in range(3)])
    assert state.counts.pending == 3
    assert state.counts.total == 3
    assert "rec-" not in state.model_dump_json()


def test_retention_keeps_everything_above_the_floor_while_a_record_is_pending() -> None:
    """retain_from: the floor + 1 while records are pending; nothing with none pending."""
    dlq = DlqProcessor()
    pending = reduce_processor(dlq, [record("r1"), record("r2")])
    assert dlq.retain_from(pending) == pending.floor + 1 == 1
    raised = pending.model_copy(update={"floor": 40})
    assert dlq.retain_from(raised) == 41
    assert dlq.retain_from(reduce_processor(dlq, [])) is None
    settled = pending.model_copy(
        update={"counts": pending.counts.model_copy(update={"pending": 0, "succeeded": 2})}
    )
    assert dlq.retain_from(settled) is None


async def test_replay_report_has_all_four_kinds(rig: Rig) -> None:
    """One replay request reports replayed, retried, abandoned and skipped record ids."""
    handled: list[tuple[str, ReplayContext]] = []

    async def ok(rec: DlqRecord, ctx: ReplayContext) -> None:
        handled.append((rec.record_id, ctx))

    async def fails(rec: DlqRecord, ctx: ReplayContext) -> None:
        raise RuntimeError("still broken")

    dlq = DlqProcessor(handlers={"ok": ok, "fails": fails}, max_attempts=2, clock=rig.clock)
    engine = rig.start(dlq)
    await rig.stream.append(
        record("good", "ok"),
        record("retry", "fails"),
        # Already replayed once: its next failure reaches max_attempts=2.
        record("last", "fails", replay_of=ReplayRef(record_id="last", replay=1)),
        record("nohandler", "mystery"),
    )
    await rig.stream.append(replay_requested_event(requested_by="ops"))
    await until(lambda: bool(rig.of_type(REPLAY_COMPLETED)))
    (done,) = rig.of_type(REPLAY_COMPLETED)
    report = done["report"]
    assert report["replayed"] == ["good"]
    assert report["retried"] == ["retry"]
    assert report["abandoned"] == ["last"]
    assert report["skipped"] == ["nohandler"]
    assert report["counts"] == {"replayed": 1, "retried": 1, "abandoned": 1, "skipped": 1}
    assert done["requested_by"] == "ops"
    assert [(rid, ctx.replay, ctx.idempotency_key) for rid, ctx in handled] == [
        ("good", 1, "dlq/replay/good/1")
    ]
    await settle()
    now = await records(rig.stream)
    assert now["good"].status == "succeeded"
    assert now["retry"].status == "pending"
    assert now["retry"].replays == 1
    assert "still broken" in now["retry"].error
    assert now["last"].status == "abandoned"
    assert now["nohandler"].status == "pending"
    _, state = await engine.snapshot()
    # "last" entered as a re-dead-lettered record, so it is not counted as new.
    assert state.counts.model_dump() == {
        "pending": 2,
        "replaying": 0,
        "succeeded": 1,
        "abandoned": 1,
        "total": 3,
    }
    assert state.replays == []


async def test_replay_by_ids_skips_unknown_and_settled_ids(rig: Rig) -> None:
    """A replay naming ids replays only those; unknown or already settled ids are skipped."""

    async def ok(rec: DlqRecord, ctx: ReplayContext) -> None:
        return None

    rig.start(DlqProcessor(handlers={"op": ok}, clock=rig.clock))
    await rig.stream.append(record("a"), record("b"), record("c"))
    await rig.stream.append(replay_requested_event(record_ids=["a"]))
    await until(lambda: len(rig.of_type(REPLAY_COMPLETED)) == 1)
    await rig.stream.append(replay_requested_event(record_ids=["a", "b", "ghost"]))
    await until(lambda: len(rig.of_type(REPLAY_COMPLETED)) == 2)
    first, second = (p["report"] for p in rig.of_type(REPLAY_COMPLETED))
    assert first["replayed"] == ["a"]
    assert second["replayed"] == ["b"]
    assert sorted(second["skipped"]) == ["a", "ghost"]
    await settle()
    now = await records(rig.stream)
    assert {rid: r.status for rid, r in now.items()} == {
        "a": "succeeded",
        "b": "succeeded",
        "c": "pending",
    }


async def test_replay_by_operation_leaves_others_pending(rig: Rig) -> None:
    """A replay filtered by operation touches only that operation's records."""

    async def ok(rec: DlqRecord, ctx: ReplayContext) -> None:
        return None

    rig.start(DlqProcessor(handlers={"x": ok, "y": ok}, clock=rig.clock))
    await rig.stream.append(record("x1", "x"), record("y1", "y"), record("x2", "x"))
    await rig.stream.append(replay_requested_event(operation="x"))
    await until(lambda: bool(rig.of_type(REPLAY_COMPLETED)))
    (done,) = rig.of_type(REPLAY_COMPLETED)
    assert sorted(done["report"]["replayed"]) == ["x1", "x2"]
    await rig.stream.append(replay_requested_event())
    await until(lambda: len(rig.of_type(REPLAY_COMPLETED)) == 2)
    assert rig.of_type(REPLAY_COMPLETED)[1]["report"]["replayed"] == ["y1"]


async def test_failed_tasks_replay_through_the_tasks_processor(rig: Rig) -> None:
    """A dead-lettered task is re-requested by the default replay; its outcome settles the record."""
    fixed = {"yes": False}

    async def invoice(args: dict[str, Any], ctx: TaskContext) -> str:
        if args["customer"] == "c2" or not fixed["yes"]:
            raise RuntimeError(f"no address for {args['customer']}")
        return "sent"

    tasks = rig.start(TasksProcessor(handlers={"invoice": invoice}, clock=rig.clock))
    dlq = rig.start(DlqProcessor(max_attempts=2, clock=rig.clock))
    await rig.stream.append(
        task_requested_event(task_id="i1", name="invoice", args={"customer": "c1"}, max_attempts=1),
        task_requested_event(task_id="i2", name="invoice", args={"customer": "c2"}, max_attempts=1),
    )
    await until(lambda: len(rig.of_type(DEAD_LETTERED)) == 2)
    fixed["yes"] = True  # c1's problem is fixed; c2's is not

    await rig.stream.append(replay_requested_event(origin="tasks"))
    await until(lambda: bool(rig.of_type(REPLAY_COMPLETED)))
    report = rig.of_type(REPLAY_COMPLETED)[0]["report"]
    assert sorted(report["replayed"]) == ["tasks/i1@1", "tasks/i2@2"]
    # The re-requested tasks run again: i1 succeeds, i2 dead-letters again.
    await until(
        lambda: bool(rig.of_type(RECORD_SUCCEEDED)) and len(rig.of_type(DEAD_LETTERED)) == 3
    )
    await settle()
    now = await records(rig.stream)
    assert now["tasks/i1@1"].status == "succeeded"
    assert now["tasks/i2@2"].status == "pending"
    assert now["tasks/i2@2"].replays == 1
    assert len(rig.of_type(TASK_SUCCEEDED)) == 1

    # The second replay of i2 fails too and reaches max_attempts=2: abandoned.
    await rig.stream.append(replay_requested_event(record_ids=["tasks/i2@2"]))
    await until(lambda: bool(rig.of_type(RECORD_ABANDONED)))
    await settle()
    now = await records(rig.stream)
    assert now["tasks/i2@2"].status == "abandoned"
    assert now["tasks/i2@2"].replays == 2
    _, dlq_state = await dlq.snapshot()
    assert dlq_state.counts.model_dump() == {
        "pending": 0,
        "replaying": 0,
        "succeeded": 1,
        "abandoned": 1,
        "total": 2,
    }
    _, tasks_state = await tasks.snapshot()
    assert tasks_state.tasks == {}


class RequestedV2(TaskRequested):
    """The next release's task.requested (version 2): a ``priority``, which the state does not
    keep (so a dead-lettered request, rebuilt from the state, carries the default)."""

    priority: int = 0


def tasks_of_the_next_release(**kwargs: Any) -> TasksProcessor:
    events = dict(TASKS_CONTRACT.events or {})
    events[TASK_REQUESTED] = EventDefinition(
        description="run a named task",
        payload_schema=RequestedV2,
        version=2,
        # Marks what it lifted, so a test sees which requests went through it.
        upcasters={1: lambda p: {**p, "priority": 0, "args": {**p.get("args", {}), "v1": True}}},
    )

    class NextTasks(TasksProcessor):
        contract = define_processor_contract(
            slug=TASKS_CONTRACT.slug,
            version=TASKS_CONTRACT.version,
            state_schema=TasksState,
            compact_state=True,
            events=events,
            processor_deps=TASKS_CONTRACT.processor_deps,
            consumes=TASKS_CONTRACT.consumes,
            emits=TASKS_CONTRACT.emits,
        )

    return NextTasks(**kwargs)


async def test_a_record_dead_lettered_by_one_release_replays_through_the_next(rig: Rig) -> None:
    """The replayed request keeps the version it was recorded at; the next release lifts it."""

    async def broken(args: dict[str, Any], ctx: TaskContext) -> str:
        raise RuntimeError("not yet")

    today = rig.start(TasksProcessor(handlers={"invoice": broken}, clock=rig.clock))
    rig.start(DlqProcessor(clock=rig.clock))
    await rig.stream.append(
        task_requested_event(task_id="i1", name="invoice", args={"n": 1}, max_attempts=1)
    )
    await until(lambda: len(rig.of_type(DEAD_LETTERED)) == 1)
    assert rig.of_type(DEAD_LETTERED)[0]["request_version"] == 1
    await today.aclose()
    rig.stream.engines.remove(today)

    seen: list[Any] = []

    async def second_time_lucky(args: dict[str, Any], ctx: TaskContext) -> str:
        seen.append(args)
        if len(seen) == 2:
            raise RuntimeError("not yet")
        return "sent"

    rig.start(tasks_of_the_next_release(handlers={"invoice": second_time_lucky}, clock=rig.clock))
    await rig.stream.append(replay_requested_event(origin="tasks"))
    await until(lambda: bool(rig.of_type(RECORD_SUCCEEDED)))
    replayed = [e for e in rig.stream.events if e.type == TASK_REQUESTED][-1]
    assert replayed.metadata["dlq"]["replay"] == 1
    assert replayed.payload_version == 1  # as recorded: the next release's fold lifted it
    assert seen == [{"n": 1, "v1": True}]
    assert (await records(rig.stream))["tasks/i1@1"].status == "succeeded"

    # A record the next release dead-letters is of its own version, and replays as such
    # (re-appended as version 1, its current-shape payload would be lifted a second time).
    request = task_requested_event(task_id="i2", name="invoice", args={"n": 2}, max_attempts=1)
    request["payload"]["priority"] = 5
    await rig.stream.append({**request, "payload_version": 2})
    await until(lambda: len(rig.of_type(DEAD_LETTERED)) == 2)
    assert rig.of_type(DEAD_LETTERED)[-1]["request_version"] == 2
    await rig.stream.append(
        replay_requested_event(
            record_ids=[
                "tasks/i2@"
                + str([e for e in rig.stream.events if e.type == TASK_REQUESTED][-1].offset)
            ]
        )
    )
    await until(lambda: len(rig.of_type(RECORD_SUCCEEDED)) == 2)
    assert seen[1:] == [{"n": 2}, {"n": 2}]


async def test_replay_pages_through_many_records_with_bounded_state(rig: Rig) -> None:
    """Replaying 1200 records reads the log page by page; the checkpoint does not grow with them."""

    async def ok(rec: DlqRecord, ctx: ReplayContext) -> None:
        return None

    engine = rig.start(DlqProcessor(handlers={"op": ok}, clock=rig.clock))
    for start in range(0, 1200, 300):
        await rig.stream.append(*(record(f"r{i}") for i in range(start, start + 300)))
    await settle()
    _, state = await engine.snapshot()
    assert state.counts.pending == 1200
    small = len(DlqState().model_dump_json())
    assert len(state.model_dump_json()) < small + 200
    reads_before = rig.stream.reads
    await rig.stream.append(replay_requested_event())
    await until(lambda: bool(rig.of_type(REPLAY_COMPLETED)))
    (done,) = rig.of_type(REPLAY_COMPLETED)
    assert done["report"]["counts"]["replayed"] == 1200
    assert len(set(done["report"]["replayed"])) == 1000  # ids capped, counts exact
    assert done["report"]["truncated"] is True
    assert len(rig.of_type(REPLAY_PROGRESS)) >= 3  # progress recorded page by page
    assert rig.stream.reads - reads_before >= 3
    await settle()
    _, state = await engine.snapshot()
    assert state.counts.succeeded == 1200
    assert state.floor == done["request_offset"]
    # A second replay finds nothing above the floor.
    await rig.stream.append(replay_requested_event())
    await until(lambda: len(rig.of_type(REPLAY_COMPLETED)) == 2)
    assert rig.of_type(REPLAY_COMPLETED)[1]["report"]["counts"] == {
        "replayed": 0,
        "retried": 0,
        "abandoned": 0,
        "skipped": 0,
    }


async def test_interrupted_replay_resumes_without_replaying_twice(rig: Rig) -> None:
    """A replay pass cut off by a crash resumes from its progress and re-appends nothing."""
    calls: list[str] = []
    stuck = asyncio.Event()  # never set: the first host's pass stops in its second page

    async def ok(rec: DlqRecord, ctx: ReplayContext) -> None:
        calls.append(rec.record_id)

    async def stops_at_600(rec: DlqRecord, ctx: ReplayContext) -> None:
        if len(calls) >= 600:
            await stuck.wait()
        calls.append(rec.record_id)

    await rig.stream.append(*(record(f"r{i}") for i in range(700)))
    first = rig.start(DlqProcessor(handlers={"op": stops_at_600}, clock=rig.clock))
    await first.catch_up_from_log()
    await rig.stream.append(replay_requested_event())
    # Crash once the first page's progress is written.
    await until(lambda: len(rig.of_type(REPLAY_PROGRESS)) >= 2)
    rig.stream.engines.clear()
    await first.aclose(grace=0)
    done_before = len(calls)
    assert done_before < 700

    second = rig.start(DlqProcessor(handlers={"op": ok}, clock=rig.clock))
    await second.revive()
    await until(lambda: bool(rig.of_type(REPLAY_COMPLETED)))
    (done,) = rig.of_type(REPLAY_COMPLETED)
    assert done["report"]["counts"]["replayed"] == 700
    assert len(rig.of_type(RECORD_SUCCEEDED)) == 700
    assert len(rig.of_type(RECORD_REPLAYING)) == 700
    assert set(calls) == {f"r{i}" for i in range(700)}


async def test_a_dlq_built_with_no_arguments_replays_through_the_stream_it_runs_on(
    rig: Rig,
) -> None:
    """Nothing names the log twice: the DLQ reads and re-appends through args.stream."""
    rig.start(DlqProcessor(clock=rig.clock))
    await rig.stream.append(record("a", request_type="op.requested"), replay_requested_event())
    await until(lambda: bool(rig.of_type(REPLAY_COMPLETED)))
    (done,) = rig.of_type(REPLAY_COMPLETED)
    assert done.get("error") is None
    assert done["report"]["replayed"] == ["a"]
    (replayed,) = [e for e in rig.stream.events if e.type == "op.requested"]
    assert replayed.metadata["dlq"]["record_id"] == "a"


async def test_find_head_and_listing_over_a_real_log(tmp_path: Path) -> None:
    """Over a SQLite log, the head is found in a few reads and records list with their status."""
    async with open_log(tmp_path / "dlq.db") as log:
        stream = log.stream("/")
        assert await find_head(stream) == 0
        await stream.append(*(record(f"r{i}") for i in range(1234)))
        assert await find_head(stream) == 1234
        await stream.append(
            {
                "type": RECORD_REPLAYING,
                "payload": {
                    "record_id": "r5",
                    "replay": 1,
                    "record_offset": 6,
                    "request_offset": 1234,
                },
            }
        )
        listed = await records(stream)
        assert len(listed) == 1234
        assert listed["r5"].status == "replaying"
        pending = await records(stream, status=["pending"])
        assert "r5" not in pending
        assert len(pending) == 1233


def test_replay_queue_is_bounded() -> None:
    """Replay requests past the queue bound are counted as refused, never queued."""
    requests = [replay_requested_event(requested_by=f"u{i}") for i in range(MAX_QUEUED_REPLAYS + 3)]
    state = reduce_processor(DlqProcessor(), requests)
    assert len(state.replays) == MAX_QUEUED_REPLAYS + 1  # the running one and the queue
    assert state.refused_replays == 2


async def test_refused_replay_request_is_answered(rig: Rig) -> None:
    """A request refused because the queue is full still gets its dlq.replay-completed."""
    rig.start(DlqProcessor(clock=rig.clock))
    await rig.stream.append(
        *(replay_requested_event(requested_by=f"u{i}") for i in range(MAX_QUEUED_REPLAYS + 2))
    )
    await until(lambda: len(rig.of_type(REPLAY_COMPLETED)) == MAX_QUEUED_REPLAYS + 2)
    errors = [p.get("error") or "" for p in rig.of_type(REPLAY_COMPLETED)]
    assert sum("already queued" in e for e in errors) == 1

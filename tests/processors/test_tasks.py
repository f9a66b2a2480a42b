"""The tasks processor: durable background tasks with retries, timeouts, cancel and the DLQ."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from streamkit.processors.dlq import (
    DEAD_LETTERED,
    RECORD_SUCCEEDED,
    REPLAY_COMPLETED,
    DlqProcessor,
    replay_requested_event,
)
from streamkit.processors.tasks import (
    TASK_ATTEMPT_FAILED,
    TASK_ATTEMPT_STARTED,
    TASK_CANCELLED,
    TASK_DEAD_LETTERED,
    TASK_REJECTED,
    TASK_SUCCEEDED,
    TaskContext,
    TasksProcessor,
    TasksState,
    cancel_requested_event,
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
from support.daemon import DaemonRig
from support.waits import until

from streamkit import InvalidEvent, ProcessorEngine, ProcessorHost, SharedMap, StreamEvent, open_log
from streamkit.cli import main
from streamkit.config import HostConfig

T0 = 1_700_000_000.0


class Rig:
    """A memory stream, a storage and a clock shared by the engines a test builds."""

    def __init__(self) -> None:
        self.clock = ManualClock(T0)
        self.stream: MemoryStream = memory_stream(clock=self.clock)
        self.storage: MemoryStorage = memory_storage()
        self.engine: ProcessorEngine[TasksState] | None = None

    def start(
        self, processor: TasksProcessor, *, clients_first: Any = None
    ) -> ProcessorEngine[TasksState]:
        """Build an engine for ``processor`` (replacing the previous one) and feed it pushes."""
        self.stream.engines.clear()
        self.engine = ProcessorEngine(
            processor,
            stream=self.stream,
            storage=self.storage,
            clock=self.clock,
            clients_first=clients_first,
        )
        self.stream.engines.append(self.engine)
        return self.engine

    def types(self, task_id: str | None = None) -> list[str]:
        """Event types in the log (for one task id, when given)."""
        return [
            e.type
            for e in self.stream.events
            if task_id is None
            or (isinstance(e.payload, dict) and e.payload.get("task_id") == task_id)
        ]

    def of_type(self, etype: str) -> list[Any]:
        """Payloads of ``etype`` in the log."""
        return [e.payload for e in self.stream.events if e.type == etype]


@pytest.fixture
def rig() -> Iterator[Rig]:
    """A fresh rig, its storage closed afterwards."""
    made = Rig()
    try:
        yield made
    finally:
        made.storage.close()


async def test_task_runs_and_succeeds_then_leaves_state(rig: Rig) -> None:
    """A requested task runs its handler once, records success, and leaves the state."""
    seen: list[tuple[dict[str, Any], TaskContext]] = []

    async def send(args: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        seen.append((args, ctx))
        return {"sent": args["to"]}

    engine = rig.start(TasksProcessor(handlers={"send": send}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="t1", name="send", args={"to": "a@b"}))
    await until(lambda: TASK_SUCCEEDED in rig.types())
    await settle()
    _, state = await engine.snapshot()
    assert state.tasks == {}
    assert state.counts.requested == 1
    assert state.counts.succeeded == 1
    assert rig.types("t1") == ["task.requested", TASK_ATTEMPT_STARTED, TASK_SUCCEEDED]
    assert rig.of_type(TASK_SUCCEEDED)[0]["result"] == {"sent": "a@b"}
    ((args, ctx),) = seen
    assert args == {"to": "a@b"}
    assert ctx.attempt == 1
    assert ctx.idempotency_key == "tasks/run/t1@1"


async def test_a_backlog_beyond_the_concurrency_drains_without_a_revive(rig: Rig) -> None:
    """Each outcome's at-head pass finds its slot free: a backlog never waits for the alarm."""
    ran: list[str] = []

    async def work(args: dict[str, Any], ctx: TaskContext) -> None:
        ran.append(ctx.task_id)

    real_append = rig.stream.append

    async def late_ack(*events: Any, **kwargs: Any) -> Any:
        # As with a real log, a commit may reach the engine before its append returns.
        committed = await real_append(*events, **kwargs)
        await settle()
        return committed

    rig.stream.append = late_ack  # type: ignore[method-assign]
    engine = rig.start(TasksProcessor(handlers={"work": work}, concurrency=2, clock=rig.clock))
    await real_append(*(task_requested_event(task_id=f"t{i}", name="work") for i in range(9)))
    for _ in range(100):
        await settle()
        _, state = await engine.snapshot()
        if state.counts.succeeded == 9:
            break
    assert sorted(ran) == sorted(f"t{i}" for i in range(9))
    assert state.counts.succeeded == 9
    assert not state.tasks


@pytest.mark.speed_trick
async def test_the_attempts_of_one_pass_start_in_one_append(rig: Rig) -> None:
    """One append records every attempt a pass starts, and one their outcomes when they end together."""
    gate = asyncio.Event()

    async def work(args: dict[str, Any], ctx: TaskContext) -> None:
        await gate.wait()

    appends: list[list[str]] = []
    real_append = rig.stream.append

    async def counting_append(*events: Any, **kwargs: Any) -> Any:
        appends.append([e["type"] for e in events])
        return await real_append(*events, **kwargs)

    rig.stream.append = counting_append  # type: ignore[method-assign]
    rig.start(TasksProcessor(handlers={"work": work}, concurrency=8, clock=rig.clock))
    await real_append(*(task_requested_event(task_id=f"t{i}", name="work") for i in range(5)))
    await settle()
    starts = [types for types in appends if TASK_ATTEMPT_STARTED in types]
    assert starts == [[TASK_ATTEMPT_STARTED] * 5]
    gate.set()
    await until(lambda: rig.types().count(TASK_SUCCEEDED) == 5)
    outcomes = [types for types in appends if TASK_SUCCEEDED in types]
    assert outcomes == [[TASK_SUCCEEDED] * 5]


async def test_a_refused_joint_append_appends_each_outcome_alone(rig: Rig) -> None:
    """One outcome already written with another body refuses the joint call: the rest still land."""
    gate = asyncio.Event()

    async def work(args: dict[str, Any], ctx: TaskContext) -> str:
        await gate.wait()
        return "done"

    processor = TasksProcessor(handlers={"work": work}, concurrency=8, clock=rig.clock)
    engine = rig.start(processor)
    await rig.stream.append(*(task_requested_event(task_id=f"t{i}", name="work") for i in range(4)))
    await until(lambda: rig.types().count(TASK_ATTEMPT_STARTED) == 4)
    # Another incarnation got there first for t2 (request at offset 3), with a failure.
    (t2,) = [e for e in rig.stream.events if e.payload.get("task_id") == "t2"][:1]
    await rig.stream.append(
        {
            "type": TASK_ATTEMPT_FAILED,
            "payload": {
                "task_id": "t2",
                "request_offset": t2.offset,
                "attempt": 1,
                "error": "elsewhere",
                "retry_at": T0 + 3600,
            },
            "idempotency_key": processor.idempotency_key(f"t2@{t2.offset}/1/outcome"),
        }
    )
    gate.set()
    await until(lambda: rig.types().count(TASK_SUCCEEDED) == 3)
    await settle()
    assert rig.types("t2") == ["task.requested", TASK_ATTEMPT_STARTED, TASK_ATTEMPT_FAILED]
    assert sorted(p["task_id"] for p in rig.of_type(TASK_SUCCEEDED)) == ["t0", "t1", "t3"]
    _, state = await engine.snapshot()
    assert list(state.tasks) == ["t2"]  # waiting for its retry, the first outcome kept


async def test_freed_slots_are_filled_before_the_outcomes_come_back(rig: Rig) -> None:
    """A slot that frees starts the next waiting task at once, not when its outcome is read back.

    With every push lost after the first pass, no later pass runs: the backlog
    still drains, each finished attempt starting the next from the latest
    at-head pass's state.
    """
    ran: list[str] = []
    gate = asyncio.Event()

    async def work(args: dict[str, Any], ctx: TaskContext) -> None:
        await gate.wait()
        ran.append(ctx.task_id)

    rig.start(TasksProcessor(handlers={"work": work}, concurrency=2, clock=rig.clock))
    await rig.stream.append(*(task_requested_event(task_id=f"t{i}", name="work") for i in range(6)))
    await until(lambda: rig.types().count(TASK_ATTEMPT_STARTED) == 2)
    rig.stream.drop_pushes = True
    gate.set()
    await until(lambda: len(ran) == 6)
    await settle()
    assert sorted(ran) == [f"t{i}" for i in range(6)]
    assert rig.types().count(TASK_ATTEMPT_STARTED) == 6
    assert rig.types().count(TASK_SUCCEEDED) == 6


async def test_no_slot_is_filled_between_passes_while_clients_come_first(rig: Rig) -> None:
    """While the host gives its clients first claim, a freed slot waits for the next pass."""
    ran: list[str] = []
    gate = asyncio.Event()

    async def work(args: dict[str, Any], ctx: TaskContext) -> None:
        await gate.wait()
        ran.append(ctx.task_id)

    clients = [False]
    rig.start(
        TasksProcessor(handlers={"work": work}, concurrency=2, clock=rig.clock),
        clients_first=lambda: clients[0],
    )
    await rig.stream.append(*(task_requested_event(task_id=f"t{i}", name="work") for i in range(6)))
    await until(lambda: rig.types().count(TASK_ATTEMPT_STARTED) == 2)
    rig.stream.drop_pushes = True
    clients[0] = True
    gate.set()
    await until(lambda: len(ran) == 2)
    await settle()
    assert sorted(ran) == ["t0", "t1"]
    assert rig.types().count(TASK_ATTEMPT_STARTED) == 2


async def test_a_freed_slot_starts_no_task_before_it_is_due(rig: Rig) -> None:
    """Filling a slot starts only due tasks: one not due yet waits for its wakeup's pass."""
    ran: list[str] = []

    gate = asyncio.Event()

    async def work(args: dict[str, Any], ctx: TaskContext) -> None:
        await gate.wait()
        ran.append(ctx.task_id)

    engine = rig.start(TasksProcessor(handlers={"work": work}, concurrency=1, clock=rig.clock))
    await rig.stream.append(
        task_requested_event(task_id="now", name="work"),
        task_requested_event(task_id="later", name="work", not_before=T0 + 60),
    )
    await until(lambda: rig.types().count(TASK_ATTEMPT_STARTED) == 1)
    rig.stream.drop_pushes = True
    gate.set()
    await until(lambda: ran == ["now"])
    await settle()
    assert ran == ["now"]
    assert rig.types("later") == ["task.requested"]
    rig.stream.drop_pushes = False
    rig.clock.advance(61)
    await engine.revive()
    await until(lambda: ran == ["now", "later"])


async def test_an_attempt_that_fails_to_record_does_not_end_its_batchmates_claim(
    rig: Rig,
) -> None:
    """Attempts started together stay in flight (and claimed) until the last one settles."""
    gate = asyncio.Event()

    async def work(args: dict[str, Any], ctx: TaskContext) -> None:
        if ctx.task_id == "slow":
            await gate.wait()

    real_append = rig.stream.append

    async def failing_append(*events: Any, **kwargs: Any) -> Any:
        if any(e["type"] == TASK_SUCCEEDED and e["payload"]["task_id"] == "fast" for e in events):
            raise OSError("disk full")
        return await real_append(*events, **kwargs)

    rig.stream.append = failing_append  # type: ignore[method-assign]
    engine = rig.start(TasksProcessor(handlers={"work": work}, clock=rig.clock))
    await real_append(
        task_requested_event(task_id="fast", name="work"),
        task_requested_event(task_id="slow", name="work"),
    )
    await settle()
    assert engine.statistics().background_in_flight == 1  # the slow attempt still runs
    gate.set()
    await settle()
    assert engine.statistics().background_in_flight == 0
    assert rig.types("slow").count(TASK_SUCCEEDED) == 1


async def test_failures_retry_with_backoff_through_wakeups(rig: Rig) -> None:
    """A failing attempt schedules its retry as a wakeup; advancing the clock and reviving runs it."""
    calls: list[int] = []

    async def flaky(args: dict[str, Any], ctx: TaskContext) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError(f"boom {ctx.attempt}")
        return "ok"

    processor = TasksProcessor(handlers={"flaky": flaky}, backoff_base=10.0, clock=rig.clock)
    engine = rig.start(processor)
    await rig.stream.append(task_requested_event(task_id="t", name="flaky"))
    await until(lambda: len(rig.of_type(TASK_ATTEMPT_FAILED)) == 1)
    await settle()
    (failed,) = rig.of_type(TASK_ATTEMPT_FAILED)
    assert failed["error"] == "RuntimeError: boom 1"
    delay = processor.retry_delay("t", 1, 1)
    assert 10.0 <= delay <= 12.5
    assert failed["retry_at"] == pytest.approx(T0 + delay)
    await until(lambda: engine.statistics().claimed_at == failed["retry_at"])
    # Not due yet: a revive now starts nothing.
    await engine.revive()
    await settle()
    assert calls == [1]
    rig.clock.now = failed["retry_at"]
    await engine.revive()
    await until(lambda: len(rig.of_type(TASK_ATTEMPT_FAILED)) == 2)
    await settle()
    second = rig.of_type(TASK_ATTEMPT_FAILED)[1]
    # Exponential: the second wait is about twice the first.
    assert second["retry_at"] - failed["retry_at"] == pytest.approx(
        processor.retry_delay("t", 1, 2)
    )
    assert 20.0 <= processor.retry_delay("t", 1, 2) <= 25.0
    rig.clock.now = second["retry_at"]
    await engine.revive()
    await until(lambda: TASK_SUCCEEDED in rig.types())
    assert calls == [1, 2, 3]
    await settle()
    _, state = await engine.snapshot()
    assert state.tasks == {}
    assert state.counts.failed_attempts == 2
    assert state.counts.attempts == 3


async def test_not_before_waits_for_its_wakeup(rig: Rig) -> None:
    """A task with not_before in the future asks for a wakeup then and runs only after it."""
    ran: list[int] = []

    async def job(args: dict[str, Any], ctx: TaskContext) -> None:
        ran.append(ctx.attempt)

    engine = rig.start(TasksProcessor(handlers={"job": job}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="later", name="job", not_before=T0 + 60))
    await until(lambda: engine.statistics().claimed_at == T0 + 60)
    assert ran == []
    rig.clock.now = T0 + 60
    await engine.revive()
    await until(lambda: TASK_SUCCEEDED in rig.types())
    assert ran == [1]


async def test_timeout_fails_the_attempt(rig: Rig) -> None:
    """A handler that outlives timeout_s is cancelled and its attempt recorded as timed out."""
    cancelled = asyncio.Event()

    async def slow(args: dict[str, Any], ctx: TaskContext) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    rig.start(TasksProcessor(handlers={"slow": slow}, clock=rig.clock))
    await rig.stream.append(
        task_requested_event(task_id="t", name="slow", timeout_s=0.05, max_attempts=2)
    )
    await until(lambda: bool(rig.of_type(TASK_ATTEMPT_FAILED)))
    assert cancelled.is_set()
    assert rig.of_type(TASK_ATTEMPT_FAILED)[0]["error"] == "timed out after 0.05 s"


async def test_a_handler_that_blocks_the_loop_past_its_timeout_is_failed_and_retried(
    rig: Rig,
) -> None:
    """An async handler holding the loop past timeout_s: its attempt fails as timed out, retried."""
    runs: list[int] = []

    async def blocking(args: dict[str, Any], ctx: TaskContext) -> str:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            time.sleep(0.2)  # noqa: ASYNC251 - the blocking handler this test is about
        return "done"

    engine = rig.start(TasksProcessor(handlers={"blocking": blocking}, clock=rig.clock))
    await rig.stream.append(
        task_requested_event(task_id="t", name="blocking", timeout_s=0.05, max_attempts=3)
    )
    await until(lambda: bool(rig.of_type(TASK_ATTEMPT_FAILED)))
    assert rig.of_type(TASK_ATTEMPT_FAILED)[0]["error"] == "timed out after 0.05 s"
    rig.clock.now += 3600  # past any backoff: the retry is due, and the alarm revives
    await engine.revive()
    await until(lambda: TASK_SUCCEEDED in rig.types())
    assert runs[:2] == [1, 2]


async def test_last_failure_dead_letters_into_the_dlq(rig: Rig) -> None:
    """Failing every attempt dead-letters the task and appends a dlq.dead-lettered record."""

    async def broken(args: dict[str, Any], ctx: TaskContext) -> None:
        raise ValueError("bad input")

    engine = rig.start(TasksProcessor(handlers={"broken": broken}, clock=rig.clock))
    await rig.stream.append(
        task_requested_event(task_id="t", name="broken", args={"x": 1}, max_attempts=1)
    )
    await until(lambda: TASK_DEAD_LETTERED in rig.types())
    (dead,) = rig.of_type(TASK_DEAD_LETTERED)
    assert dead["attempts"] == 1
    assert "ValueError: bad input" in dead["error"]
    (record,) = rig.of_type(DEAD_LETTERED)
    assert record["record_id"] == "tasks/t@1"
    assert record["origin"] == "tasks"
    assert record["operation"] == "broken"
    assert record["request_type"] == "task.requested"
    assert record["payload"]["args"] == {"x": 1}
    assert record["payload"]["task_id"] == "t"
    await settle()
    _, state = await engine.snapshot()
    assert state.tasks == {}
    assert state.counts.dead_lettered == 1


async def test_a_handler_failure_keeps_its_traceback_in_the_event_the_dlq_and_the_log(
    rig: Rig,
) -> None:
    """A raising handler's attempt-failed event, its dead-letter and the DLQ record keep a
    bounded traceback excerpt naming the handler's line, without locals; the host's log
    gets one task.attempt_failed line per failed attempt, with the exception."""

    async def broken(args: dict[str, Any], ctx: TaskContext) -> None:
        api_key = "sk-live-do-not-keep"
        raise ValueError(f"bad input ({len(api_key)})")

    rig.start(TasksProcessor(handlers={"broken": broken}, clock=rig.clock, backoff_base=0.0))
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(task_requested_event(task_id="t", name="broken", max_attempts=2))
        await until(lambda: len(rig.of_type(TASK_ATTEMPT_FAILED)) == 1)
        rig.clock.now = rig.of_type(TASK_ATTEMPT_FAILED)[0]["retry_at"]
        assert rig.engine is not None
        await rig.engine.revive()
        await until(lambda: TASK_DEAD_LETTERED in rig.types())
    (failed,) = rig.of_type(TASK_ATTEMPT_FAILED)
    (dead,) = rig.of_type(TASK_DEAD_LETTERED)
    (record,) = rig.of_type(DEAD_LETTERED)
    for kept in (failed["traceback"], dead["traceback"], record["traceback"]):
        assert 'raise ValueError(f"bad input ({len(api_key)})")' in kept
        assert kept.rstrip().endswith("ValueError: bad input (19)")
        assert "sk-live-do-not-keep" not in kept
        assert len(kept.encode()) <= 8192
    lines = [e for e in logs if e["event"] == "task.attempt_failed"]
    assert [(e["task_id"], e["attempt"]) for e in lines] == [("t", 1), ("t", 2)]
    assert all(isinstance(e["exc_info"], ValueError) for e in lines)


async def test_unknown_handler_dead_letters_without_an_attempt(rig: Rig) -> None:
    """A task naming no registered handler is dead-lettered at once, never retried."""

    async def send_invoice(args: dict[str, Any], ctx: TaskContext) -> None:
        return None

    rig.start(TasksProcessor(handlers={"send-invoice": send_invoice}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="t", name="send-invoce", max_attempts=5))
    await until(lambda: TASK_DEAD_LETTERED in rig.types())
    await settle()
    assert rig.types() == ["task.requested", TASK_DEAD_LETTERED, DEAD_LETTERED]
    (dead,) = rig.of_type(TASK_DEAD_LETTERED)
    assert dead["attempts"] == 0
    assert (
        'no handler is registered for task name "send-invoce" (did you mean '
        "'send-invoice'? registered: send-invoice)"
    ) in dead["error"]


async def test_crash_mid_attempt_is_counted_failed_and_retried(rig: Rig) -> None:
    """An attempt started by a host that died is failed by the next engine's revive, then retried."""
    hang = asyncio.Event()

    async def stuck(args: dict[str, Any], ctx: TaskContext) -> None:
        await hang.wait()

    first = rig.start(TasksProcessor(handlers={"job": stuck}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="t", name="job"))
    await until(lambda: TASK_ATTEMPT_STARTED in rig.types())
    await settle()
    assert first.statistics().claimed_at is not None  # the in-flight attempt holds a revive claim
    # The host dies: its engine stops getting pushes and its attempt is abandoned.
    rig.stream.engines.clear()
    await first.aclose(grace=0)

    runs: list[int] = []

    async def works(args: dict[str, Any], ctx: TaskContext) -> str:
        runs.append(ctx.attempt)
        return "done"

    second = rig.start(TasksProcessor(handlers={"job": works}, clock=rig.clock))
    await second.revive()
    await until(lambda: bool(rig.of_type(TASK_ATTEMPT_FAILED)))
    (failed,) = rig.of_type(TASK_ATTEMPT_FAILED)
    assert failed["attempt"] == 1
    assert "interrupted" in failed["error"]
    await settle()
    assert runs == []
    rig.clock.now = failed["retry_at"]
    await second.revive()
    await until(lambda: TASK_SUCCEEDED in rig.types())
    assert runs == [2]
    assert rig.types("t") == [
        "task.requested",
        TASK_ATTEMPT_STARTED,
        TASK_ATTEMPT_FAILED,
        TASK_ATTEMPT_STARTED,
        TASK_SUCCEEDED,
    ]


async def test_cancel_stops_an_attempt_in_flight(rig: Rig) -> None:
    """Cancelling a running task cancels its handler and records task.cancelled once."""
    stopped = asyncio.Event()

    async def long(args: dict[str, Any], ctx: TaskContext) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise

    engine = rig.start(TasksProcessor(handlers={"long": long}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="t", name="long"))
    await until(lambda: TASK_ATTEMPT_STARTED in rig.types())
    await rig.stream.append(cancel_requested_event("t", reason="user asked", requested_by="ann"))
    await until(lambda: TASK_CANCELLED in rig.types())
    await settle()
    assert stopped.is_set()
    (cancelled,) = rig.of_type(TASK_CANCELLED)
    assert cancelled["reason"] == "user asked"
    assert cancelled["attempts"] == 1
    assert TASK_ATTEMPT_FAILED not in rig.types()
    _, state = await engine.snapshot()
    assert state.tasks == {}
    assert state.counts.cancelled == 1


async def test_a_cancel_between_an_attempt_s_start_and_its_handler_call_stops_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel read after ``task.attempt-started`` committed but before the attempt's
    coroutine called the handler (a busy loop runs other work in between) cancels the
    handler at its call, not after it ran to its end."""
    gate = asyncio.Event()
    attempt = TasksProcessor._attempt

    async def gated(self: TasksProcessor, *args: Any) -> None:
        await gate.wait()
        await attempt(self, *args)

    monkeypatch.setattr(TasksProcessor, "_attempt", gated)
    ran: list[str] = []

    async def long(args: dict[str, Any], ctx: TaskContext) -> None:
        ran.append(ctx.task_id)
        await asyncio.sleep(30)

    engine = rig.start(TasksProcessor(handlers={"long": long}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="t", name="long"))
    await until(lambda: TASK_ATTEMPT_STARTED in rig.types())
    await rig.stream.append(cancel_requested_event("t", reason="user asked", requested_by="ann"))

    async def cancel_read() -> bool:
        _, state = await engine.snapshot()
        task = state.tasks.get("t")
        return task is not None and task.cancel_requested

    await until(cancel_read)
    gate.set()
    await until(lambda: TASK_CANCELLED in rig.types(), within=10)
    (cancelled,) = rig.of_type(TASK_CANCELLED)
    assert (cancelled["reason"], cancelled["attempts"]) == ("user asked", 1)
    assert ran == []  # cancelled at its call: the handler never began
    assert TASK_SUCCEEDED not in rig.types()


async def test_cancel_of_waiting_task_and_of_unknown_task(rig: Rig) -> None:
    """A scheduled task is cancelled without running; cancelling an unknown id is rejected."""
    ran: list[int] = []

    async def job(args: dict[str, Any], ctx: TaskContext) -> None:
        ran.append(1)

    rig.start(TasksProcessor(handlers={"job": job}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="t", name="job", not_before=T0 + 100))
    await rig.stream.append(cancel_requested_event("t"))
    await rig.stream.append(cancel_requested_event("ghost"))
    await until(lambda: TASK_CANCELLED in rig.types() and TASK_REJECTED in rig.types())
    rig.clock.now = T0 + 200
    await settle()
    assert ran == []
    (rejected,) = rig.of_type(TASK_REJECTED)
    assert rejected["task_id"] == "ghost"
    assert "no live task" in rejected["reason"]


async def test_duplicate_live_id_is_rejected_and_the_live_run_untouched(rig: Rig) -> None:
    """A second request for a live task id is rejected; the first run goes on unchanged."""
    release = asyncio.Event()

    async def job(args: dict[str, Any], ctx: TaskContext) -> int:
        await release.wait()
        return args["n"]

    engine = rig.start(TasksProcessor(handlers={"job": job}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="t", name="job", args={"n": 1}))
    await rig.stream.append(
        task_requested_event(task_id="t", name="job", args={"n": 2}, idempotency_key="again")
    )
    await until(lambda: TASK_REJECTED in rig.types())
    release.set()
    await until(lambda: TASK_SUCCEEDED in rig.types())
    assert rig.of_type(TASK_SUCCEEDED)[0]["result"] == 1
    await settle()
    _, state = await engine.snapshot()
    assert state.counts.rejected == 1
    assert state.counts.requested == 1


async def test_outcomes_are_idempotent_under_redelivery(rig: Rig) -> None:
    """Re-delivering the events to a fresh engine from offset 0 appends no second outcome."""

    async def job(args: dict[str, Any], ctx: TaskContext) -> str:
        return "ok"

    rig.start(TasksProcessor(handlers={"job": job}, clock=rig.clock))
    await rig.stream.append(task_requested_event(task_id="t", name="job"))
    await until(lambda: TASK_SUCCEEDED in rig.types())
    await settle()
    before = list(rig.stream.events)
    # A new engine over fresh storage re-reduces everything and runs the at-head
    # pass: the task is already settled in the log, so nothing is appended.
    with memory_storage() as storage:
        again = ProcessorEngine(
            TasksProcessor(handlers={"job": job}, clock=rig.clock),
            stream=rig.stream,
            storage=storage,
            clock=rig.clock,
        )
        await again.catch_up_from_log()
        await settle()
        assert rig.stream.events == before
        # The same outcome appended again by a retried batch returns the first event.
        (succeeded,) = [e for e in before if e.type == TASK_SUCCEEDED]
        (same,) = await rig.stream.append(
            {
                "type": TASK_SUCCEEDED,
                "payload": succeeded.payload,
                "idempotency_key": "tasks/t@1/1/outcome",
            }
        )
        assert same.offset == succeeded.offset
        # A different outcome for the same attempt is refused by the log.
        with pytest.raises(Exception, match="idempotency key"):
            await rig.stream.append(
                {
                    "type": TASK_ATTEMPT_FAILED,
                    "payload": {
                        "task_id": "t",
                        "request_offset": 1,
                        "attempt": 1,
                        "error": "late",
                        "retry_at": T0,
                    },
                    "idempotency_key": "tasks/t@1/1/outcome",
                }
            )


def test_reduce_keeps_only_live_tasks_and_counters() -> None:
    """The pure reduce drops a task when it settles and never keeps its history."""
    events = [
        task_requested_event(task_id="a", name="job"),
        task_requested_event(task_id="b", name="job"),
        {
            "type": TASK_ATTEMPT_STARTED,
            "payload": {"task_id": "a", "request_offset": 1, "attempt": 1, "started_at": T0},
        },
        {
            "type": TASK_SUCCEEDED,
            "payload": {"task_id": "a", "request_offset": 1, "attempt": 1, "result": None},
        },
        # An outcome of a run that is not live changes nothing.
        {
            "type": TASK_SUCCEEDED,
            "payload": {"task_id": "b", "request_offset": 99, "attempt": 1, "result": None},
        },
    ]
    state = reduce_processor(TasksProcessor(), events)
    assert list(state.tasks) == ["b"]
    assert state.counts.requested == 2
    assert state.counts.succeeded == 1
    assert state.counts.attempts == 1


def test_retention_keeps_the_request_of_the_oldest_open_task() -> None:
    """retain_from: the oldest unsettled request's offset; nothing once every task settled."""
    tasks = TasksProcessor()
    first = task_requested_event(task_id="a", name="job")
    second = task_requested_event(task_id="b", name="job")
    assert tasks.retain_from(reduce_processor(tasks, [first, second])) == 1
    settled = {
        "type": TASK_SUCCEEDED,
        "payload": {"task_id": "a", "request_offset": 1, "attempt": 1, "result": None},
    }
    assert tasks.retain_from(reduce_processor(tasks, [first, second, settled])) == 2
    both = {**settled, "payload": {**settled["payload"], "task_id": "b", "request_offset": 2}}
    assert tasks.retain_from(reduce_processor(tasks, [first, second, settled, both])) is None


def test_bad_requests_are_refused_by_the_helper_and_skipped_by_the_reduce() -> None:
    """Unknown fields or a bad max_attempts are refused at the helper and skipped by the engine."""
    with pytest.raises(InvalidEvent, match="max_attempts"):
        task_requested_event(task_id="t", name="job", max_attempts=0)
    state = reduce_processor(
        TasksProcessor(),
        [
            {"type": "task.requested", "payload": {"task_id": "t", "name": "j", "colour": "red"}},
            {
                "type": "task.requested",
                "payload": {"task_id": "u", "name": "j", "max_attempts": -1},
            },
            task_requested_event(task_id="ok", name="j"),
        ],
    )
    assert list(state.tasks) == ["ok"]


async def _wait(predicate: Any, within: float = 10.0) -> None:
    """Poll the async ``predicate`` until it holds."""
    for _ in range(int(within / 0.01)):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


async def test_tasks_and_dlq_over_a_real_log_through_the_host(tmp_path: Path) -> None:
    """Through ProcessorHost on SQLite: tasks settle, a failure is replayed, and a restart keeps it."""
    db = tmp_path / "tasks.db"
    config = HostConfig.model_validate(
        {"db": str(db), "lease": {"ttl": 5.0, "heartbeat": 0.05}, "shutdown_grace": 1.0}
    )
    healed = {"yes": False}

    async def charge(args: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        if args["amount"] < 0 and not healed["yes"]:
            raise ValueError("negative amount")
        return {"charged": args["amount"]}

    def build() -> ProcessorHost:
        return ProcessorHost(
            config,
            processors=[
                TasksProcessor(handlers={"charge": charge}),
                DlqProcessor(),
            ],
            serve_control=False,
        )

    async def events_of(etype: str) -> list[Any]:
        async with open_log(db) as log:
            page = await log.stream("/").read(0, 1000)
        return [e.payload for e in page.events if e.type == etype]

    async def has(etype: str) -> bool:
        return bool(await events_of(etype))

    host = build()
    await host.start()
    try:
        async with open_log(db) as log:
            await log.stream("/").append(
                task_requested_event(task_id="ok", name="charge", args={"amount": 5}),
                task_requested_event(
                    task_id="bad", name="charge", args={"amount": -1}, max_attempts=1
                ),
            )
        await _wait(lambda: has(TASK_SUCCEEDED))
        await _wait(lambda: has(DEAD_LETTERED))
    finally:
        await host.stop()

    healed["yes"] = True
    host = build()
    await host.start()
    try:
        async with open_log(db) as log:
            await log.stream("/").append(replay_requested_event(requested_by="test"))
        await _wait(lambda: has(REPLAY_COMPLETED))
        await _wait(lambda: has(RECORD_SUCCEEDED))
        # The log has the outcome; let each processor reduce through it before reading.
        async with open_log(db) as log:
            head = await log.stream("/").head()
        await host.wait_until_processed("tasks", head)
        await host.wait_until_processed("dlq", head)
        snapshot = await host.snapshot("tasks")
        assert snapshot["state"]["tasks"] == {}
        assert snapshot["state"]["counts"]["succeeded"] == 2
        assert snapshot["state"]["counts"]["dead_lettered"] == 1
        dlq = await host.snapshot("dlq")
        assert dlq["state"]["counts"]["succeeded"] == 1
        (completed,) = await events_of(REPLAY_COMPLETED)
        assert completed["report"]["replayed"] == ["tasks/bad@2"]
    finally:
        await host.stop()


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


async def test_outcomes_ride_group_commits_in_a_host(tmp_path: Path) -> None:
    """50 tasks make 150 events; one transaction per outcome would take 100 or more."""

    async def noop(args: dict[str, Any], ctx: TaskContext) -> None:
        return None

    config = HostConfig.model_validate({"db": str(tmp_path / "g.db"), "shutdown_grace": 0.5})
    host = ProcessorHost(
        config,
        processors=[TasksProcessor(handlers={"noop": noop}, concurrency=64)],
        serve_control=False,
    )
    await host.start()
    try:
        assert host.log is not None
        before = host.log.stats
        await host.append(
            "/", [task_requested_event(task_id=f"t{i}", name="noop") for i in range(50)]
        )

        async def all_succeeded() -> bool:
            return bool((await host.snapshot("tasks"))["state"]["counts"]["succeeded"] == 50)

        await _wait(all_succeeded)
        after = host.log.stats
        assert after.appended - before.appended == 150
        assert after.transactions - before.transactions < 50
    finally:
        await host.stop()


async def test_cli_tasks_list_shows_live_tasks_in_request_order() -> None:
    """The state keeps its live tasks in a SharedMap's order; the listing is in request order."""
    ids = [f"job-{i}" for i in range(12)]
    assert list(SharedMap(dict.fromkeys(ids, 0))) != ids
    short = Path(tempfile.mkdtemp(dir="/tmp", prefix="skt"))
    db = str(short / "t.db")
    config = HostConfig.model_validate({"db": db, "shutdown_grace": 0.5})
    gate = asyncio.Event()

    async def wait_for_gate(args: dict[str, Any], ctx: TaskContext) -> None:
        await gate.wait()

    host = ProcessorHost(
        config, processors=[TasksProcessor(handlers={"wait": wait_for_gate}, concurrency=1)]
    )
    await host.start()
    try:
        await host.append("/", [task_requested_event(task_id=i, name="wait") for i in ids])
        listed: list[str] = []

        async def all_listed() -> bool:
            code, text = await asyncio.to_thread(_cli, "tasks", "list", "--db", db, "--json")
            assert code == 0
            listed[:] = [t["task_id"] for t in json.loads(text)["tasks"]]
            return len(listed) == len(ids)

        await _wait(all_listed)
        assert listed == ids
        code, text = await asyncio.to_thread(_cli, "tasks", "list", "--db", db)
        assert code == 0
        assert [line.split()[0] for line in text.splitlines()[1:]] == ids
    finally:
        gate.set()
        await host.stop()


def _held_tasks_host(db: str, gate: asyncio.Event) -> ProcessorHost:
    """A host of the tasks processor on ``db`` whose ``held`` handler waits for ``gate``."""

    async def held(args: dict[str, Any], ctx: TaskContext) -> None:
        await gate.wait()

    config = HostConfig.model_validate({"db": db, "shutdown_grace": 0.5})
    return ProcessorHost(
        config,
        processors=[TasksProcessor(handlers={"held": held}, concurrency=1)],
        serve_control=False,
    )


async def test_cli_tasks_read_the_checkpoint_whole_when_no_host_runs(tmp_path: Path) -> None:
    """With the host stopped, `tasks list` and `tasks show` restore the checkpoint through its model.

    The checkpoint leaves out fields at their defaults (``max_attempts`` of 5, say); a
    reader of its raw JSON failed with ``KeyError: 'max_attempts'`` exactly when an
    operator needs it: no host running.
    """
    db = str(tmp_path / "c.db")
    gate = asyncio.Event()
    host = _held_tasks_host(db, gate)
    await host.start()
    try:
        committed = await host.append(
            "/", [task_requested_event(task_id=i, name="held") for i in ("a", "b")]
        )
        await host.wait_until_processed("tasks", committed[-1].offset, timeout=10)
    finally:
        await host.stop()  # the attempt in flight is abandoned: its task stays live
        gate.set()
    code, text = await asyncio.to_thread(_cli, "tasks", "list", "--db", db)
    assert code == 0, text
    assert "2 live task(s)" in text
    assert [line.split()[:4] for line in text.splitlines()[1:]][1] == [
        "b",
        "held",
        "attempt",
        "0/5",
    ]
    code, text = await asyncio.to_thread(_cli, "tasks", "list", "--db", db, "--json")
    assert code == 0
    listed = json.loads(text)["tasks"]
    assert [t["max_attempts"] for t in listed] == [5, 5]
    code, text = await asyncio.to_thread(_cli, "tasks", "show", "b", "--db", db, "--json")
    assert code == 0, text
    assert json.loads(text)["live"]["max_attempts"] == 5


async def test_a_host_that_does_not_run_the_tasks_shows_their_checkpoint_whole(
    tmp_path: Path,
) -> None:
    """A second host (the lease is the first's) answers snapshot from the checkpoint, restored
    through the processor's model: fields at their defaults are there too."""
    db = str(tmp_path / "two.db")
    gate = asyncio.Event()
    first, second = _held_tasks_host(db, gate), _held_tasks_host(db, gate)
    await first.start()
    try:
        (event,) = await first.append("/", [task_requested_event(task_id="a", name="held")])
        await first.wait_until_processed("tasks", event.offset, timeout=10)
        await second.start()
        try:
            assert second.runner("tasks").engine is None  # the first host holds the lease
            snapshot = await second.snapshot("tasks")
            assert snapshot["source"] == "checkpoint"
            assert snapshot["state"]["tasks"]["a"]["max_attempts"] == 5
        finally:
            await second.stop()
    finally:
        gate.set()
        await first.stop()


async def test_cli_tasks_and_dlq_through_a_running_host() -> None:
    """`streamkit tasks list|show|cancel` and `dlq list|show|replay` work through the host's socket."""
    short = Path(tempfile.mkdtemp(dir="/tmp", prefix="skt"))
    db = str(short / "t.db")
    config = HostConfig.model_validate(
        {"db": db, "lease": {"ttl": 5.0, "heartbeat": 0.05}, "shutdown_grace": 0.5}
    )
    gate = asyncio.Event()

    async def wait_for_gate(args: dict[str, Any], ctx: TaskContext) -> None:
        await gate.wait()

    async def explode(args: dict[str, Any], ctx: TaskContext) -> None:
        raise RuntimeError("kaboom")

    host = ProcessorHost(
        config,
        processors=[
            TasksProcessor(handlers={"wait": wait_for_gate, "explode": explode}),
            DlqProcessor(),
        ],
    )
    await host.start()
    try:
        await host.append(
            "/",
            [
                task_requested_event(task_id="slow", name="wait"),
                task_requested_event(task_id="boom", name="explode", max_attempts=1),
            ],
        )

        async def listed() -> dict[str, Any]:
            code, text = await asyncio.to_thread(_cli, "tasks", "list", "--db", db, "--json")
            assert code == 0
            return dict(json.loads(text))

        async def slow_running() -> bool:
            tasks = (await listed())["tasks"]
            return [t["task_id"] for t in tasks] == ["slow"] and tasks[0]["running"]

        await _wait(slow_running)
        code, text = await asyncio.to_thread(_cli, "tasks", "list", "--db", db)
        assert code == 0
        assert "1 live task(s)" in text
        assert "slow  wait  attempt 1/5  running" in text

        code, text = await asyncio.to_thread(
            _cli, "tasks", "cancel", "slow", "--db", db, "--reason", "no longer needed"
        )
        assert code == 0
        assert text.startswith("cancel requested for task slow")

        async def slow_gone() -> bool:
            return (await listed())["tasks"] == []

        await _wait(slow_gone)
        code, text = await asyncio.to_thread(_cli, "tasks", "show", "slow", "--db", db)
        assert code == 0
        assert text.splitlines()[0] == "task slow: not live"
        assert "task.cancelled" in text

        code, text = await asyncio.to_thread(_cli, "dlq", "list", "--db", db, "--json")
        assert code == 0
        (record,) = [json.loads(line) for line in text.splitlines()]
        assert record["record_id"] == "tasks/boom@2"
        assert record["status"] == "pending"
        code, text = await asyncio.to_thread(_cli, "dlq", "show", "tasks/boom@2", "--db", db)
        assert code == 0
        assert "RuntimeError: kaboom" in text

        code, text = await asyncio.to_thread(
            _cli, "dlq", "replay", "--db", db, "--operation", "explode", "--wait", "--json"
        )
        assert code == 0
        report = json.loads(text)["report"]
        assert report["replayed"] == ["tasks/boom@2"]
    finally:
        gate.set()
        await host.stop(grace=0.0)
        shutil.rmtree(short, ignore_errors=True)


_TASK_MODULE = """
import asyncio
import os
from pathlib import Path


async def job(args, ctx):
    Path(os.environ["TASKS_MARKS"], f"attempt-{ctx.attempt}").write_text(ctx.idempotency_key)
    if ctx.attempt == 1:
        await asyncio.sleep(3600)  # the host is killed while this runs
    return {"done": args["n"]}
"""


def _start_host(rig: DaemonRig, db: Path) -> subprocess.Popen[bytes]:
    processor = (
        "streamkit.processors.tasks:TasksProcessor"
        '{"handlers": {"job": "taskjobs:job"}, "backoff_base": 0.2}'
    )
    argv = ["--db", str(db), "--lease-ttl", "1", "--log-format", "json", "--processor", processor]
    return rig.start_host("h", *argv, log="host")


@pytest.mark.slow
async def test_kill_9_mid_attempt_then_restart_retries_the_task(tmp_path: Path) -> None:
    """A `streamkit host` killed with SIGKILL mid-attempt: the next host fails that attempt, retries."""
    (tmp_path / "taskjobs.py").write_text(_TASK_MODULE)
    marks = tmp_path / "marks"
    marks.mkdir()
    rig = DaemonRig(
        tmp_path, socket_prefix="skk", tmp_on_pythonpath=True, extra_env={"TASKS_MARKS": str(marks)}
    )
    db = tmp_path / "k.db"
    try:
        first = _start_host(rig, db)
        async with open_log(db) as log:
            await log.stream("/").append(
                task_requested_event(task_id="k1", name="job", args={"n": 7})
            )
        for _ in range(3000):
            if (marks / "attempt-1").exists():
                break
            await asyncio.sleep(0.01)
        assert (marks / "attempt-1").exists(), (tmp_path / "host.log").read_text()
        first.send_signal(signal.SIGKILL)
        first.wait()

        _start_host(rig, db)

        async def settled() -> bool:
            async with open_log(db) as log:
                page = await log.stream("/").read(0, 1000)
            return any(e.type == TASK_SUCCEEDED for e in page.events)

        await _wait(settled, within=30)
        async with open_log(db) as log:
            page = await log.stream("/").read(0, 1000)
        story = [
            (e.type, e.to_dict()["payload"]) for e in page.events if e.type.startswith("task.")
        ]
        assert [t for t, _ in story] == [
            "task.requested",
            TASK_ATTEMPT_STARTED,
            TASK_ATTEMPT_FAILED,
            TASK_ATTEMPT_STARTED,
            TASK_SUCCEEDED,
        ]
        assert "attempt 1 was interrupted" in story[2][1]["error"]
        assert story[4][1]["result"] == {"done": 7}
        # Both attempts saw the same idempotency key: the handler can dedupe its side effect.
        assert (marks / "attempt-1").read_text() == (marks / "attempt-2").read_text()
    finally:
        rig.close()


async def test_a_backlog_of_ten_thousand_tasks_checkpoints_under_the_ceiling(rig: Rig) -> None:
    """10,000 waiting tasks fit one checkpoint (written compact) and restore as they were."""
    engine = rig.start(TasksProcessor(handlers={"work": _never}, clock=rig.clock))
    later = T0 + 3600
    for start in range(0, 10_000, 500):
        await rig.stream.append(
            *(
                task_requested_event(task_id=f"t{i}", name="work", not_before=later)
                for i in range(start, start + 500)
            )
        )
    await engine.wait_until_processed(rig.stream.head)
    assert engine.latched_error is None
    _, state = await engine.snapshot()
    assert len(state.tasks) == 10_000
    await engine.aclose()  # writes the state whole, whatever the last batches deferred
    checkpoint = rig.storage.read("tasks")
    assert checkpoint.reduced_through_offset == engine.cursor >= rig.stream.head
    assert checkpoint.state_offset is None
    assert len(checkpoint.state_json) < 1024 * 1024
    assert TasksState.model_validate_json(checkpoint.state_json) == state


async def _never(args: dict[str, Any], ctx: TaskContext) -> None:
    raise AssertionError("a task due in an hour ran now")


_EXITING_MODULE = """
import asyncio
import sys


async def exits(args, ctx):
    sys.exit(3)


async def interrupts(args, ctx):
    raise KeyboardInterrupt


async def exits_later(args, ctx):  # after a wait: from a later step of its task
    await asyncio.sleep(0.01)
    raise SystemExit("bye")


async def job(args, ctx):
    return {"done": args["n"]}
"""


async def test_a_handler_that_raises_an_exit_fails_its_attempt_and_the_host_stays_up(
    tmp_path: Path,
) -> None:
    """SystemExit and KeyboardInterrupt in a handler: recorded failures, no host stopped."""
    (tmp_path / "exitjobs.py").write_text(_EXITING_MODULE)
    rig = DaemonRig(tmp_path, socket_prefix="ske", tmp_on_pythonpath=True)
    db = tmp_path / "e.db"
    handlers = {name: f"exitjobs:{name}" for name in ("exits", "interrupts", "exits_later", "job")}
    processor = "streamkit.processors.tasks:TasksProcessor" + json.dumps(
        {"handlers": handlers, "backoff_base": 0.05}
    )
    try:
        host = rig.start_host("h", "--db", str(db), "--processor", processor, log="host")
        async with open_log(db) as log:
            await log.stream("/").append(
                *(
                    task_requested_event(task_id=name, name=name, max_attempts=2)
                    for name in ("exits", "interrupts", "exits_later")
                )
            )

        async def story() -> list[StreamEvent]:
            async with open_log(db, read_only=True) as log:
                return list((await log.stream("/").read(0, 1000)).events)

        async def all_dead_lettered() -> bool:
            return sum(e.type == TASK_DEAD_LETTERED for e in await story()) == 3

        await _wait(all_dead_lettered, within=30)
        assert host.poll() is None, (tmp_path / "host.log").read_text()
        # Attempt 1 failed and was retried; attempt 2, the last, was dead-lettered.
        last = (TASK_ATTEMPT_FAILED, TASK_DEAD_LETTERED)
        failed = [e.payload for e in await story() if e.type in last]
        errors = {(p["task_id"], p.get("attempt", p.get("attempts"))): p["error"] for p in failed}
        assert set(errors) == {
            (n, a) for n in ("exits", "interrupts", "exits_later") for a in (1, 2)
        }
        assert "raised SystemExit(3)" in errors["exits", 1]
        assert "raised KeyboardInterrupt()" in errors["interrupts", 2]
        assert "raised SystemExit('bye')" in errors["exits_later", 1]
        # Still serving: the next task runs to success on the same host.
        async with open_log(db) as log:
            await log.stream("/").append(
                task_requested_event(task_id="ok", name="job", args={"n": 1})
            )

        async def succeeded() -> bool:
            return any(e.type == TASK_SUCCEEDED for e in await story())

        await _wait(succeeded, within=30)
        assert host.poll() is None
    finally:
        rig.close()


_STUBBORN_MODULE = """
import asyncio


async def stubborn(args, ctx):
    while True:  # swallows every cancel: nothing can stop it
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass
"""


def _status(db: Path) -> dict[str, Any]:
    code, text = _cli("status", "--db", str(db), "--json")
    assert code == 0, text
    return dict(json.loads(text))


async def test_a_handler_that_swallows_its_cancel_is_counted_and_does_not_hold_the_stop(
    tmp_path: Path,
) -> None:
    """A timed-out attempt that will not stop is named in status; SIGTERM still ends the host."""
    (tmp_path / "stubbornjobs.py").write_text(_STUBBORN_MODULE)
    (tmp_path / "streamkit.toml").write_text("shutdown_grace = 1\n")
    rig = DaemonRig(tmp_path, socket_prefix="sks", tmp_on_pythonpath=True)
    db = tmp_path / "s.db"
    processor = "streamkit.processors.tasks:TasksProcessor" + json.dumps(
        {"handlers": {"stubborn": "stubbornjobs:stubborn"}}
    )
    try:
        host = rig.start_host(
            "h", "--db", str(db), "--processor", processor, "--log-format", "json", log="host"
        )
        async with open_log(db) as log:
            await log.stream("/").append(
                task_requested_event(task_id="t1", name="stubborn", timeout_s=0.3, max_attempts=1),
                task_requested_event(task_id="t2", name="stubborn", timeout_s=3600),
            )

        async def counted() -> bool:
            (row,) = (await asyncio.to_thread(_status, db))["processors"]
            return bool(row["refusing_cancel"])

        await _wait(counted, within=30)
        (row,) = (await asyncio.to_thread(_status, db))["processors"]
        assert row["refusing_cancel"] == ["task handler 'stubborn' (task t1, attempt 1)"]
        assert row["refused_cancel"] == 1
        _, text = await asyncio.to_thread(_cli, "status", "--db", str(db))
        assert "refusing_cancel=1 (task handler 'stubborn' (task t1, attempt 1))" in text
        # The stop cancels t2's attempt too, which will not stop either: the host exits anyway.
        began = time.monotonic()
        host.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(host.wait, 30) == 0
        took = time.monotonic() - began
        log = [json.loads(line) for line in (tmp_path / "host.log").read_text().splitlines()]
        (forced,) = [entry for entry in log if entry["event"] == "host.exit_forced"]
        assert forced["running"] == [
            "task handler 'stubborn' (task t1, attempt 1)",
            "task handler 'stubborn' (task t2, attempt 1)",
        ]
        events = [entry["event"] for entry in log]
        assert events.index("lease.released") < events.index("host.exit_forced")
        assert took < 15, took
    finally:
        rig.close()


async def test_cli_tasks_show_and_dlq_show_print_a_failures_traceback(tmp_path: Path) -> None:
    """A dead-lettered task's traceback excerpt is printed indented under its event by
    `tasks show`, and under its record by `dlq show`; the JSON keeps it as a field."""

    async def broken(args: dict[str, Any], ctx: TaskContext) -> None:
        raise ValueError("the printer is on fire")

    db = str(tmp_path / "t.db")
    config = HostConfig.model_validate({"db": db, "shutdown_grace": 0.5})
    host = ProcessorHost(
        config, processors=[TasksProcessor(handlers={"broken": broken})], serve_control=False
    )
    await host.start()
    try:
        await host.append("/", [task_requested_event(task_id="t1", name="broken", max_attempts=1)])

        async def dead() -> bool:
            counts = (await host.snapshot("tasks"))["state"]["counts"]
            return bool(counts.get("dead_lettered") == 1)

        await _wait(dead)
    finally:
        await host.stop()
    code, out = await asyncio.to_thread(_cli, "tasks", "show", "t1", "--db", db)
    assert code == 0
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if " task.dead-lettered " in line)
    assert '"traceback"' not in lines[at]
    assert lines[at + 1] == "  traceback:"
    assert lines[at + 2] == "    Traceback (most recent call last):"
    assert any(line.endswith('raise ValueError("the printer is on fire")') for line in lines)
    code, out = await asyncio.to_thread(_cli, "dlq", "list", "--db", db, "--json")
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert record["traceback"].rstrip().endswith("ValueError: the printer is on fire")
    code, out = await asyncio.to_thread(_cli, "dlq", "show", record["record_id"], "--db", db)
    assert code == 0
    assert "  traceback:" in out.splitlines()
    assert out.rstrip().endswith("    ValueError: the printer is on fire")

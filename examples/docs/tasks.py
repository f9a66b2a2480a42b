"""The code of docs/tasks.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/tasks.py
"""

import asyncio


async def main() -> None:
    # --- docs/tasks.md:63
    from streamkit import InvalidEvent
    from streamkit.processors.tasks import task_requested_event

    request = task_requested_event(task_id="inv-1", name="send-invoice", args={"customer": "c1"})
    assert request["type"] == "task.requested"
    assert request["payload"]["max_attempts"] == 5
    assert request["idempotency_key"] == "tasks/request/inv-1"  # a retried request appends once

    try:
        task_requested_event(task_id="inv-2", name="send-invoice", max_attempts=0)
    except InvalidEvent as error:
        assert "max_attempts" in str(error)
    else:
        raise AssertionError("max_attempts=0 must be refused")
    # --- docs/tasks.md:114
    from streamkit import ProcessorEngine
    from streamkit.processors.tasks import TaskContext, TasksProcessor
    from streamkit.testing import ManualClock, memory_storage, memory_stream, settle

    sent: list[tuple[str, int]] = []


    async def send_invoice(args: dict, ctx: TaskContext) -> dict:
        if ctx.attempt == 1:
            raise ConnectionError("mail server busy")
        sent.append((ctx.idempotency_key, ctx.attempt))
        return {"sent_to": args["customer"]}


    clock = ManualClock(1_700_000_000.0)
    stream = memory_stream(clock=clock)
    storage = memory_storage()
    tasks = TasksProcessor(handlers={"send-invoice": send_invoice}, backoff_base=30.0, clock=clock)
    engine = ProcessorEngine(tasks, stream=stream, storage=storage, clock=clock)
    stream.engines.append(engine)

    await stream.append(request)
    await settle(0.05)
    failed = [e.payload for e in stream.events if e.type == "task.attempt-failed"]
    assert failed[0]["error"] == "ConnectionError: mail server busy"
    # A bounded excerpt of the handler's traceback (innermost frames, no locals) is kept too.
    assert failed[0]["traceback"].rstrip().endswith("ConnectionError: mail server busy")
    retry_at = failed[0]["retry_at"]
    assert 30.0 <= retry_at - clock.now <= 37.5  # 30 s, plus up to 25% jitter
    assert engine.statistics().claimed_at == retry_at  # the retry is a durable wakeup
    # --- docs/tasks.md:150
    clock.now = retry_at
    await engine.revive()
    await settle(0.05)
    assert sent == [("tasks/run/inv-1@1", 2)]
    assert [e.type for e in stream.events] == [
        "task.requested",
        "task.attempt-started",
        "task.attempt-failed",
        "task.attempt-started",
        "task.succeeded",
    ]
    offset, state = await engine.snapshot()
    assert state.tasks == {}  # finished: it left the state
    assert state.counts.succeeded == 1 and state.counts.failed_attempts == 1
    # --- docs/tasks.md:253
    import asyncio

    from streamkit.processors.tasks import cancel_requested_event

    gate = asyncio.Event()


    async def wait_forever(args: dict, ctx: TaskContext) -> None:
        await gate.wait()


    cancel_stream = memory_stream(clock=clock)
    cancel_storage = memory_storage()
    waiter = ProcessorEngine(
        TasksProcessor(handlers={"wait": wait_forever}, clock=clock),
        stream=cancel_stream,
        storage=cancel_storage,
        clock=clock,
    )
    cancel_stream.engines.append(waiter)
    await cancel_stream.append(
        task_requested_event(task_id="long", name="wait"),
        task_requested_event(task_id="odd", name="no-such-handler"),
    )
    await settle(0.05)
    await cancel_stream.append(cancel_requested_event("long", reason="not needed"))
    await cancel_stream.append(cancel_requested_event("ghost"))
    await settle(0.05)
    outcomes = {e.type: e.payload for e in cancel_stream.events}
    assert outcomes["task.cancelled"]["reason"] == "not needed"
    assert (
        'no handler is registered for task name "no-such-handler"'
        in (outcomes["task.dead-lettered"]["error"])
    )
    assert outcomes["dlq.dead-lettered"]["operation"] == "no-such-handler"
    assert outcomes["task.rejected"]["task_id"] == "ghost"
    offset, state = await waiter.snapshot()
    assert state.tasks == {}
    cancel_storage.close()
    # --- docs/tasks.md:305
    hang = asyncio.Event()


    async def stuck(args: dict, ctx: TaskContext) -> None:
        await hang.wait()


    crash_stream = memory_stream(clock=clock)
    crash_storage = memory_storage()
    first = ProcessorEngine(
        TasksProcessor(handlers={"job": stuck}, clock=clock),
        stream=crash_stream,
        storage=crash_storage,
        clock=clock,
    )
    crash_stream.engines.append(first)
    await crash_stream.append(task_requested_event(task_id="job-1", name="job"))
    await settle(0.05)
    assert [e.type for e in crash_stream.events][-1] == "task.attempt-started"

    # The host dies: its engine is gone, its attempt abandoned.
    crash_stream.engines.clear()
    await first.aclose(grace=0)


    async def works(args: dict, ctx: TaskContext) -> str:
        return "done"


    second = ProcessorEngine(
        TasksProcessor(handlers={"job": works}, clock=clock),
        stream=crash_stream,
        storage=crash_storage,
        clock=clock,
    )
    crash_stream.engines.append(second)
    await second.revive()  # what the next host's alarm does
    await settle(0.05)
    interrupted = [e.payload for e in crash_stream.events if e.type == "task.attempt-failed"]
    assert "attempt 1 was interrupted" in interrupted[0]["error"]
    clock.now = interrupted[0]["retry_at"]
    await second.revive()
    await settle(0.05)
    assert [e.type for e in crash_stream.events][-2:] == ["task.attempt-started", "task.succeeded"]
    for opened in (storage, crash_storage):
        opened.close()


if __name__ == "__main__":
    asyncio.run(main())

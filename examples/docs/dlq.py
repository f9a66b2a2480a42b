"""The code of docs/dlq.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/dlq.py
"""

import asyncio


async def main() -> None:
    # --- docs/dlq.md:42
    from streamkit.processors.dlq import DLQ_EVENTS, dead_lettered_event

    event = dead_lettered_event(
        record_id="charge/order-7",  # unique per record: the DLQ's key
        origin="billing",  # who gave up
        operation="charge",  # what it was doing: replay handlers are per operation
        payload={"order": 7, "amount": 42},  # the original request
        error="card declined",
        attempts=3,  # how often the origin tried
        resource_id="order-7",
        actor="checkout",
        request_type="charge.requested",  # optional: the default replay re-appends payload as this
        idempotency_key="billing/charge/order-7/dead",
    )
    assert event["type"] == "dlq.dead-lettered"
    assert event["payload"]["replay"] == 0
    assert DLQ_EVENTS.payload_schema_for("dlq.dead-lettered") is not None
    # --- docs/dlq.md:98
    from streamkit import ProcessorEngine
    from streamkit.processors.dlq import (
        DlqProcessor,
        DlqRecord,
        ReplayContext,
        ReplayRef,
        iter_records,
        replay_requested_event,
    )
    from streamkit.testing import memory_storage, memory_stream, settle

    charged: list[tuple[str, str]] = []


    async def charge_again(record: DlqRecord, ctx: ReplayContext) -> None:
        if record.payload["amount"] > 100:
            raise ValueError("over the limit")
        charged.append((record.record_id, ctx.idempotency_key))


    def record(rid: str, operation: str, amount: int, replays: int = 0) -> dict:
        return dead_lettered_event(
            record_id=rid,
            origin="billing",
            operation=operation,
            payload={"amount": amount},
            error="card declined",
            attempts=3,
            replay_of=ReplayRef(record_id=rid, replay=replays) if replays else None,
        )


    stream = memory_stream()
    storage = memory_storage()
    dlq = DlqProcessor(handlers={"charge": charge_again}, max_attempts=2)
    engine = ProcessorEngine(dlq, stream=stream, storage=storage)
    stream.engines.append(engine)

    await stream.append(
        record("a", "charge", 10),
        record("b", "charge", 500),
        record("c", "charge", 500, replays=1),  # its next failure is replay 2 = max_attempts
        record("d", "refund", 10),  # no handler, no request_type
    )
    await stream.append(replay_requested_event(requested_by="ops"))
    await settle(0.1)

    (completed,) = [e.payload for e in stream.events if e.type == "dlq.replay-completed"]
    report = completed["report"]
    assert (report["replayed"], report["retried"], report["abandoned"], report["skipped"]) == (
        ["a"],
        ["b"],
        ["c"],
        ["d"],
    )
    assert charged == [("a", "dlq/replay/a/1")]
    # --- docs/dlq.md:160
    now = {r.record_id: r async for r in iter_records(stream)}
    assert {rid: r.status for rid, r in now.items()} == {
        "a": "succeeded",
        "b": "pending",
        "c": "abandoned",
        "d": "pending",
    }
    assert now["b"].replays == 1 and "over the limit" in now["b"].error
    offset, state = await engine.snapshot()
    assert state.counts.pending == 2 and state.counts.abandoned == 1
    storage.close()
    # --- docs/dlq.md:194
    from streamkit.processors.tasks import TaskContext, TasksProcessor, task_requested_event

    fixed = {"yes": False}


    async def send_invoice(args: dict, ctx: TaskContext) -> str:
        if not fixed["yes"]:
            raise ConnectionError("mail server down")
        return "sent"


    stream = memory_stream()
    storages = [memory_storage(), memory_storage()]
    tasks_engine = ProcessorEngine(
        TasksProcessor(handlers={"send-invoice": send_invoice}), stream=stream, storage=storages[0]
    )
    dlq_engine = ProcessorEngine(DlqProcessor(), stream=stream, storage=storages[1])
    stream.engines += [tasks_engine, dlq_engine]


    async def records_when(**filters: object) -> list[DlqRecord]:
        """The records matching ``filters`` once there are any (the engines run on their own)."""
        for _ in range(500):
            if found := [r async for r in iter_records(stream, **filters)]:
                return found
            await settle(0.01)
        raise AssertionError(f"no record matches {filters}")


    await stream.append(task_requested_event(task_id="inv-9", name="send-invoice", max_attempts=1))
    (pending,) = await records_when(status=["pending"])
    assert pending.record_id == "tasks/inv-9@1" and pending.operation == "send-invoice"

    fixed["yes"] = True  # the mail server is back
    await stream.append(replay_requested_event(origin="tasks"))
    (settled,) = await records_when(status=["succeeded"])
    assert [e.type for e in stream.events if e.type.startswith("task.")][-3:] == [
        "task.requested",  # re-appended by the DLQ, marked as replay 1 of the record
        "task.attempt-started",
        "task.succeeded",
    ]
    for opened in storages:
        opened.close()


if __name__ == "__main__":
    asyncio.run(main())

"""The code of docs/notifications.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/notifications.py
"""

import asyncio


async def main() -> None:
    # --- docs/notifications.md:91
    from pydantic import BaseModel

    from streamkit import EventDefinition, InvalidConfig, ProcessorEngine, define_processor_contract
    from streamkit.processors.notifications import NotificationsProcessor, OutboxChannel, read_outbox
    from streamkit.testing import ManualClock, memory_storage, memory_stream, settle


    class TaskCreated(BaseModel):
        task_id: str
        title: str
        owner: str = "ops@example.com"


    class NoState(BaseModel):
        pass


    TASKS = define_processor_contract(
        slug="tasks-catalog",
        version="1",
        state_schema=NoState,
        events={"task.created": EventDefinition(description="a task", payload_schema=TaskCreated)},
    )

    CREATED = {
        "name": "task-created",
        "event_type": "task.created",
        "subject": "New task ${task_id}",
        "template": "${title} was created; it costs $$0 to read this.",
        "recipients": ["$owner"],
        "channel": "outbox",
        "max_attempts": 5,
    }

    clock = ManualClock(1_700_000_000)
    notifications = NotificationsProcessor(
        rules=[CREATED],
        channels={"outbox": OutboxChannel("outbox.jsonl")},
        sources=[TASKS],
        clock=clock,
    )

    # A template field the schema does not have is refused before anything runs.
    try:
        NotificationsProcessor(
            rules=[{**CREATED, "template": "${titel} was created"}],
            channels={"outbox": OutboxChannel("outbox.jsonl")},
            sources=[TASKS],
        )
    except InvalidConfig as error:
        assert error.code == "INVALID_CONFIG"
        assert "${titel}" in str(error) and "TaskCreated" in str(error)
    else:
        raise AssertionError("a template naming a missing field must be refused")
    # --- docs/notifications.md:161
    stream = memory_stream()
    storage = memory_storage()
    engine = ProcessorEngine(notifications, stream=stream, storage=storage, clock=clock)
    stream.engines.append(engine)

    (created,) = await stream.append(
        {"type": "task.created", "payload": {"task_id": "t1", "title": "Water the plants"}}
    )
    while engine.statistics().background_in_flight or not any(e.type == "notification.sent" for e in stream.events):
        await settle()

    (line,) = read_outbox("outbox.jsonl")
    assert line["id"] == f"task-created@{created.offset}"
    assert line["subject"] == "New task t1"
    assert line["body"] == "Water the plants was created; it costs $0 to read this."
    assert line["recipients"] == ["ops@example.com"]  # the schema's default owner

    (sent,) = [e.payload for e in stream.events if e.type == "notification.sent"]
    assert (sent["notification_id"], sent["attempt"]) == (line["id"], 1)
    assert sent["receipt"]["channel"] == "outbox"
    await engine.wait_until_processed(stream.head)
    state = (await engine.snapshot()).state
    assert state.pending == {} and state.sent == 1
    # --- docs/notifications.md:224
    from streamkit.processors.notifications import Backoff, ChannelError, LogChannel, Notification


    class Pager:
        """A channel that is down until `up` is set."""

        def __init__(self) -> None:
            self.up = False
            self.pages: list[str] = []

        async def send(self, notification: Notification) -> dict[str, object]:
            if not self.up:
                raise ChannelError("the pager gateway is down", retryable=True)
            self.pages.append(notification.body)
            return {"channel": "pager"}


    pager = Pager()
    paging = NotificationsProcessor(
        rules=[{**CREATED, "name": "page", "channel": "pager", "max_attempts": 2}],
        channels={"pager": pager, "log": LogChannel()},
        sources=[TASKS],
        slug="paging",
        backoff=Backoff(initial=30, multiplier=2, jitter=0),
        clock=clock,
    )
    pages = memory_stream()
    page_engine = ProcessorEngine(paging, stream=pages, storage=storage, clock=clock)
    pages.engines.append(page_engine)


    async def quiet() -> None:
        """Let background attempts finish and their outcomes be folded."""
        await settle()
        while page_engine.statistics().background_in_flight:
            await settle()
        await page_engine.wait_until_processed(pages.head)


    (task,) = await pages.append(
        {"type": "task.created", "payload": {"task_id": "t2", "title": "Call the plumber"}}
    )
    await quiet()
    (failed,) = [e.payload for e in pages.events if e.type == "notification.attempt-failed"]
    assert failed["retry_at"] == clock() + 30
    assert pages.claims[-1] == clock() + 30  # the wakeup the host's alarm will honour

    clock.advance(30)
    await page_engine.revive()  # what the host does when the claim falls due
    await quiet()
    dead = [e.payload for e in pages.events if e.type == "notification.dead-lettered"]
    assert dead[0]["attempts"] == 2 and "gateway is down" in dead[0]["error"]
    (record,) = [e.payload for e in pages.events if e.type == "dlq.dead-lettered"]
    assert record["record_id"] == f"paging/page@{task.offset}"
    assert record["operation"] == "notification.send"
    assert record["request_type"] == "notification.resend-requested"
    assert (await page_engine.snapshot()).state.pending == {}
    # --- docs/notifications.md:297
    from streamkit.processors.dlq import DlqProcessor, replay_requested_event

    dlq_engine = ProcessorEngine(
        DlqProcessor(clock=clock), stream=pages, storage=storage, clock=clock
    )
    pages.engines.append(dlq_engine)
    pager.up = True
    await pages.append(replay_requested_event(requested_by="ops"))
    while not any(e.type == "dlq.replay-completed" for e in pages.events):
        await settle()
    await quiet()

    assert pager.pages == ["Call the plumber was created; it costs $0 to read this."]
    (sent,) = [e.payload for e in pages.events if e.type == "notification.sent"]
    assert (sent["dlq_record_id"], sent["replay"]) == (record["record_id"], 1)
    assert any(e.type == "dlq.record-succeeded" for e in pages.events)
    (report,) = [e.payload["report"] for e in pages.events if e.type == "dlq.replay-completed"]
    assert report["replayed"] == [record["record_id"]]
    # --- docs/notifications.md:398
    class BoardNotifications(NotificationsProcessor):
        def __init__(self, **kwargs: object) -> None:
            super().__init__(sources=[TASKS], **kwargs)  # type: ignore[arg-type]


    built = BoardNotifications(
        rules=[CREATED], channels={"outbox": {"kind": "outbox", "path": "o.jsonl"}}
    )
    assert [rule.name for rule in built.rules] == ["task-created"]

    for running in (engine, page_engine, dlq_engine):
        await running.aclose()
    storage.close()


if __name__ == "__main__":
    asyncio.run(main())

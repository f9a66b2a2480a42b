"""The notifications processor: rules, one delivery per id, retries, dead letters, replay."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from streamkit.processors.dlq import DlqProcessor, replay_requested_event
from streamkit.processors.notifications import (
    MAX_RENDERED_BYTES,
    Backoff,
    ChannelError,
    Notification,
    NotificationRule,
    NotificationsProcessor,
    NotificationsState,
    OutboxChannel,
    WebhookChannel,
    read_outbox,
)
from streamkit.testing import ManualClock, MemoryStorage, MemoryStream, reduce_processor
from support.notifications import SmtpPeer, WebhookPeer
from support.waits import until

from streamkit import (
    EventDefinition,
    InvalidConfig,
    ProcessorEngine,
    ReduceCheckpointTable,
    define_processor_contract,
    open_log,
)


class TaskCreated(BaseModel):
    task_id: str
    title: str
    owner: str = "ops@example.com"


class _Empty(BaseModel):
    pass


TASKS = define_processor_contract(
    slug="tasks-source",
    version="1",
    state_schema=_Empty,
    events={"task.created": EventDefinition(description="a task", payload_schema=TaskCreated)},
)

CREATED_RULE = {
    "name": "created",
    "event_type": "task.created",
    "subject": "New task $task_id",
    "template": "Task ${title} was created",
    "recipients": ["$owner"],
    "channel": "out",
}


def _created(n: int, **extra: Any) -> dict[str, Any]:
    """A task.created input; ``owner`` comes from the schema's default unless given."""
    return {"type": "task.created", "payload": {"task_id": f"t{n}", "title": f"Task {n}", **extra}}


class HeldChannel:
    """A channel whose sends wait until the test releases them; counts calls."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls: list[Notification] = []

    async def send(self, notification: Notification) -> dict[str, Any]:
        self.calls.append(notification)
        await self.release.wait()
        return {"channel": "held"}


class FailingChannel:
    """A channel that always fails with a retryable error; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def send(self, notification: Notification) -> dict[str, Any]:
        self.calls += 1
        raise ChannelError("the test channel is down", retryable=True)


class Rig:
    """A memory stream, checkpoint storage and clock, and engines built over them."""

    def __init__(self) -> None:
        self.stream = MemoryStream("/")
        self.storage = MemoryStorage()
        self.clock = ManualClock(1_700_000_000)
        self.engines: list[ProcessorEngine[Any]] = []

    def start(self, processor: Any) -> ProcessorEngine[Any]:
        engine: ProcessorEngine[Any] = ProcessorEngine(
            processor, stream=self.stream, storage=self.storage, clock=self.clock
        )
        self.stream.engines.append(engine)
        self.engines.append(engine)
        return engine

    async def stop(self, engine: ProcessorEngine[Any], grace: float = 0.0) -> None:
        self.stream.engines.remove(engine)
        await engine.aclose(grace)

    def of_type(self, etype: str) -> list[dict[str, Any]]:
        return [e.payload for e in self.stream.events if e.type == etype]

    async def idle(self, engine: ProcessorEngine[Any]) -> None:
        """Wait until every append is folded, no attempt is running and the claim is sent."""
        for _ in range(1000):
            await engine.wait_until_processed(self.stream.head, timeout=5)
            claims = self.stream.claims
            if (
                engine.statistics().background_in_flight == 0
                and engine.cursor >= self.stream.head
                and (
                    engine.statistics().claim_held in claims
                    or engine.statistics().claim_held is None
                )
            ):
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the engine did not settle")


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    made = Rig()
    try:
        yield made
    finally:
        for engine in made.engines:
            await engine.aclose()
        made.storage.close()


def _outbox_processor(path: Path, clock: Callable[[], float], **kwargs: Any) -> Any:
    return NotificationsProcessor(
        rules=[CREATED_RULE],
        sources=[TASKS],
        channels={"out": OutboxChannel(path)},
        clock=clock,
        **kwargs,
    )


# -- rules refused at definition time ---------------------------------------------------


def test_a_template_field_missing_from_the_declared_schema_is_refused() -> None:
    """A rule naming a field the event type's payload schema lacks is refused when built."""
    rule = {**CREATED_RULE, "template": "Task $titel was created"}
    with pytest.raises(InvalidConfig, match=r"\$\{titel\}") as caught:
        NotificationsProcessor(rules=[rule], channels={"out": {"kind": "log"}}, sources=[TASKS])
    assert caught.value.code == "INVALID_CONFIG"
    assert caught.value.details == {
        "rule": "created",
        "field": "titel",
        "event_type": "task.created",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"template": "costs $"}, "is not a valid template"),
        ({"channel": "pager"}, 'channel "pager", which is not configured'),
        ({"name": "bad name!"}, "rule name"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"colour": "red"}, "colour"),
        ({"event_type": "notification.sent"}, "may not watch them"),
        ({"event_type": "dlq.dead-lettered"}, "may not watch them"),
    ],
)
def test_broken_rules_are_refused_when_the_processor_is_built(
    change: dict[str, Any], message: str
) -> None:
    """A malformed template, unknown channel, bad name or a rule on its own outcomes is refused."""
    with pytest.raises(InvalidConfig, match=message):
        NotificationsProcessor(
            rules=[{**CREATED_RULE, **change}], channels={"out": {"kind": "log"}}
        )


def test_two_rules_with_one_name_are_refused() -> None:
    """Rule names key notification ids, so two rules may not share one."""
    with pytest.raises(InvalidConfig, match="two notification rules"):
        NotificationsProcessor(
            rules=[CREATED_RULE, CREATED_RULE], channels={"out": {"kind": "log"}}
        )


def test_bad_settings_are_refused() -> None:
    """A bad backoff, timeout, backlog bound or a non-channel is refused when built."""
    ok: dict[str, Any] = {"rules": [CREATED_RULE], "channels": {"out": {"kind": "log"}}}
    for kwargs, message in (
        ({"backoff": {"initial": -1}}, "backoff"),
        ({"attempt_timeout": 0}, "attempt_timeout"),
        ({"max_pending": 0}, "max_pending"),
        ({"channels": {"out": object()}}, "no async send"),
        ({"sources": ["tasks"]}, "must be contracts"),
    ):
        with pytest.raises(InvalidConfig, match=message):
            NotificationsProcessor(**{**ok, **kwargs})


def test_undeclared_event_types_are_checked_at_render_time_only() -> None:
    """Without a payload schema the template cannot be checked, so the rule is accepted."""
    rule = {**CREATED_RULE, "event_type": "user.joined", "template": "Hi $anything"}
    processor = NotificationsProcessor(rules=[rule], channels={"out": {"kind": "log"}})
    assert [r.name for r in processor.rules] == ["created"]


# -- rendering (the pure fold) ----------------------------------------------------------


def test_reduce_renders_pending_notifications_with_stable_ids() -> None:
    """Each matching event becomes a pending notification `<rule>@<offset>`, rendered."""
    rules = [
        NotificationRule(
            name="nested",
            event_type="order.placed",
            subject="Order ${order.id}",
            template="$$${order.total} for ${customer.name}. Gift: $gift",
            recipients=("${customer.email}", "audit@example.com"),
            channel="log",
        )
    ]
    processor = NotificationsProcessor(rules=rules)
    state = reduce_processor(
        processor,
        [
            {"type": "other.thing", "payload": {}},
            {
                "type": "order.placed",
                "payload": {
                    "order": {"id": 7, "total": 9.5},
                    "customer": {"name": "Ada", "email": "ada@example.com"},
                    "gift": None,
                },
            },
        ],
    )
    (pending,) = state.pending.values()
    assert pending.id == "nested@2"
    assert pending.subject == "Order 7"
    assert pending.body == "$9.5 for Ada. Gift: "
    assert pending.recipients == ["ada@example.com", "audit@example.com"]
    assert (pending.attempts, pending.retry_at, pending.request_offset) == (0, None, 2)


# -- delivery ---------------------------------------------------------------------------


async def test_each_notification_is_written_to_the_outbox_once(rig: Rig, tmp_path: Path) -> None:
    """Matching events are delivered once each and recorded as notification.sent."""
    outbox = tmp_path / "outbox.jsonl"
    engine = rig.start(_outbox_processor(outbox, rig.clock))
    first, _, second = await rig.stream.append(
        _created(1), {"type": "unrelated", "payload": {}}, _created(2)
    )
    await rig.idle(engine)
    (third,) = await rig.stream.append(_created(3, owner="bob@example.com"))
    await rig.idle(engine)

    ids = [f"created@{e.offset}" for e in (first, second, third)]
    assert ids[:2] == ["created@1", "created@3"]
    lines = read_outbox(outbox)
    assert [line["id"] for line in lines] == ids
    assert lines[0]["subject"] == "New task t1"
    assert lines[0]["body"] == "Task Task 1 was created"
    assert lines[2]["recipients"] == ["bob@example.com"]
    sent = rig.of_type("notification.sent")
    assert sorted(s["notification_id"] for s in sent) == sorted(ids)
    assert all(s["attempt"] == 1 and s["receipt"]["channel"] == "outbox" for s in sent)
    state = (await engine.snapshot()).state
    assert state == NotificationsState(sent=3)
    assert engine.processor.project_live_state(state)["sent"] == 3


async def test_a_missing_field_at_render_time_is_an_error_event_and_nothing_stalls(
    rig: Rig, tmp_path: Path
) -> None:
    """A payload lacking a template field gets render-failed + a DLQ record; later events flow."""
    rule = {
        **CREATED_RULE,
        "event_type": "user.joined",
        "subject": "Hi",
        "template": "Welcome $name",
    }
    outbox = tmp_path / "outbox.jsonl"
    processor = NotificationsProcessor(rules=[rule], channels={"out": OutboxChannel(outbox)})
    engine = rig.start(processor)
    await rig.stream.append({"type": "user.joined", "payload": {"owner": "a@example.com"}})
    await rig.stream.append(
        {"type": "user.joined", "payload": {"owner": "b@example.com", "name": "Bo"}}
    )
    await rig.idle(engine)

    (failed,) = rig.of_type("notification.render-failed")
    assert failed["notification_id"] == "created@1"
    assert failed["field"] == "name"
    assert "does not have" in failed["error"]
    (record,) = rig.of_type("dlq.dead-lettered")
    assert record["record_id"] == "notifications/created@1"
    assert record["operation"] == "notification.render"
    assert record["request_type"] == "notification.resend-requested"
    assert record["payload"]["source_payload"] == {"owner": "a@example.com"}
    assert [line["body"] for line in read_outbox(outbox)] == ["Welcome Bo"]
    state = (await engine.snapshot()).state
    assert (state.render_failed, state.sent, state.pending) == (1, 1, {})


async def test_a_failed_attempt_is_retried_after_its_backoff(rig: Rig) -> None:
    """A 500 records attempt-failed with retry_at = now + backoff; the wakeup retries it."""
    backoff = Backoff(initial=10, multiplier=3, jitter=0.1)
    with WebhookPeer([500]) as peer:
        processor = NotificationsProcessor(
            rules=[CREATED_RULE],
            sources=[TASKS],
            channels={"out": WebhookChannel(peer.url, timeout=5)},
            backoff=backoff,
            clock=rig.clock,
        )
        engine = rig.start(processor)
        await rig.stream.append(_created(1))
        await rig.idle(engine)

        (failed,) = rig.of_type("notification.attempt-failed")
        delay = backoff.delay("created@1", 1)
        assert 9 <= delay <= 11
        assert failed["attempt"] == 1
        assert failed["retry_at"] == rig.clock() + delay
        assert "HTTP 500" in failed["error"]
        assert rig.stream.claims[-1] == failed["retry_at"]  # the wakeup is the claim
        assert rig.of_type("notification.sent") == []

        await engine.revive()  # too early: nothing is due yet
        await rig.idle(engine)
        assert len(peer.requests) == 1

        rig.clock.advance(delay)
        await engine.revive()
        await rig.idle(engine)
    (sent,) = rig.of_type("notification.sent")
    assert sent["attempt"] == 2
    assert peer.keys() == ["created@1", "created@1"]  # one Idempotency-Key for every attempt
    assert (await engine.snapshot()).state.pending == {}
    # Nothing owed: the attempt's claim stands until its revive, which releases it.
    assert engine.statistics().claimed_at is None
    standing = rig.stream.claims[-1]
    assert standing is not None
    rig.clock.advance(standing - rig.clock())
    await engine.revive()
    assert rig.stream.claims[-1] is None


def test_backoff_grows_and_is_capped() -> None:
    """Delays multiply per attempt up to max_delay; jitter stays within its fraction."""
    plain = Backoff(initial=1, multiplier=2, max_delay=5, jitter=0)
    assert [plain.delay("x", n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 5, 5]
    jittered = Backoff(initial=100, jitter=0.2)
    delays = {jittered.delay(f"n@{i}", 1) for i in range(50)}
    assert all(80 <= d <= 120 for d in delays)
    assert len(delays) > 40
    assert jittered.delay("n@1", 1) == jittered.delay("n@1", 1)


async def test_max_attempts_dead_letters_to_the_dlq(rig: Rig) -> None:
    """After max_attempts failures the notification is dead-lettered, with a replayable record."""
    channel = FailingChannel()
    rule = {**CREATED_RULE, "max_attempts": 3}
    processor = NotificationsProcessor(
        rules=[rule],
        sources=[TASKS],
        channels={"out": channel},
        backoff={"initial": 1, "jitter": 0},
        clock=rig.clock,
    )
    engine = rig.start(processor)
    await rig.stream.append(_created(1))
    await rig.idle(engine)
    for _ in range(2):
        rig.clock.advance(100)
        await engine.revive()
        await rig.idle(engine)

    assert channel.calls == 3
    assert [f["attempt"] for f in rig.of_type("notification.attempt-failed")] == [1, 2]
    (dead,) = rig.of_type("notification.dead-lettered")
    assert (dead["attempts"], dead["retryable"]) == (3, True)
    (record,) = rig.of_type("dlq.dead-lettered")
    assert record["origin"] == "notifications"
    assert record["operation"] == "notification.send"
    assert record["attempts"] == 3
    assert record["resource_id"] == "created@1"
    assert record["payload"]["body"] == "Task Task 1 was created"
    assert "the test channel is down" in record["error"]
    state = (await engine.snapshot()).state
    assert (state.pending, state.dead_lettered, state.failed_attempts) == ({}, 1, 2)
    rig.clock.advance(1000)
    await engine.revive()
    await rig.idle(engine)
    assert channel.calls == 3  # given up on: never attempted again


async def test_a_refusal_dead_letters_at_once(rig: Rig) -> None:
    """A non-retryable failure (HTTP 400) is dead-lettered on its first attempt."""
    with WebhookPeer([400]) as peer:
        processor = NotificationsProcessor(
            rules=[CREATED_RULE],
            sources=[TASKS],
            channels={"out": WebhookChannel(peer.url)},
            clock=rig.clock,
        )
        engine = rig.start(processor)
        await rig.stream.append(_created(1))
        await rig.idle(engine)
    (dead,) = rig.of_type("notification.dead-lettered")
    assert (dead["attempts"], dead["retryable"]) == (1, False)
    assert rig.of_type("notification.attempt-failed") == []


async def test_an_attempt_in_flight_is_not_started_twice(rig: Rig) -> None:
    """At-head passes while an attempt runs do not start a second one for the same id."""
    channel = HeldChannel()
    processor = NotificationsProcessor(
        rules=[CREATED_RULE], sources=[TASKS], channels={"out": channel}
    )
    engine = rig.start(processor)
    await rig.stream.append(_created(1))
    await until(lambda: len(channel.calls) == 1)
    for n in range(3):
        await rig.stream.append({"type": "unrelated", "payload": {"n": n}})
        await engine.wait_until_processed(rig.stream.head)
    await engine.revive()
    channel.release.set()
    await rig.idle(engine)
    assert len(channel.calls) == 1
    assert len(rig.of_type("notification.sent")) == 1


async def test_an_attempt_a_dead_host_abandoned_is_revived(rig: Rig, tmp_path: Path) -> None:
    """An attempt cut off by a host stop is started again by the next engine's revive."""
    held = HeldChannel()
    first = rig.start(
        NotificationsProcessor(rules=[CREATED_RULE], sources=[TASKS], channels={"out": held})
    )
    await rig.stream.append(_created(1))
    await until(lambda: len(held.calls) == 1)
    claim = rig.stream.claims[-1]
    assert claim is not None  # the attempt in flight holds a claim...
    await rig.stop(first)  # ...which outlives the host that abandoned it

    outbox = tmp_path / "outbox.jsonl"
    second = rig.start(_outbox_processor(outbox, rig.clock))
    await second.revive()
    await rig.idle(second)
    assert [line["id"] for line in read_outbox(outbox)] == ["created@1"]
    assert len(rig.of_type("notification.sent")) == 1


async def test_a_full_backlog_dead_letters_instead_of_growing_state(rig: Rig) -> None:
    """Past max_pending, a new notification is dead-lettered at once ("backlog full")."""
    channel = FailingChannel()
    processor = NotificationsProcessor(
        rules=[CREATED_RULE],
        sources=[TASKS],
        channels={"out": channel},
        max_pending=1,
        clock=rig.clock,
    )
    engine = rig.start(processor)
    await rig.stream.append(_created(1))
    await rig.idle(engine)
    (second,) = await rig.stream.append(_created(2))
    await rig.idle(engine)
    (dead,) = rig.of_type("notification.dead-lettered")
    assert dead["notification_id"] == f"created@{second.offset}"
    assert dead["attempts"] == 0
    assert "backlog is full" in dead["error"]
    (record,) = rig.of_type("dlq.dead-lettered")
    assert record["payload"]["body"] == "Task Task 2 was created"
    assert list((await engine.snapshot()).state.pending) == ["created@1"]


# -- restarts over a real SQLite log ----------------------------------------------------


async def _drain(engine: ProcessorEngine[Any]) -> None:
    """Catch up and wait out background attempts until the engine has nothing left to fold."""
    for _ in range(400):
        await engine.catch_up_from_log()
        if engine.statistics().background_in_flight == 0:
            await engine.catch_up_from_log()
            if engine.statistics().background_in_flight == 0:
                return
        await asyncio.sleep(0.005)
    raise AssertionError("background work did not settle")


async def test_a_notification_is_never_sent_twice_across_restarts(tmp_path: Path) -> None:
    """Engines rebuilt over the same SQLite log (same or lost checkpoint) never resend an id."""
    outbox = tmp_path / "outbox.jsonl"
    db = tmp_path / "log.db"
    checkpoints = [sqlite3.connect(tmp_path / f"ck{i}.db", isolation_level=None) for i in (1, 2)]
    log = open_log(db)
    try:
        stream = log.stream("/").for_processor("notifications")
        await log.stream("/").append(_created(1), _created(2), {"type": "noise", "payload": {}})

        def engine(storage: sqlite3.Connection) -> ProcessorEngine[Any]:
            processor = _outbox_processor(outbox, ManualClock())
            return ProcessorEngine(processor, stream=stream, storage=ReduceCheckpointTable(storage))

        first = engine(checkpoints[0])
        await _drain(first)
        await first.aclose()
        assert [line["id"] for line in read_outbox(outbox)] == ["created@1", "created@2"]

        # A restart from the checkpoint, and one whose checkpoint was lost: the
        # second re-reduces the whole log, sent outcomes included.
        for storage in checkpoints:
            again = engine(storage)
            await _drain(again)
            await again.revive()
            await _drain(again)
            await again.aclose()
        assert [line["id"] for line in read_outbox(outbox)] == ["created@1", "created@2"]

        (third,) = await log.stream("/").append(_created(3))
        last = engine(checkpoints[0])
        await _drain(last)
        await last.aclose()
        ids = [line["id"] for line in read_outbox(outbox)]
        assert ids == ["created@1", "created@2", f"created@{third.offset}"]
        page = await log.stream("/").read(0)
        sent = [e for e in page.events if e.type == "notification.sent"]
        assert sorted(e.payload["notification_id"] for e in sent) == sorted(ids)
    finally:
        await log.aclose()
        for connection in checkpoints:
            connection.close()


# -- DLQ replay -------------------------------------------------------------------------


async def test_a_dlq_replay_resends_and_settles_the_record(rig: Rig) -> None:
    """A replayed notification record is re-sent with its id, and the DLQ record succeeds."""
    with WebhookPeer([400]) as peer:
        notifications = rig.start(
            NotificationsProcessor(
                rules=[CREATED_RULE],
                sources=[TASKS],
                channels={"out": WebhookChannel(peer.url)},
                clock=rig.clock,
            )
        )
        dlq = rig.start(DlqProcessor(clock=rig.clock))
        await rig.stream.append(_created(1))
        await rig.idle(notifications)
        (record,) = rig.of_type("dlq.dead-lettered")

        await rig.stream.append(replay_requested_event(requested_by="ops"))
        await until(lambda: bool(rig.of_type("dlq.replay-completed")))
        await rig.idle(notifications)
        await rig.idle(dlq)

    (resend,) = [e for e in rig.stream.events if e.type == "notification.resend-requested"]
    assert resend.metadata["dlq"] == {"record_id": record["record_id"], "replay": 1}
    assert peer.keys() == ["created@1", "created@1"]
    (sent,) = rig.of_type("notification.sent")
    assert (sent["dlq_record_id"], sent["replay"]) == (record["record_id"], 1)
    assert sent["request_offset"] == resend.offset
    assert rig.of_type("dlq.record-succeeded") == [{"record_id": record["record_id"], "replay": 1}]
    (completed,) = rig.of_type("dlq.replay-completed")
    assert completed["report"]["replayed"] == [record["record_id"]]
    assert (await notifications.snapshot()).state.pending == {}
    assert (await dlq.snapshot()).state.counts.succeeded == 1


async def test_a_failed_replay_dead_letters_the_same_record_again(rig: Rig) -> None:
    """A replayed notification that fails again re-records its DLQ record as that replay."""
    with WebhookPeer([400, 400]) as peer:
        notifications = rig.start(
            NotificationsProcessor(
                rules=[CREATED_RULE],
                sources=[TASKS],
                channels={"out": WebhookChannel(peer.url)},
                clock=rig.clock,
            )
        )
        rig.start(DlqProcessor(clock=rig.clock))
        await rig.stream.append(_created(1))
        await rig.idle(notifications)
        await rig.stream.append(replay_requested_event())
        await until(lambda: len(rig.of_type("dlq.dead-lettered")) == 2)
        await rig.idle(notifications)
    first, second = rig.of_type("dlq.dead-lettered")
    assert second["record_id"] == first["record_id"]
    assert (first["replay"], second["replay"]) == (0, 1)
    dead = rig.of_type("notification.dead-lettered")
    assert [d["replay"] for d in dead] == [0, 1]
    assert rig.of_type("notification.sent") == []
    assert len(peer.requests) == 2


async def test_a_render_failure_is_replayed_after_the_rule_is_fixed(
    rig: Rig, tmp_path: Path
) -> None:
    """Nothing is lost: a render failure's record re-renders with the fixed rule on replay."""
    broken = {
        **CREATED_RULE,
        "event_type": "user.joined",
        "subject": "Hi",
        "template": "Welcome $nmae",
    }
    first = rig.start(
        NotificationsProcessor(rules=[broken], channels={"out": {"kind": "log"}}, clock=rig.clock)
    )
    await rig.stream.append({"type": "user.joined", "payload": {"name": "Ada", "owner": "a@x.io"}})
    await rig.idle(first)
    assert len(rig.of_type("notification.render-failed")) == 1
    await rig.stop(first)

    outbox = tmp_path / "outbox.jsonl"
    fixed = {**broken, "template": "Welcome $name"}
    second = rig.start(
        NotificationsProcessor(
            rules=[fixed], channels={"out": OutboxChannel(outbox)}, clock=rig.clock
        )
    )
    rig.start(DlqProcessor(clock=rig.clock))
    await rig.stream.append(replay_requested_event())
    await until(lambda: bool(rig.of_type("dlq.record-succeeded")))
    await rig.idle(second)
    (line,) = read_outbox(outbox)
    assert (line["id"], line["body"], line["recipients"]) == (
        "created@1",
        "Welcome Ada",
        ["a@x.io"],
    )


async def test_an_email_notification_reaches_a_local_smtp_server(rig: Rig) -> None:
    """A rule on the SMTP channel delivers one email per event to a real local server."""
    with SmtpPeer() as peer:
        processor = NotificationsProcessor(
            rules=[{**CREATED_RULE, "channel": "mail"}],
            sources=[TASKS],
            channels={
                "mail": {
                    "kind": "smtp",
                    "host": "127.0.0.1",
                    "port": peer.port,
                    "sender": "tasks@example.com",
                    "timeout": 5,
                }
            },
        )
        engine = rig.start(processor)
        (created,) = await rig.stream.append(_created(1, owner="ada@example.com"))
        await rig.idle(engine)
    (mail,) = peer.messages
    assert mail["to"] == ["ada@example.com"]
    assert mail["message"]["Subject"] == "New task t1"
    assert mail["message"]["X-Notification-Id"] == f"created@{created.offset}"
    (sent,) = rig.of_type("notification.sent")
    assert sent["receipt"]["message_id"] == mail["message"]["Message-ID"]


async def test_a_notification_over_the_size_limit_is_a_render_failure(rig: Rig) -> None:
    """A body rendering past 32 KiB is recorded as render-failed, never kept in state."""
    processor = NotificationsProcessor(rules=[{**CREATED_RULE, "channel": "log"}], sources=[TASKS])
    engine = rig.start(processor)
    await rig.stream.append(_created(1, title="x" * (MAX_RENDERED_BYTES + 1)))
    await rig.idle(engine)
    (failed,) = rig.of_type("notification.render-failed")
    assert "over the 32768-byte limit" in failed["error"]
    assert (await engine.snapshot()).state.pending == {}


async def test_the_byte_bound_dead_letters_what_does_not_fit(rig: Rig) -> None:
    """Past max_pending_bytes of waiting text, a new notification is dead-lettered at once."""
    processor = NotificationsProcessor(
        rules=[{**CREATED_RULE, "channel": "down"}],
        sources=[TASKS],
        channels={"down": FailingChannel()},
        max_pending_bytes=MAX_RENDERED_BYTES,
        clock=rig.clock,
    )
    engine = rig.start(processor)
    await rig.stream.append(_created(1, title="x" * 20_000))
    await rig.idle(engine)
    await rig.stream.append(_created(2, title="y" * 20_000))
    await rig.idle(engine)
    (dead,) = rig.of_type("notification.dead-lettered")
    assert "backlog is full" in dead["error"]
    assert len((await engine.snapshot()).state.pending) == 1


async def test_a_manual_resend_is_delivered_under_its_own_request(rig: Rig, tmp_path: Path) -> None:
    """A resend appended by hand (no DLQ mark) is delivered with outcomes keyed by its offset."""
    outbox = tmp_path / "outbox.jsonl"
    engine = rig.start(_outbox_processor(outbox, rig.clock))
    (created,) = await rig.stream.append(_created(1))
    await rig.idle(engine)
    nid = f"created@{created.offset}"
    (resend,) = await rig.stream.append(
        {
            "type": "notification.resend-requested",
            "payload": {
                "notification_id": nid,
                "rule": "created",
                "source_offset": created.offset,
                "source_type": "task.created",
                "source_payload": {"task_id": "t1", "title": "Again", "owner": "x@y.z"},
            },
        }
    )
    await rig.idle(engine)
    assert [line["body"] for line in read_outbox(outbox)] == [
        "Task Task 1 was created",
        "Task Again was created",
    ]
    first, second = rig.of_type("notification.sent")
    assert (first["request_offset"], second["request_offset"]) == (created.offset, resend.offset)
    assert second["dlq_record_id"] is None
    assert rig.of_type("dlq.record-succeeded") == []


async def test_a_resend_without_content_is_a_render_failure(rig: Rig) -> None:
    """A resend with neither rendered text nor a payload to render is recorded as failed."""
    engine = rig.start(NotificationsProcessor(rules=[{**CREATED_RULE, "channel": "log"}]))
    await rig.stream.append(
        {
            "type": "notification.resend-requested",
            "payload": {
                "notification_id": "created@9",
                "rule": "created",
                "source_offset": 9,
                "source_type": "task.created",
            },
        }
    )
    await rig.idle(engine)
    (failed,) = rig.of_type("notification.render-failed")
    assert "neither the rendered notification" in failed["error"]
    assert (await engine.snapshot()).state.render_failed == 1


async def test_the_live_view_shows_counters_and_pending_without_text(rig: Rig) -> None:
    """project_live_state shows counts and where each pending notification stands."""
    processor = NotificationsProcessor(
        rules=[{**CREATED_RULE, "channel": "down"}],
        sources=[TASKS],
        channels={"down": FailingChannel()},
        clock=rig.clock,
    )
    engine = rig.start(processor)
    (created,) = await rig.stream.append(_created(1))
    await rig.idle(engine)
    view = (await engine.live_snapshot()).state
    nid = f"created@{created.offset}"
    assert view["failed_attempts"] == 1
    assert view["pending"][nid]["attempts"] == 1
    assert "the test channel is down" in view["pending"][nid]["last_error"]
    assert "body" not in view["pending"][nid]


async def test_a_refusal_recorded_differently_before_a_restart_does_not_wedge(rig: Rig) -> None:
    """Re-recording a refusal whose first recording differs (settings changed) moves on."""

    def processor(max_bytes: int) -> NotificationsProcessor:
        return NotificationsProcessor(
            rules=[{**CREATED_RULE, "channel": "down"}],
            sources=[TASKS],
            channels={"down": FailingChannel()},
            max_pending=1,
            max_pending_bytes=max_bytes,
            backoff={"initial": 3600},
            clock=rig.clock,
        )

    first = rig.start(processor(MAX_RENDERED_BYTES))
    await rig.stream.append(_created(1), _created(2))
    await rig.idle(first)
    await rig.stop(first)
    assert len(rig.of_type("notification.dead-lettered")) == 1

    # The checkpoint is lost: the whole log is folded again, with other settings.
    rig.storage.close()
    rig.storage = MemoryStorage()
    again = rig.start(processor(2 * MAX_RENDERED_BYTES))
    await again.catch_up_from_log()
    assert again.cursor == rig.stream.head
    assert again.statistics().batch_failures == 0
    assert len(rig.of_type("notification.dead-lettered")) == 1


async def test_a_huge_payload_is_not_copied_into_its_dlq_record(rig: Rig) -> None:
    """A render failure over a payload past 256 KiB records a DLQ entry without the payload."""
    rule = {**CREATED_RULE, "event_type": "blob.stored", "subject": "", "template": "$name"}
    engine = rig.start(NotificationsProcessor(rules=[{**rule, "channel": "log"}]))
    (blob,) = await rig.stream.append(
        {"type": "blob.stored", "payload": {"owner": "a@b.c", "data": "z" * 300_000}}
    )
    await rig.idle(engine)
    (record,) = rig.of_type("dlq.dead-lettered")
    assert "source_payload" not in record["payload"]
    assert f"the event at offset {blob.offset}" in record["error"]

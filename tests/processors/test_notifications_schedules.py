"""Any schedule of events, channel outages, lost pushes and restarts delivers each id at most once."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from streamkit.processors.notifications import ChannelError, Notification, NotificationsProcessor
from streamkit.testing import ManualClock, MemoryStorage, MemoryStream

from streamkit import ProcessorEngine

RULE = {
    "name": "hello",
    "event_type": "user.joined",
    "template": "Hello $name",
    "channel": "flaky",
    "max_attempts": 3,
}


class FlakyChannel:
    """Delivers in memory, or fails (retryably) while ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.delivered: list[str] = []

    async def send(self, notification: Notification) -> dict[str, Any]:
        if self.down:
            raise ChannelError("flaky channel is down")
        self.delivered.append(notification.id)
        return {"channel": "flaky"}


STEP = st.one_of(
    st.tuples(st.just("emit"), st.integers(1, 3)),
    st.tuples(st.just("noise"), st.none()),
    st.tuples(st.just("down"), st.booleans()),
    st.tuples(st.just("drop"), st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 5.0, 60.0])),
    st.tuples(st.just("restart"), st.booleans()),
)


class World:
    """One stream, one channel and a clock that outlive every engine built over them."""

    def __init__(self) -> None:
        self.stream = MemoryStream("/")
        self.storage = MemoryStorage()
        self.clock = ManualClock(1_700_000_000)
        self.channel = FlakyChannel()
        self.engine = self._engine()
        self.sources: list[int] = []

    def _engine(self) -> ProcessorEngine[Any]:
        processor = NotificationsProcessor(
            rules=[RULE],
            channels={"flaky": self.channel},
            backoff={"initial": 5, "jitter": 0},
            clock=self.clock,
        )
        engine: ProcessorEngine[Any] = ProcessorEngine(
            processor, stream=self.stream, storage=self.storage, clock=self.clock
        )
        self.stream.engines.append(engine)
        return engine

    async def idle(self) -> None:
        for _ in range(2000):
            await self.engine.wait_until_processed(self.stream.head, timeout=5)
            claims = self.stream.claims
            if (
                self.engine.statistics().background_in_flight == 0
                and self.engine.cursor >= self.stream.head
                and (
                    self.engine.statistics().claim_held in claims
                    or self.engine.statistics().claim_held is None
                )
            ):
                return
            await asyncio.sleep(0.001)
        raise AssertionError("the engine did not settle")

    async def step(self, kind: str, arg: Any) -> None:
        if kind == "emit":
            events = [{"type": "user.joined", "payload": {"name": f"u{i}"}} for i in range(arg)]
            self.sources += [e.offset for e in await self.stream.append(*events)]
        elif kind == "noise":
            await self.stream.append({"type": "noise", "payload": {}})
        elif kind == "down":
            self.channel.down = arg
        elif kind == "drop":
            self.stream.drop_pushes = arg
        elif kind == "tick":
            self.clock.advance(arg)
            await self.engine.revive()
        elif kind == "restart":
            await self.idle()
            self.stream.engines.remove(self.engine)
            await self.engine.aclose()
            if arg:  # the checkpoint is lost: the next engine folds the whole log again
                self.storage.close()
                self.storage = MemoryStorage()
            self.engine = self._engine()
            await self.engine.revive()
        await self.idle()

    async def finish(self) -> None:
        self.channel.down = False
        self.stream.drop_pushes = False
        for _ in range(20):
            self.clock.advance(3600)
            await self.engine.revive()
            await self.idle()
            if not (await self.engine.snapshot()).state.pending:
                return
        raise AssertionError("notifications still pending with the channel up")

    async def close(self) -> None:
        await self.engine.aclose()
        self.storage.close()


async def run_schedule(steps: list[tuple[str, Any]]) -> None:
    world = World()
    try:
        for kind, arg in steps:
            await world.step(kind, arg)
        await world.finish()
        ids = {f"hello@{offset}" for offset in world.sources}
        delivered = Counter(world.channel.delivered)
        assert all(count == 1 for count in delivered.values()), delivered
        dead = {
            e.payload["notification_id"]
            for e in world.stream.events
            if e.type == "notification.dead-lettered"
        }
        sent = Counter(
            e.payload["notification_id"]
            for e in world.stream.events
            if e.type == "notification.sent"
        )
        assert set(delivered) == set(sent)
        assert all(count == 1 for count in sent.values()), sent
        assert not set(delivered) & dead
        assert set(delivered) | dead == ids
    finally:
        await world.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, max_size=14))
# Pinned: a send recorded, then a restart that lost its checkpoint; an outage
# long enough to dead-letter, across a restart; a lost push healed by a revive.
@example([("emit", 2), ("restart", True), ("emit", 1), ("restart", False)])
@example(
    [("down", True), ("emit", 1), ("tick", 5.0), ("restart", True), ("tick", 60.0), ("tick", 60.0)]
)
@example([("drop", True), ("emit", 1), ("drop", False), ("tick", 1.0)])
def test_any_schedule_delivers_each_notification_at_most_once(
    steps: list[tuple[str, Any]],
) -> None:
    """Outages, lost pushes and restarts (checkpoint kept or lost) never deliver an id twice."""
    asyncio.run(run_schedule(steps))

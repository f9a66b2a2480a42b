"""An effect appended without awaiting is part of its batch: a checkpoint never passes a lost one.

``process_event`` may start an append and not await it. On PostgreSQL a
keyed append runs in a savepoint of its own, so when its write fails (here:
another session holds the path's row past the lock timeout) the rest of the
group, the checkpoint included, can still commit. The batch's checkpoint
therefore waits for the appends its events started, and one that did not
land fails the batch: the cursor stays, and the retry writes the effect.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from pydantic import BaseModel
from streamkit.testing import memory_storage
from support.backends import Target

from streamkit import (
    ProcessorEngine,
    StorageBusy,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
)
from streamkit.processor import ProcessEventArgs

pytestmark = pytest.mark.slow


class Count(BaseModel):
    items: int = 0


class Unawaited(StreamProcessor[Count]):
    """One keyed ``effect`` per ``item``, started and never awaited."""

    contract = define_processor_contract(
        slug="unawaited",
        version="1",
        description="fire-and-forget effects",
        state_schema=Count,
        consumes=["item"],
        emits=["effect"],
    )

    def reduce(self, event: StreamEvent, state: Count) -> Count | None:
        return Count(items=state.items + 1)

    def process_event(self, args: ProcessEventArgs[Count]) -> None:
        event = args.event
        if event is not None:
            args.append(
                {
                    "type": "effect",
                    "payload": {"source": event.offset},
                    "idempotency_key": self.idempotency_key("effect", event),
                }
            )


async def test_a_checkpoint_waits_for_unawaited_effects_and_a_lost_one_fails_the_batch(
    pg: Target,
) -> None:
    assert pg.schema is not None
    url, schema = pg.schema
    storage = memory_storage()
    async with pg.open(busy_timeout=0.5) as log:
        stream = log.stream("/")
        await stream.append({"type": "item", "payload": {}})
        engine = ProcessorEngine(
            Unawaited(), stream=stream.for_processor("unawaited"), storage=storage
        )
        with psycopg.connect(url, autocommit=True) as other, other.transaction():
            # Another session holds the path's heads row: the effect's offsets cannot be taken.
            other.execute(f"SELECT 1 FROM \"{schema}\".streamkit_heads WHERE path = '/' FOR UPDATE")
            with pytest.raises(StorageBusy):
                await engine.catch_up_from_log()
            assert engine.cursor == 0  # the batch failed: no checkpoint past the lost effect
        await engine.catch_up_from_log()
        assert engine.cursor >= 1
        await asyncio.sleep(0)
        events = (await stream.read()).events
        assert [e.payload["source"] for e in events if e.type == "effect"] == [1]

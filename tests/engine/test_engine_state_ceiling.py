"""A deferred state that outgrows the checkpoint ceiling stalls the processor at that batch.

A large state's write waits for later batches (DEFER_STATE_FROM), so its
size is not known batch by batch. The engine measures it once the fastest
growth it has seen could have carried it to the ceiling: a state that
outgrows it fails the very batch that made it too large.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from support.engine import Rig

from streamkit import CheckpointTooLarge, StreamEvent, StreamProcessor, define_processor_contract
from streamkit.checkpoint import MAX_CHECKPOINT_STATE_BYTES


class Blobs(BaseModel):
    blobs: list[str] = []


class Hoard(StreamProcessor[Blobs]):
    """Keeps every blob it is sent: a state that grows 3 KB an event, without bound."""

    contract = define_processor_contract(
        slug="hoard", version="1", state_schema=Blobs, consumes=["blob"]
    )

    def reduce(self, event: StreamEvent, state: Blobs) -> Blobs | None:
        return Blobs(blobs=[*state.blobs, event.payload["data"]])


def blob(n: int) -> dict[str, Any]:
    return {"type": "blob", "payload": {"data": f"{n:06d}" + "x" * 2994}}


def first_too_large() -> int:
    """The event whose reduce makes the state's JSON pass the ceiling."""
    blobs: list[str] = []
    n = 0
    while True:
        n += 1
        blobs.append(blob(n)["payload"]["data"])
        if len(json.dumps({"blobs": blobs}, separators=(",", ":"))) > MAX_CHECKPOINT_STATE_BYTES:
            return n


async def test_the_batch_that_outgrows_the_ceiling_fails_and_nothing_after_it_runs(
    rig: Rig,
) -> None:
    """One event per batch: the failure comes at the crossing event, not ~780 later."""
    engine = rig.engine(Hoard())
    crossing = first_too_large()
    offsets: list[int] = []
    for n in range(1, crossing + 50):
        (event,) = await rig.stream.append(blob(n))
        offsets.append(event.offset)
        try:
            await engine.wait_until_processed(event.offset)
        except CheckpointTooLarge:
            break
    assert isinstance(engine.latched_error, CheckpointTooLarge)
    assert len(offsets) == crossing  # it failed at the crossing event, and nothing after ran
    # Every batch before it committed (its state deferred or written), none after.
    stored = rig.checkpoint("hoard")
    assert offsets[-2] <= stored.reduced_through_offset < offsets[-1]

"""The ephemeral contract every backend keeps: offsets taken in order, amortized zero writes.

Through the public Log API only; the ``log`` fixture opens each backend in turn.
"""

from __future__ import annotations

import pytest
from support.log import durable, tick

from streamkit import OffsetConflict
from streamkit.log import Log


async def test_durable_ephemeral_durable_is_1_2_3(log: Log) -> None:
    """In one process, an ephemeral between two durables takes the offset between them."""
    stream = log.stream()
    (a,) = await stream.append(durable(1))
    (e,) = await stream.append(tick())
    (b,) = await stream.append(durable(2))
    assert (a.offset, e.offset, b.offset) == (1, 2, 3)
    assert e.ephemeral
    assert not a.ephemeral


@pytest.mark.speed_trick
async def test_many_ephemerals_cost_amortized_zero_writes(log: Log) -> None:
    """A thousand ephemerals take a thousand offsets with a handful of reservation writes."""
    stream = log.stream()
    offsets = []
    for n in range(1000):
        (e,) = await stream.append(tick(n))
        offsets.append(e.offset)
    assert offsets == list(range(1, 1001))
    stats = log.stats
    assert stats.ephemeral == 1000
    assert stats.ephemeral_reservations <= 3
    assert stats.transactions == stats.ephemeral_reservations
    assert await stream.head() == 0


async def test_a_large_ephemeral_batch_reserves_once(log: Log) -> None:
    """One call with more ephemerals than a block reserves a block big enough for all of them."""
    events = await log.stream().append(*(tick(n) for n in range(1000)))
    assert [e.offset for e in events] == list(range(1, 1001))
    assert log.stats.ephemeral_reservations == 1


async def test_an_ephemeral_offset_precondition(log: Log) -> None:
    """An ephemeral may carry an offset precondition; a refused one uses up no offset."""
    stream = log.stream()
    await stream.append(durable(1))
    with pytest.raises(OffsetConflict):
        await stream.append(tick(offset=5))
    (e,) = await stream.append(tick(offset=2))
    assert e.offset == 2
    (d,) = await stream.append(durable(2))
    assert d.offset == 3

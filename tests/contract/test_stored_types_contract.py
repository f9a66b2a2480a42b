"""The summary of stored types: exact after every kind of commit, on every backend.

``Log.stored_types()`` reads a table the writer moves in each commit's
transaction, never the events. Whatever path a commit takes through the
writer (a lone append, a group of plain appends, keyed and refusable calls
in savepoints, ephemerals, two writers on one log), the summary must equal
what a full read of the log counts: per (path, type, payload version), the
number of events and their first and last offsets. A refused call, an
idempotent retry and an ephemeral add nothing.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from support.backends import Target

from streamkit import OffsetConflict
from streamkit.log import Log
from streamkit.records import StoredType


async def counted_by_reading(log: Log) -> list[StoredType]:
    """The summary as a full read of every path counts it (what the table must equal)."""
    found: dict[tuple[str, str, int], list[int]] = {}
    for path in await log.paths():
        for event in (await log.stream(path).read(limit=10_000)).events:
            seen = found.setdefault((path, event.type, event.payload_version), [])
            seen.append(event.offset)
    return [
        StoredType(path, type_, version, len(offsets), min(offsets), max(offsets))
        for (path, type_, version), offsets in sorted(found.items())
    ]


def event(type_: str, version: int = 1, **extra: Any) -> dict[str, Any]:
    return {"type": type_, "payload": {"n": 1}, "payload_version": version, **extra}


async def test_each_kind_of_commit_moves_the_summary_by_exactly_what_it_stored(
    log: Log,
) -> None:
    orders, audit = log.stream("/orders"), log.stream("/audit")
    assert await log.stored_types() == []
    await orders.append(event("placed"))  # a lone plain append of one event
    await orders.append(event("placed"), event("placed", 2), event("paid"))  # one call, three
    # Plain appends to two paths gathered into groups.
    await asyncio.gather(
        *(orders.append(event("placed", 2)) for _ in range(20)),
        *(audit.append(event("seen")) for _ in range(20)),
    )
    # Keyed: placed in savepoints; the retry is an idempotent hit and adds nothing.
    await orders.append(event("refund", 3, idempotency_key="r-1"))
    await orders.append(event("refund", 3, idempotency_key="r-1"))
    # A refused call beside committed ones in one group: only theirs count.
    head = await orders.head()
    outcomes = await asyncio.gather(
        orders.append(event("late"), expect_head=head - 1),
        orders.append(event("paid")),
        orders.append(event("placed", 2, idempotency_key="p-9")),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], OffsetConflict)
    # Ephemerals take offsets but are never stored.
    await orders.append({"type": "tick", "ephemeral": True})
    await orders.append(event("paid"))

    summary = await log.stored_types()
    assert summary == await counted_by_reading(log)
    assert "late" not in {row.type for row in summary}
    assert "tick" not in {row.type for row in summary}
    refund = next(row for row in summary if row.type == "refund")
    assert (refund.version, refund.count) == (3, 1)
    assert await log.stored_types("/audit") == [StoredType("/audit", "seen", 1, 20, 1, 20)]


async def test_a_random_mix_of_commits_from_two_writers_keeps_the_summary_exact(
    log_target: Target,
) -> None:
    """Seeded: waves of gathered calls of every kind from two logs on one storage."""
    rng = random.Random(33)
    async with (
        log_target.open(**log_target.backend.fast) as one,
        log_target.open(**log_target.backend.fast) as two,
    ):
        keys = [f"k{n}" for n in range(15)]
        for _wave in range(12):
            calls = []
            for _ in range(rng.randint(1, 25)):
                writer = rng.choice((one, two))
                stream = writer.stream(rng.choice(("/a", "/b", "/c")))
                inputs = []
                for _ in range(rng.randint(1, 4)):
                    extra: dict[str, Any] = {}
                    roll = rng.random()
                    if roll < 0.15:
                        extra["idempotency_key"] = rng.choice(keys)
                    elif roll < 0.25:
                        inputs.append({"type": "tick", "ephemeral": True})
                        continue
                    inputs.append(event(rng.choice("xyz"), rng.randint(1, 3), **extra))
                # A precondition that may hold or not: some calls are refused.
                head = rng.randint(0, 40) if rng.random() < 0.15 else None
                calls.append(stream.append(*inputs, expect_head=head))
            await asyncio.gather(*calls, return_exceptions=True)
        expected = await counted_by_reading(one)
        assert sum(row.count for row in expected) > 100
        assert await one.stored_types() == expected
        assert await two.stored_types() == expected


@pytest.mark.parametrize("path", ["/orders", None])
async def test_the_summary_is_sorted_and_filtered_by_path(log: Log, path: str | None) -> None:
    await log.stream("/orders").append(event("b", 2), event("a"), event("b"))
    await log.stream("/a").append(event("z"))
    rows = await log.stored_types(path)
    keys = [(row.path, row.type, row.version) for row in rows]
    assert keys == sorted(keys)
    assert {row.path for row in rows} == ({"/orders"} if path else {"/a", "/orders"})
    assert StoredType("/orders", "b", 1, 1, 3, 3) in rows
    assert StoredType("/orders", "b", 2, 1, 1, 1) in rows

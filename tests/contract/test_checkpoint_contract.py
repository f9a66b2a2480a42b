"""The checkpoint contract every CheckpointStorage keeps, over every store streamkit has.

Stores: ``streamkit.testing.memory_storage`` (what unit tests use), and each
backend's fenced host-store checkpoints (what a host uses), through the
:class:`~streamkit.protocols.CheckpointStorage` protocol alone.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from streamkit.testing import memory_storage
from support.backends import BACKENDS

from streamkit.backends import host_store
from streamkit.checkpoint import MAX_CHECKPOINT_STATE_BYTES, ReduceCheckpoint
from streamkit.errors import CheckpointTooLarge, CutoverRaced, InvalidRequest
from streamkit.host._lease_keeper import HeldLease
from streamkit.protocols import CheckpointStorage, LeaseAsk


@pytest.fixture(params=["memory", *sorted(BACKENDS)])
async def checkpoints(request: pytest.FixtureRequest) -> AsyncIterator[CheckpointStorage]:
    """One checkpoint store: the memory one, then a fenced store of each backend."""
    if request.param == "memory":
        with memory_storage() as storage:
            yield storage
        return
    target = BACKENDS[request.param].fresh()
    log = target.open()
    try:
        store = host_store(log)
        await store.prepare()
        lease = await store.try_acquire(LeaseAsk("/", "board", "owner", time.time(), 60.0))
        assert lease is not None
        held = HeldLease(
            lease, store.check_fence, ttl=60.0, renewal_started=time.monotonic(), clock=time.time
        )
        yield store.checkpoints(held)
    finally:
        await log.aclose()
        target.remove()


async def save(store: CheckpointStorage, slug: str, offset: int, state: str | None) -> None:
    await store.save(slug, reducer_version="1", reduced_through_offset=offset, state_json=state)


async def test_it_is_a_checkpoint_storage(checkpoints: CheckpointStorage) -> None:
    """Every store satisfies the protocol the engine depends on."""
    assert isinstance(checkpoints, CheckpointStorage)


async def test_a_saved_checkpoint_loads_back_and_an_unknown_slug_is_none(
    checkpoints: CheckpointStorage,
) -> None:
    """What was saved loads back field for field; a slug that never saved loads None."""
    await checkpoints.save(
        "board", reducer_version="3", reduced_through_offset=42, state_json='{"n":1}'
    )
    assert await checkpoints.load("board") == ReduceCheckpoint("3", 42, '{"n":1}')
    assert await checkpoints.load("nobody") is None


async def test_no_state_keeps_the_stored_state_and_moves_the_cursor(
    checkpoints: CheckpointStorage,
) -> None:
    """state_json=None moves the cursor; the stored state stays (None when never set)."""
    await save(checkpoints, "fresh", 3, None)
    assert await checkpoints.load("fresh") == ReduceCheckpoint("1", 3, None)
    await save(checkpoints, "board", 5, '{"n":7}')
    await save(checkpoints, "board", 9, None)
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 9, '{"n":7}')


async def test_a_lagging_state_keeps_its_own_offset_until_it_is_written(
    checkpoints: CheckpointStorage,
) -> None:
    """state_offset is stored as given: a kept state lags the cursor until a write makes it current."""
    await save(checkpoints, "board", 5, '{"n":5}')
    assert (await checkpoints.load("board")) == ReduceCheckpoint("1", 5, '{"n":5}', None)
    await checkpoints.save(
        "board", reducer_version="1", reduced_through_offset=9, state_json=None, state_offset=5
    )
    stored = await checkpoints.load("board")
    assert stored == ReduceCheckpoint("1", 9, '{"n":5}', 5)
    assert stored is not None
    assert stored.state_through_offset == 5
    await save(checkpoints, "board", 12, '{"n":12}')
    stored = await checkpoints.load("board")
    assert stored == ReduceCheckpoint("1", 12, '{"n":12}', None)
    assert stored is not None
    assert stored.state_through_offset == 12


async def test_a_first_checkpoint_may_lag_with_no_state(checkpoints: CheckpointStorage) -> None:
    """A first row with no state and an offset: the initial state, reduced through that offset."""
    await checkpoints.save(
        "fresh", reducer_version="1", reduced_through_offset=4, state_json=None, state_offset=0
    )
    assert await checkpoints.load("fresh") == ReduceCheckpoint("1", 4, None, 0)


async def test_slugs_are_independent(checkpoints: CheckpointStorage) -> None:
    """Two slugs keep two checkpoints."""
    await save(checkpoints, "a", 1, '"a"')
    await save(checkpoints, "b", 2, '"b"')
    assert await checkpoints.load("a") == ReduceCheckpoint("1", 1, '"a"')
    assert await checkpoints.load("b") == ReduceCheckpoint("1", 2, '"b"')


async def test_a_state_over_the_ceiling_is_refused_and_nothing_changes(
    checkpoints: CheckpointStorage,
) -> None:
    """Over MAX_CHECKPOINT_STATE_BYTES (UTF-8 bytes) is CheckpointTooLarge, not retryable."""
    await save(checkpoints, "board", 10, '{"n":1}')
    over = "é" * (MAX_CHECKPOINT_STATE_BYTES // 2 + 1)
    with pytest.raises(CheckpointTooLarge) as refused:
        await save(checkpoints, "board", 11, over)
    assert refused.value.retryable is False
    assert "nothing was written" in refused.value.message
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 10, '{"n":1}')


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("slug", ""),
        ("reducer_version", 1),
        ("reduced_through_offset", -1),
        ("reduced_through_offset", True),
        ("state_json", {"not": "text"}),
        ("state_json", '"\ud800"'),
        ("state_offset", 3),
        ("state_offset", -1),
        ("state_offset", True),
        ("state_offset", "1"),
        ("retain_from", -1),
        ("retain_from", True),
        ("retain_from", "7"),
        ("retain_from", 2.0),
    ],
)
async def test_bad_arguments_are_refused_before_anything_is_written(
    checkpoints: CheckpointStorage, field: str, value: Any
) -> None:
    """A malformed write is InvalidRequest and the stored checkpoint stays as it was."""
    await save(checkpoints, "board", 1, '"s"')
    args: dict[str, Any] = {
        "slug": "board",
        "reducer_version": "1",
        "reduced_through_offset": 2,
        "state_json": None,
    }
    args[field] = value
    with pytest.raises(InvalidRequest, match="nothing was written"):
        await checkpoints.save(**args)
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 1, '"s"')


async def test_what_the_state_needs_is_stored_with_each_write(
    checkpoints: CheckpointStorage,
) -> None:
    """retain_from moves with every write (None too), and a cutover writes its own."""
    await checkpoints.save(
        "board", reducer_version="1", reduced_through_offset=8, state_json="[]", retain_from=3
    )
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 8, "[]", retain_from=3)
    await checkpoints.save(
        "board", reducer_version="1", reduced_through_offset=9, state_json=None, retain_from=5
    )
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 9, "[]", retain_from=5)
    await save(checkpoints, "board", 10, None)
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 10, "[]")
    await checkpoints.save("board", reducer_version="2", reduced_through_offset=4, state_json="[]")
    await checkpoints.cut_over(
        "board",
        reducer_version="2",
        reduced_through_offset=10,
        state_json="[1]",
        replacing="1",
        retain_from=6,
    )
    assert await checkpoints.load("board") == ReduceCheckpoint(
        "2", 10, "[1]", cutover_offset=10, retain_from=6
    )


# -- versions: one serves, another builds in the shadow, a cutover swaps them -------------


async def test_a_second_version_keeps_a_row_of_its_own_and_does_not_serve(
    checkpoints: CheckpointStorage,
) -> None:
    await save(checkpoints, "board", 5, '{"n":5}')
    await checkpoints.save("board", reducer_version="2", reduced_through_offset=3, state_json="[3]")
    await save(checkpoints, "board", 6, None)
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 6, '{"n":5}')
    assert await checkpoints.load("board", "1") == ReduceCheckpoint("1", 6, '{"n":5}')
    assert await checkpoints.load("board", "2") == ReduceCheckpoint("2", 3, "[3]", serving=False)
    assert await checkpoints.load("board", "3") is None


async def test_a_cutover_makes_the_new_version_serve_and_keeps_the_old_row(
    checkpoints: CheckpointStorage,
) -> None:
    await save(checkpoints, "board", 6, '{"n":6}')
    await checkpoints.save("board", reducer_version="2", reduced_through_offset=3, state_json="[3]")
    await checkpoints.cut_over(
        "board", reducer_version="2", reduced_through_offset=6, state_json="[6]", replacing="1"
    )
    assert await checkpoints.load("board") == ReduceCheckpoint("2", 6, "[6]", cutover_offset=6)
    assert await checkpoints.load("board", "1") == ReduceCheckpoint(
        "1", 6, '{"n":6}', serving=False, retired_at=6
    )
    # The new version's later checkpoints keep it serving and its cutover offset.
    await checkpoints.save("board", reducer_version="2", reduced_through_offset=9, state_json=None)
    assert await checkpoints.load("board") == ReduceCheckpoint("2", 9, "[6]", cutover_offset=6)


async def test_a_first_cutover_of_a_slug_replaces_nothing(checkpoints: CheckpointStorage) -> None:
    await checkpoints.cut_over(
        "board", reducer_version="1", reduced_through_offset=0, state_json="[]", replacing=None
    )
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 0, "[]")


@pytest.mark.parametrize(
    ("replacing", "through"), [("1", 5), ("0", 6), (None, 6)], ids=["outran", "other", "none"]
)
async def test_a_cutover_the_serving_version_outran_is_refused_and_nothing_changes(
    checkpoints: CheckpointStorage, replacing: str | None, through: int
) -> None:
    await save(checkpoints, "board", 6, '{"n":6}')
    await checkpoints.save("board", reducer_version="2", reduced_through_offset=3, state_json="[3]")
    with pytest.raises(CutoverRaced) as refused:
        await checkpoints.cut_over(
            "board",
            reducer_version="2",
            reduced_through_offset=through,
            state_json="[6]",
            replacing=replacing,
        )
    assert refused.value.retryable
    assert "nothing was written" in refused.value.message
    assert await checkpoints.load("board") == ReduceCheckpoint("1", 6, '{"n":6}')
    assert await checkpoints.load("board", "2") == ReduceCheckpoint("2", 3, "[3]", serving=False)

"""The lease and fenced-checkpoint contract every backend's HostStore keeps.

Written against :class:`~streamkit.protocols.HostStore` alone, so it runs
over every backend of ``support.backends`` (the ``store`` fixture).
"""

from __future__ import annotations

import time

import pytest

from streamkit.errors import LeaseLost
from streamkit.host._lease_keeper import HeldLease
from streamkit.log import Log
from streamkit.protocols import HostStore, Lease, LeaseAsk

TTL = 10.0
NOW = 1_000.0


async def take(store: HostStore, owner: str, *, stale: Lease | None = None) -> Lease | None:
    return await store.try_acquire(LeaseAsk("/", "board", owner, NOW, TTL, stale=stale))


async def fenced(log: Log, store: HostStore, lease: Lease, now: float = NOW) -> None:
    """Run the stored half of the fence inside a write transaction, as a fenced write does."""
    await log.write_transaction(lambda conn: store.check_fence(conn, lease, now))


async def test_a_free_lease_is_taken_at_generation_one_and_read_back(store: HostStore) -> None:
    """The first holder gets generation 1 until now + ttl; the stored row says so."""
    lease = await take(store, "a")
    assert lease is not None
    assert (lease.owner, lease.generation, lease.expires_at) == ("a", 1, NOW + TTL)
    assert await store.read_lease("/", "board") == lease
    assert await store.read_lease("/", "other") is None


async def test_a_held_lease_is_not_taken_by_another_owner(store: HostStore) -> None:
    """Without a stale row to take over, another owner gets None and the row is unchanged."""
    first = await take(store, "a")
    assert await take(store, "b") is None
    assert await store.read_lease("/", "board") == first


async def test_a_stale_row_is_taken_over_only_unchanged(store: HostStore) -> None:
    """A takeover names the row it watched; a renewal in between defeats it; a success fences."""
    first = await take(store, "a")
    assert first is not None
    renewer = store.lease_renewer(5.0)
    try:
        renewed = renewer.renew(first, NOW + 1, TTL)
    finally:
        renewer.close()
    assert (renewed.generation, renewed.beat) == (1, first.beat + 1)
    assert await take(store, "b", stale=first) is None  # it was renewed since it was watched
    taken = await take(store, "b", stale=renewed)
    assert taken is not None
    assert (taken.owner, taken.generation) == ("b", 2)


async def test_a_released_lease_keeps_its_generation(store: HostStore) -> None:
    """Release keeps the row; the next holder, even the same owner, gets the next generation."""
    first = await take(store, "a")
    assert first is not None
    assert await store.release(first) is True
    row = await store.read_lease("/", "board")
    assert row is not None
    assert row.released
    assert row.generation == 1
    again = await take(store, "a")
    assert again is not None
    assert again.generation == 2
    assert await store.release(first) is False  # that generation is gone


async def test_leases_of_other_paths_and_slugs_are_independent(store: HostStore) -> None:
    """One slug on two paths, or two slugs on one path, are separate leases."""
    assert await store.try_acquire(LeaseAsk("/a", "board", "a", NOW, TTL)) is not None
    assert await store.try_acquire(LeaseAsk("/b", "board", "b", NOW, TTL)) is not None
    assert await store.try_acquire(LeaseAsk("/a", "tasks", "b", NOW, TTL)) is not None


async def test_the_fence_passes_for_the_holder_and_refuses_after_a_takeover(
    log: Log, store: HostStore
) -> None:
    """Inside a transaction the fence admits the stored holder only, and only before expiry."""
    first = await take(store, "a")
    assert first is not None
    await fenced(log, store, first)
    with pytest.raises(LeaseLost):
        await fenced(log, store, first, now=NOW + TTL)  # expired by the holder's own clock
    taken = await take(store, "b", stale=first)
    assert taken is not None
    with pytest.raises(LeaseLost, match="'b'"):
        await fenced(log, store, first)
    await fenced(log, store, taken)


async def test_a_renewal_of_a_lease_taken_over_is_refused(store: HostStore) -> None:
    """The renewer says LEASE_LOST once another owner holds the row; it writes nothing."""
    first = await take(store, "a")
    assert first is not None
    taken = await take(store, "b", stale=first)
    assert taken is not None
    renewer = store.lease_renewer(5.0)
    try:
        with pytest.raises(LeaseLost):
            renewer.renew(first, NOW + 1, TTL)
    finally:
        renewer.close()
    assert await store.read_lease("/", "board") == taken


async def test_a_fenced_checkpoint_is_written_by_the_holder_only(store: HostStore) -> None:
    """Checkpoints of a held lease save; after a takeover the save is LEASE_LOST and writes nothing."""
    first = await take(store, "a")
    assert first is not None
    held = HeldLease(
        first, store.check_fence, ttl=TTL, renewal_started=time.monotonic(), clock=lambda: NOW
    )
    checkpoints = store.checkpoints(held)
    await checkpoints.save("board", reducer_version="1", reduced_through_offset=3, state_json="{}")
    assert await take(store, "b", stale=first) is not None
    with pytest.raises(LeaseLost):
        await checkpoints.save(
            "board", reducer_version="1", reduced_through_offset=9, state_json='{"x":1}'
        )
    stored = await checkpoints.load("board")
    assert stored is not None
    assert (stored.reduced_through_offset, stored.state_json) == (3, "{}")
    snapshot = await store.stored_snapshot("board")
    assert (snapshot["offset"], snapshot["state"]) == (3, {})

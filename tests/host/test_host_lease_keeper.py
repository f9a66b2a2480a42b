"""The host's hold on a lease: trusted for one ttl of monotonic time, renewed off the loop."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from streamkit.backends.sqlite.host_store import SqliteLeaseRenewer
from streamkit.backends.sqlite.leases import (
    check_fence,
    ensure_lease_table,
    leases,
    read_lease,
    try_acquire,
)
from streamkit.errors import LeaseLost
from streamkit.host._lease_keeper import HeldLease, LeaseKeeper
from streamkit.protocols import LeaseAsk

TTL = 2.0


class Monotonic:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "leases.db")
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        ensure_lease_table(conn)
    return path


def take(path: str, owner: str, now: float = 100.0) -> HeldLease:
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        lease = try_acquire(conn, LeaseAsk("/", "board", owner, now, TTL))
    assert lease is not None
    return HeldLease(
        lease, check_fence, ttl=TTL, renewal_started=time.monotonic(), clock=lambda: now
    )


def test_a_lease_is_trusted_for_one_ttl_of_monotonic_time(db: str) -> None:
    """check() passes until a ttl after the renewal began, then refuses with LEASE_LOST."""
    clock = Monotonic()
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        lease = try_acquire(conn, LeaseAsk("/", "board", "a", 100.0, TTL))
    assert lease is not None
    held = HeldLease(
        lease, check_fence, ttl=TTL, renewal_started=clock(), clock=lambda: 100.0, monotonic=clock
    )
    clock.now += TTL - 0.01
    held.check()
    clock.now += 0.01
    with pytest.raises(LeaseLost, match="more than its ttl of 2 s ago") as caught:
        held.check()
    assert "nothing was started or written" in caught.value.message
    held.renewed(lease, clock())
    held.check()


def test_the_fence_refuses_once_another_owner_took_the_row(db: str) -> None:
    """fence() inside a transaction fails when the stored row names someone else."""
    held = take(db, "a")
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        held.fence(conn)
        conn.execute("ROLLBACK")
        stale = read_lease(conn, "/", "board")
        assert try_acquire(conn, LeaseAsk("/", "board", "b", 100.0, TTL, stale=stale)) is not None
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(LeaseLost, match="'b' holds it at generation 2"):
            held.fence(conn)
        conn.execute("ROLLBACK")


async def test_the_keeper_renews_and_reports_a_taken_lease_on_the_loop(db: str) -> None:
    """One renew_all: a held lease gets a new beat; a taken one is marked lost and reported."""
    loop = asyncio.get_running_loop()
    keeper = LeaseKeeper(
        SqliteLeaseRenewer(db, 5.0), interval=60, ttl=TTL, clock=lambda: 100.0, loop=loop
    )
    mine = take(db, "a")
    lost: list[LeaseLost] = []
    keeper.hold(mine, lost.append)
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        keeper.renew_all()
        assert mine.lease.beat == 1
        assert [row.beat for row in leases(conn)] == [1]
        stale = read_lease(conn, "/", "board")
        assert try_acquire(conn, LeaseAsk("/", "board", "b", 100.0, TTL, stale=stale)) is not None
        keeper.renew_all()
    await asyncio.sleep(0.01)  # the report arrives through call_soon_threadsafe
    assert len(lost) == 1
    assert mine.lost is lost[0]
    with pytest.raises(LeaseLost):
        mine.check()
    # Dropped once lost: the next beat does not try again.
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        keeper.renew_all()
    await asyncio.sleep(0.01)
    assert len(lost) == 1

"""Leases with fencing: acquire, renew, expiry, takeover, release, and the fence itself."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, suppress
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamkit.backends.sqlite.leases import (
    Lease,
    check_fence,
    ensure_lease_table,
    leases,
    read_lease,
    release,
    renew,
    try_acquire,
)
from streamkit.errors import InvalidRequest, LeaseLost, StorageBusy, StorageError
from streamkit.protocols import LeaseAsk

TTL = 10.0


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:", isolation_level=None)
    ensure_lease_table(connection)
    yield connection
    connection.close()


def fenced(conn: sqlite3.Connection, lease: Lease, now: float) -> None:
    """check_fence the way the host calls it: inside a transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        check_fence(conn, lease, now)
    finally:
        conn.execute("ROLLBACK")


def take_stale(conn: sqlite3.Connection, owner: str, now: float) -> Lease | None:
    """Take over the row as it stands, as a host does after watching it unrenewed for a ttl."""
    return try_acquire(
        conn, LeaseAsk("/", "board", owner, now, TTL, stale=read_lease(conn, "/", "board"))
    )


def test_first_acquire_starts_at_generation_one(conn: sqlite3.Connection) -> None:
    """A lease nobody ever held is taken at generation 1, expiring at now + ttl."""
    lease = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert lease == Lease("/", "board", "host-a", 1, 110.0)
    assert leases(conn) == [lease]


def test_held_lease_is_refused_to_another_owner(conn: sqlite3.Connection) -> None:
    """A second owner gets None while the lease is unexpired, and the row is unchanged."""
    first = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert try_acquire(conn, LeaseAsk("/", "board", "host-b", 109.9, TTL)) is None
    assert leases(conn) == [first]


def test_acquire_by_current_holder_renews_same_generation(conn: sqlite3.Connection) -> None:
    """try_acquire by the unexpired holder extends it under the same generation."""
    try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    again = try_acquire(conn, LeaseAsk("/", "board", "host-a", 105.0, TTL))
    assert again == Lease("/", "board", "host-a", 1, 115.0, beat=1)


def test_takeover_of_the_observed_stale_row_bumps_generation(conn: sqlite3.Connection) -> None:
    """Another owner takes the lease, with the next generation, only as the stale row it saw."""
    try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    taken = take_stale(conn, "host-b", 105.0)
    assert taken == Lease("/", "board", "host-b", 2, 115.0)


def test_no_wall_clock_lets_another_owner_take_a_lease(conn: sqlite3.Connection) -> None:
    """Without an observed stale row, even a clock an hour ahead cannot take the lease."""
    first = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert try_acquire(conn, LeaseAsk("/", "board", "host-b", 100.0 + 3600, TTL)) is None
    assert leases(conn) == [first]


def test_a_renewal_since_the_observation_defeats_the_takeover(conn: sqlite3.Connection) -> None:
    """A row renewed after the taker looked at it is alive: the takeover changes nothing."""
    first = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert first is not None
    observed = read_lease(conn, "/", "board")
    # The holder's clock is frozen (an injected clock): the beat still moves.
    renewed = renew(conn, first, 100.0, TTL)
    assert renewed.beat == first.beat + 1
    assert try_acquire(conn, LeaseAsk("/", "board", "host-b", 200.0, TTL, stale=observed)) is None
    assert leases(conn) == [renewed]


def test_same_owner_reacquiring_after_expiry_gets_new_generation(
    conn: sqlite3.Connection,
) -> None:
    """Reacquiring an expired lease under the same owner string still fences the old holder."""
    old = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert old is not None
    new = try_acquire(conn, LeaseAsk("/", "board", "host-a", 111.0, TTL))
    assert new is not None
    assert new.generation == old.generation + 1
    with pytest.raises(LeaseLost):
        fenced(conn, old, 112.0)
    fenced(conn, new, 112.0)


def test_leases_are_per_path_and_slug(conn: sqlite3.Connection) -> None:
    """One slug on two paths, or two slugs on one path, are independent leases."""
    a = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    b = try_acquire(conn, LeaseAsk("/orders", "board", "host-b", 100.0, TTL))
    c = try_acquire(conn, LeaseAsk("/", "tasks", "host-b", 100.0, TTL))
    assert a is not None
    assert b is not None
    assert c is not None
    assert [lease.generation for lease in (a, b, c)] == [1, 1, 1]
    assert [(lease.path, lease.slug) for lease in leases(conn)] == [
        ("/", "board"),
        ("/", "tasks"),
        ("/orders", "board"),
    ]


def test_renew_extends_expiry(conn: sqlite3.Connection) -> None:
    """renew moves the expiry to now + ttl and keeps the generation."""
    lease = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert lease is not None
    renewed = renew(conn, lease, 108.0, TTL)
    assert renewed == Lease("/", "board", "host-a", 1, 118.0, beat=1)
    assert try_acquire(conn, LeaseAsk("/", "board", "host-b", 115.0, TTL)) is None


def test_renew_after_takeover_raises_and_changes_nothing(conn: sqlite3.Connection) -> None:
    """A holder whose lease was taken over cannot renew it; the new holder's row stays."""
    old = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert old is not None
    new = take_stale(conn, "host-b", 111.0)
    with pytest.raises(LeaseLost) as caught:
        renew(conn, old, 112.0, TTL)
    assert caught.value.code == "LEASE_LOST"
    assert caught.value.details["holder"] == "host-b"
    assert caught.value.details["holder_generation"] == 2
    assert "'host-b' holds it at generation 2" in str(caught.value)
    assert "not renewed" in str(caught.value)
    assert leases(conn) == [new]


def test_renew_of_expired_untaken_lease_is_allowed(conn: sqlite3.Connection) -> None:
    """An expired lease nobody took is renewed under the same generation."""
    lease = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert lease is not None
    with pytest.raises(LeaseLost, match=r"expired at 110\.0"):
        fenced(conn, lease, 111.0)
    renewed = renew(conn, lease, 111.0, TTL)
    assert renewed.generation == 1
    fenced(conn, renewed, 112.0)


def test_renew_of_released_lease_is_refused(conn: sqlite3.Connection) -> None:
    """A lease its holder released cannot be revived by renew."""
    lease = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert lease is not None
    assert release(conn, lease) is True
    with pytest.raises(LeaseLost, match="this holder released it"):
        renew(conn, lease, 101.0, TTL)


def test_check_fence_passes_for_holder_and_fails_for_stale_holder(
    conn: sqlite3.Connection,
) -> None:
    """Only the current, unexpired holder passes the fence; a stale one learns who holds it."""
    old = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert old is not None
    fenced(conn, old, 109.0)
    with pytest.raises(LeaseLost) as expired:
        fenced(conn, old, 110.0)
    assert "nobody took it yet" in str(expired.value)
    new = take_stale(conn, "host-b", 110.0)
    assert new is not None
    with pytest.raises(LeaseLost) as caught:
        fenced(conn, old, 111.0)
    message = str(caught.value)
    assert "'board'" in message
    assert "'/'" in message
    assert "held generation 1" in message
    assert "'host-b' holds it at generation 2" in message
    assert "nothing was written" in message
    assert "try_acquire" in message
    fenced(conn, new, 111.0)


def test_check_fence_refuses_to_run_outside_a_transaction(conn: sqlite3.Connection) -> None:
    """A fence checked outside the write's transaction is refused rather than trusted."""
    lease = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert lease is not None
    with pytest.raises(InvalidRequest, match="outside a transaction"):
        check_fence(conn, lease, 101.0)


def test_release_frees_lease_and_keeps_generation_counting(conn: sqlite3.Connection) -> None:
    """A released lease is free at once, and the next holder gets the next generation."""
    lease = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert lease is not None
    assert release(conn, lease) is True
    (row,) = leases(conn)
    assert row.released
    assert row.to_dict()["expires_at"] is None
    taken = try_acquire(conn, LeaseAsk("/", "board", "host-b", 101.0, TTL))
    assert taken == Lease("/", "board", "host-b", 2, 111.0)


def test_same_owner_reacquiring_after_release_gets_new_generation(
    conn: sqlite3.Connection,
) -> None:
    """Release then reacquire by the same owner string fences the released incarnation."""
    old = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert old is not None
    release(conn, old)
    new = try_acquire(conn, LeaseAsk("/", "board", "host-a", 101.0, TTL))
    assert new is not None
    assert new.generation == 2
    with pytest.raises(LeaseLost):
        fenced(conn, old, 102.0)


def test_release_by_non_holder_does_nothing(conn: sqlite3.Connection) -> None:
    """A stale holder's release leaves the current holder's lease in force."""
    old = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert old is not None
    new = take_stale(conn, "host-b", 110.0)
    assert new is not None
    assert release(conn, old) is False
    assert release(conn, Lease("/", "board", "host-b", 1, 999.0)) is False
    assert leases(conn) == [new]
    fenced(conn, new, 111.0)


def test_release_twice_reports_second_as_not_ours(conn: sqlite3.Connection) -> None:
    """Releasing an already released lease changes nothing and returns False."""
    lease = try_acquire(conn, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert lease is not None
    assert release(conn, lease) is True
    assert release(conn, lease) is False


def test_generation_strictly_increases_over_many_takeovers(conn: sqlite3.Connection) -> None:
    """Every takeover, by any owner, hands out a generation above all earlier ones."""
    now = 0.0
    seen: list[int] = []
    for turn in range(12):
        owner = f"host-{turn % 3}"
        lease = try_acquire(
            conn, LeaseAsk("/", "board", owner, now, TTL, stale=read_lease(conn, "/", "board"))
        )
        assert lease is not None
        seen.append(lease.generation)
        if turn % 2:
            release(conn, lease)
        now += TTL
    assert seen == list(range(1, 13))


@pytest.mark.parametrize(
    ("now", "ttl", "match"),
    [
        (100.0, 0.0, "ttl must be > 0"),
        (100.0, -1.0, "ttl must be > 0"),
        (float("nan"), 10.0, "now must be a finite number"),
        (100.0, float("inf"), "ttl must be a finite number"),
        (True, 10.0, "now must be a finite number"),
    ],
)
def test_bad_times_are_refused(
    conn: sqlite3.Connection, now: float, ttl: float, match: str
) -> None:
    """Non-finite times and non-positive ttls are refused before any SQL runs."""
    with pytest.raises(InvalidRequest, match=match):
        try_acquire(conn, LeaseAsk("/", "board", "host-a", now, ttl))
    assert leases(conn) == []


def test_empty_owner_is_refused(conn: sqlite3.Connection) -> None:
    """An empty owner string could not be told apart, so it is refused."""
    with pytest.raises(InvalidRequest, match="owner must be a non-empty string"):
        try_acquire(conn, LeaseAsk("/", "board", "", 100.0, TTL))


def test_sqlite_failures_become_storage_errors() -> None:
    """A missing table surfaces as StorageError naming the lease table, not sqlite3.Error."""
    with (
        closing(sqlite3.connect(":memory:")) as bare,
        pytest.raises(StorageError, match="streamkit_leases") as caught,
    ):
        try_acquire(bare, LeaseAsk("/", "board", "host-a", 100.0, TTL))
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)


def test_fence_and_write_are_atomic_across_two_connections(tmp_path: Path) -> None:
    """Two connections to one file: a stale holder's fenced write commits nothing after a takeover."""
    db = tmp_path / "leases.db"
    with (
        closing(sqlite3.connect(db, isolation_level=None, timeout=0)) as host_a,
        closing(sqlite3.connect(db, isolation_level=None, timeout=0)) as host_b,
    ):
        host_a.execute("PRAGMA journal_mode=WAL")
        ensure_lease_table(host_a)
        host_a.execute("CREATE TABLE checkpoints (slug TEXT PRIMARY KEY, cursor INTEGER)")

        def fenced_write(conn: sqlite3.Connection, lease: Lease, now: float, cursor: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                check_fence(conn, lease, now)
                conn.execute(
                    "INSERT INTO checkpoints VALUES ('board', ?)"
                    " ON CONFLICT (slug) DO UPDATE SET cursor = excluded.cursor",
                    (cursor,),
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        host_a.execute("BEGIN IMMEDIATE")
        lease_a = try_acquire(host_a, LeaseAsk("/", "board", "host-a", 100.0, TTL))
        host_a.execute("COMMIT")
        assert lease_a is not None
        fenced_write(host_a, lease_a, 101.0, 5)

        # While A holds its write transaction, B cannot slip a takeover in
        # between A's fence check and A's write.
        host_a.execute("BEGIN IMMEDIATE")
        check_fence(host_a, lease_a, 109.0)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            host_b.execute("BEGIN IMMEDIATE")
        host_a.execute("UPDATE checkpoints SET cursor = 6")
        host_a.execute("COMMIT")

        host_b.execute("BEGIN IMMEDIATE")
        assert try_acquire(host_b, LeaseAsk("/", "board", "host-b", 111.0, TTL)) is None
        lease_b = try_acquire(
            host_b,
            LeaseAsk("/", "board", "host-b", 111.0, TTL, stale=read_lease(host_b, "/", "board")),
        )
        host_b.execute("COMMIT")
        assert lease_b is not None
        assert lease_b.generation == 2

        with pytest.raises(LeaseLost, match="nothing was written"):
            fenced_write(host_a, lease_a, 109.5, 99)
        with pytest.raises(LeaseLost):
            renew(host_a, lease_a, 111.5, TTL)
        fenced_write(host_b, lease_b, 112.0, 7)

        assert host_a.execute("SELECT cursor FROM checkpoints").fetchall() == [(7,)]
        assert leases(host_a) == [lease_b]


def test_busy_database_surfaces_as_storage_busy(tmp_path: Path) -> None:
    """A lease call blocked by another writer's transaction raises the retryable StorageBusy."""
    db = tmp_path / "busy.db"
    with (
        closing(sqlite3.connect(db, isolation_level=None, timeout=0)) as first,
        closing(sqlite3.connect(db, isolation_level=None, timeout=0)) as second,
    ):
        ensure_lease_table(first)
        first.execute("BEGIN IMMEDIATE")
        with pytest.raises(StorageBusy) as caught:
            try_acquire(second, LeaseAsk("/", "board", "host-b", 100.0, TTL))
        first.execute("ROLLBACK")
    assert caught.value.retryable


OWNERS = ("a", "b", "c")
_operation = st.one_of(
    st.tuples(
        st.sampled_from(["acquire", "take-stale", "renew", "release", "check"]),
        st.sampled_from(OWNERS),
    ),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 3.0, 9.99, 10.0, 15.0])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_operation, max_size=60), st.sampled_from([1.0, 5.0, 10.0]))
def test_any_interleaving_keeps_one_fence_holder_and_fresh_generations(
    operations: list[tuple[str, object]], ttl: float
) -> None:
    """For any schedule of 3 owners, at most one passes the fence and generations never repeat."""
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as db:
        ensure_lease_table(db)
        now = 1000.0
        held: dict[str, Lease | None] = dict.fromkeys(OWNERS)
        granted: list[int] = []
        history: list[Lease] = []
        for kind, arg in operations:
            if kind == "advance":
                assert isinstance(arg, float)
                now += arg
                continue
            owner = str(arg)
            mine = held[owner]
            if kind in ("acquire", "take-stale"):
                stale = read_lease(db, "/", "board") if kind == "take-stale" else None
                lease = try_acquire(db, LeaseAsk("/", "board", owner, now, ttl, stale=stale))
                if lease is not None:
                    if mine is None or lease.generation != mine.generation:
                        # A takeover: strictly newer than every generation handed out.
                        assert all(lease.generation > g for g in granted)
                        granted.append(lease.generation)
                    held[owner] = lease
                    history.append(lease)
            elif kind == "renew" and mine is not None:
                try:
                    renewed = renew(db, mine, now, ttl)
                    held[owner] = renewed
                    history.append(renewed)
                except LeaseLost:
                    held[owner] = None
            elif kind == "release" and mine is not None:
                release(db, mine)
                held[owner] = None
            elif kind == "check" and mine is not None:
                with suppress(LeaseLost):
                    fenced(db, mine, now)
            # Every lease ever handed out, stale ones included, faces the fence.
            passing = set()
            for candidate in history:
                try:
                    fenced(db, candidate, now)
                except LeaseLost:
                    continue
                passing.add((candidate.owner, candidate.generation))
            assert len(passing) <= 1
        assert len(granted) == len(set(granted))


def test_a_lease_table_from_before_beats_gains_the_column() -> None:
    """ensure_lease_table adds ``beat`` to an older table and keeps its rows (beat 0)."""
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as db:
        db.execute(
            "CREATE TABLE streamkit_leases (path TEXT NOT NULL, slug TEXT NOT NULL,"
            " owner TEXT NOT NULL, generation INTEGER NOT NULL, expires_at REAL NOT NULL,"
            " PRIMARY KEY (path, slug)) WITHOUT ROWID"
        )
        db.execute("INSERT INTO streamkit_leases VALUES ('/', 'board', 'host-a', 3, 110.0)")
        ensure_lease_table(db)
        ensure_lease_table(db)
        assert leases(db) == [Lease("/", "board", "host-a", 3, 110.0, beat=0)]
        renewed = renew(db, Lease("/", "board", "host-a", 3, 110.0), 105.0, TTL)
        assert renewed.beat == 1

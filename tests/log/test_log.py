"""The log on SQLite: opening, the writer and its commits, durability, what the file holds.

The backend-neutral rules of the log are in ``tests/contract/test_log_contract.py``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.log import offsets, order

from streamkit import (
    SPEED_TRICKS,
    IdempotencyConflict,
    InvalidEvent,
    InvalidRequest,
    LogClosed,
    LogOpenError,
    OffsetConflict,
    StorageBusy,
    StorageError,
    open_log,
)
from streamkit.backends.sqlite import _writer as writer_module
from streamkit.errors import LeaseLost, LogTampered
from streamkit.events import format_timestamp
from streamkit.log import Log


def empty(path: Path) -> None:
    path.write_bytes(b"")


def content(path: Path) -> bytes:
    return path.read_bytes()


def tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


# -- opening ------------------------------------------------------------------------------


async def test_open_creates_a_wal_log_of_the_current_schema_version(log_file: Path) -> None:
    """A new file becomes a WAL-mode log whose streamkit_meta says the current schema_version."""
    async with open_log(log_file) as log:
        assert log.path == str(log_file)
        mode = await log.query(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0])
        assert mode == "wal"
        version = await log.query(
            lambda c: c.execute(
                "SELECT value FROM streamkit_meta WHERE key = 'schema_version'"
            ).fetchone()[0]
        )
        assert version == "10"
    assert {"streamkit_meta", "streamkit_events", "streamkit_heads", "streamkit_claims"} <= (
        tables(log_file)
    )


async def test_open_initializes_an_empty_file(log_file: Path) -> None:
    """A zero-byte file is a new, empty SQLite database: it becomes a log."""
    empty(log_file)
    async with open_log(log_file) as log:
        assert (await log.stream().append(order(1)))[0].offset == 1


async def test_reopen_keeps_the_events(log_file: Path) -> None:
    """Events committed before a close are read back after a reopen."""
    async with open_log(log_file) as log:
        await log.stream("/a").append(order(1), order(2))
    async with open_log(log_file) as log:
        assert await offsets(log, "/a") == [1, 2]
        assert (await log.stream("/a").append(order(3)))[0].offset == 3


@pytest.mark.parametrize(
    "content",
    [b"this is not a database at all, just text\n" * 20, b"SQLite format 3\x00" + b"\xff" * 200],
    ids=["text", "bad-header"],
)
def test_a_file_that_is_not_sqlite_is_refused_unmodified(log_file: Path, content: bytes) -> None:
    """A file that is not a SQLite database is refused with LOG_OPEN_REFUSED and left byte-identical."""
    log_file.write_bytes(content)
    with pytest.raises(LogOpenError) as refused:
        open_log(log_file)
    assert refused.value.code == "LOG_OPEN_REFUSED"
    assert "not modified" in str(refused.value)
    assert log_file.read_bytes() == content


def test_a_foreign_sqlite_database_is_refused_unmodified(log_file: Path) -> None:
    """A SQLite file with other tables and no streamkit_meta is refused and left byte-identical."""
    conn = sqlite3.connect(log_file)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    before = log_file.read_bytes()
    with pytest.raises(LogOpenError, match="not a streamkit log"):
        open_log(log_file)
    assert log_file.read_bytes() == before
    assert not Path(f"{log_file}-wal").exists()


async def test_an_unknown_schema_version_is_refused_unmodified(log_file: Path) -> None:
    """A streamkit log of another schema version is refused and left byte-identical."""
    async with open_log(log_file) as log:
        await log.stream().append(order(1))
    conn = sqlite3.connect(log_file)
    conn.execute("UPDATE streamkit_meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = content(log_file)
    with pytest.raises(LogOpenError, match="schema_version is '99'"):
        open_log(log_file)
    assert content(log_file) == before


def test_a_directory_or_missing_parent_is_refused(tmp_path: Path) -> None:
    """A path that names a directory, or lies in a missing directory, is refused."""
    with pytest.raises(LogOpenError, match="directory"):
        open_log(tmp_path)
    with pytest.raises(LogOpenError, match="does not exist"):
        open_log(tmp_path / "missing" / "log.db")


@pytest.mark.parametrize(
    "kwargs",
    [{"synchronous": "OFF"}, {"busy_timeout": -1}, {"busy_timeout": float("nan")}],
    ids=["synchronous", "negative-timeout", "nan-timeout"],
)
def test_bad_open_options_are_refused(log_file: Path, kwargs: dict[str, Any]) -> None:
    """Unsupported open options raise INVALID_REQUEST and create no file."""
    with pytest.raises(InvalidRequest):
        open_log(log_file, **kwargs)
    assert not log_file.exists()


@pytest.mark.parametrize(("synchronous", "level"), [("FULL", 2), ("NORMAL", 1)])
async def test_synchronous_setting_reaches_the_writer(
    log_file: Path, synchronous: Any, level: int
) -> None:
    """The writer connection runs at the synchronous level the log was opened with."""
    async with open_log(log_file, synchronous=synchronous) as log:
        got = await log.write_transaction(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
        assert got == level


# -- appending ----------------------------------------------------------------------------


async def test_created_at_comes_from_the_injected_clock(log_file: Path) -> None:
    """created_at is the log's clock formatted as UTC ISO-8601."""
    async with open_log(log_file, clock=lambda: 1_800_000_000.25) as log:
        (event,) = await log.stream().append(order(1))
        assert event.created_at == format_timestamp(1_800_000_000.25)
        assert event.created_at == "2027-01-15T08:00:00.250000Z"


# -- reading ------------------------------------------------------------------------------


# -- claims -------------------------------------------------------------------------------


# -- the writer and reader connections ----------------------------------------------------


async def test_write_transaction_commits_on_return(log: Log) -> None:
    """write_transaction commits what fn wrote and returns fn's result."""

    def create(conn: sqlite3.Connection) -> int:
        conn.execute("CREATE TABLE leases (slug TEXT PRIMARY KEY, holder TEXT)")
        conn.execute("INSERT INTO leases VALUES ('mailer', 'host-1')")
        return 7

    assert await log.write_transaction(create) == 7
    rows = await log.query(lambda c: c.execute("SELECT * FROM leases").fetchall())
    assert rows == [("mailer", "host-1")]


@pytest.mark.speed_trick
async def test_write_transaction_runs_inline_only_on_request_and_on_an_idle_loop(
    log: Log,
) -> None:
    """inline=True runs fn on the loop's thread when nothing else is ready; else on the writer's."""
    await log.write_transaction(lambda c: c.execute("CREATE TABLE t (x)"))

    def where(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t VALUES (1)")
        return threading.get_ident()

    here = threading.get_ident()
    ran = [await log.write_transaction(where, inline=True)]
    while ran[-1] != here and len(ran) < 50:
        # The writer thread may still hold its connection for a moment after settling the
        # call before (on a loaded machine): a busy writer is declined, and rightly so.
        await asyncio.sleep(0.02)
        ran.append(await log.write_transaction(where, inline=True))
    assert ran[-1] == here
    assert await log.write_transaction(where) != here
    asyncio.get_running_loop().call_soon(lambda: None)  # something else waits to run
    assert await log.write_transaction(where, inline=True) != here
    count = await log.query(lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0])
    assert count == len(ran) + 2


async def test_an_inline_write_transaction_leaves_a_foreign_lock_to_the_thread(
    log_file: Path,
) -> None:
    """Another process holds the lock: the inline transaction waits on the thread, not the loop."""
    async with open_log(log_file, busy_timeout=10.0) as log:
        await log.write_transaction(lambda c: c.execute("CREATE TABLE t (x)"))
        other = sqlite3.connect(log_file, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            ran_on: list[int] = []

            def insert(conn: sqlite3.Connection) -> None:
                ran_on.append(threading.get_ident())
                conn.execute("INSERT INTO t VALUES (1)")

            pending = asyncio.create_task(log.write_transaction(insert, inline=True))
            await asyncio.sleep(0.05)  # the loop turns while the transaction waits
            assert not pending.done()
            other.execute("COMMIT")
            await asyncio.wait_for(pending, 5)
        finally:
            other.close()
        assert len(ran_on) == 1
        assert ran_on[0] != threading.get_ident()
        assert await log.query(lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0]) == 1


async def test_write_transaction_rolls_back_and_reraises(log: Log) -> None:
    """If fn raises, its writes are rolled back and its exception reaches the caller."""
    await log.write_transaction(lambda c: c.execute("CREATE TABLE t (x)"))

    def fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (1)")
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await log.write_transaction(fail)
    with pytest.raises(StorageError):
        await log.write_transaction(lambda c: c.execute("INSERT INTO missing VALUES (1)"))
    assert await log.query(lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0]) == 0
    assert (await log.stream().append(order(1)))[0].offset == 1


async def test_query_cannot_write(log: Log) -> None:
    """The reader connection is read-only: a write through query() is a StorageError."""
    with pytest.raises(StorageError):
        await log.query(lambda c: c.execute("CREATE TABLE nope (x)"))


async def test_a_held_lock_is_a_retryable_storage_busy(log_file: Path) -> None:
    """An append that cannot get the write lock within busy_timeout is STORAGE_BUSY and writes nothing."""
    async with open_log(log_file, busy_timeout=0.05) as log:
        await log.stream().append(order(1))
        other = sqlite3.connect(log_file, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(StorageBusy) as refused:
                await log.stream().append(order(2))
            assert refused.value.retryable
            assert refused.value.code == "STORAGE_BUSY"
            other.execute("ROLLBACK")
        finally:
            other.close()
        assert (await log.stream().append(order(3)))[0].offset == 2
        assert log.stats.refused == 0


# -- group commit -------------------------------------------------------------------------


async def test_concurrent_appends_share_one_transaction(log: Log) -> None:
    """Calls queued together commit in one transaction; a refused one rolls back alone."""
    stream = log.stream()
    await stream.append(order(0, idempotency_key="taken"))
    entered, release = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        entered.set()
        release.wait(10)

    holder = asyncio.create_task(log.write_transaction(hold))
    await asyncio.to_thread(entered.wait, 10)
    before = log.stats.transactions
    events = [order(n) for n in range(1, 41)]
    events[10] = order(99, offset=1)
    events[20] = order(98, idempotency_key="taken")
    tasks = [asyncio.create_task(stream.append(e)) for e in events]
    await asyncio.sleep(0)
    release.set()
    await holder
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[10], OffsetConflict)
    assert isinstance(results[20], IdempotencyConflict)
    landed = [r[0].offset for r in results if isinstance(r, list)]
    assert landed == list(range(2, 40))
    assert log.stats.transactions == before + 2  # the held transaction, then one group
    assert log.stats.refused == 2
    assert await offsets(log) == list(range(1, 40))


# -- closing ------------------------------------------------------------------------------


async def test_close_is_idempotent_and_later_use_raises_log_closed(log_file: Path) -> None:
    """close()/aclose() may be repeated; any later use raises LOG_CLOSED."""
    log = open_log(log_file)
    stream = log.stream()
    await stream.append(order(1))
    await log.aclose()
    await log.aclose()
    log.close()
    assert log.closed
    for attempt in (
        stream.append(order(2)),
        stream.read(),
        stream.head(),
        stream.claim(1.0, claimant="p"),
        stream.claims(),
        log.paths(),
        log.query(lambda c: None),
        log.write_transaction(lambda c: None),
    ):
        with pytest.raises(LogClosed):
            await attempt
    with pytest.raises(LogClosed):
        stream.follow()
    with pytest.raises(LogClosed):
        log.stream("/new")


async def test_aclose_waits_for_queued_appends(log_file: Path) -> None:
    """Appends queued before aclose() commit; aclose returns after them."""
    log = open_log(log_file)
    stream = log.stream()
    tasks = [asyncio.create_task(stream.append(order(n))) for n in range(50)]
    await asyncio.sleep(0)
    await log.aclose()
    assert all(t.done() for t in tasks)
    assert sorted(t.result()[0].offset for t in tasks) == list(range(1, 51))
    async with open_log(log_file) as again:
        assert await again.stream().head() == 50


def test_sync_close_and_context_manager(log_file: Path) -> None:
    """A log used without an event loop closes with close() or a with block."""
    with open_log(log_file) as log:
        assert not log.closed
    assert log.closed
    log.close()


# -- in memory ----------------------------------------------------------------------------


async def test_an_in_memory_log_keeps_every_rule() -> None:
    """':memory:' is a private log with the same behaviour, reads going through the writer."""
    async with open_log(":memory:") as log, open_log(":memory:") as other:
        assert log.path == ":memory:"
        stream = log.stream("/m")
        await stream.append(order(1, idempotency_key="k"), {"type": "e", "ephemeral": True})
        (retry,) = await stream.append(order(1, idempotency_key="k"))
        (durable,) = await stream.append(order(2))
        assert (retry.offset, durable.offset) == (1, 3)
        page = await stream.read()
        assert [e.offset for e in page.events] == [1, 3]
        assert await log.paths() == ["/m"]
        assert await other.paths() == []
        await stream.claim(5.0, claimant="p")
        assert await stream.claims() == {"p": 5.0}


@pytest.mark.speed_trick
@pytest.mark.parametrize("inline", [True, False])
async def test_a_lone_append_commits_inline_only_when_asked(log_file: Path, inline: bool) -> None:
    """With inline commits a lone append commits on the loop's thread; without, on the writer's."""
    log = open_log(log_file, inline_commits=inline)
    try:
        threads: set[int] = set()
        log._backend.writer._conn.set_trace_callback(
            lambda sql: threads.add(threading.get_ident()) if sql.startswith("INSERT") else None
        )
        await log.stream().append(order(1))
        assert (threads == {threading.get_ident()}) is inline
        assert len(threads) == 1
    finally:
        await log.aclose()


async def test_an_inline_commit_never_blocks_the_loop_on_a_foreign_lock(log_file: Path) -> None:
    """With another process holding the write lock, the append waits on the thread, not the loop."""
    async with open_log(log_file, busy_timeout=10.0) as log:
        stream = log.stream()
        await stream.append(order(1))
        other = sqlite3.connect(log_file, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            pending = asyncio.create_task(stream.append(order(2)))
            ticks = 0
            for _ in range(20):  # the loop keeps turning while the append waits for the lock
                await asyncio.sleep(0.005)
                ticks += 1
            assert ticks == 20
            assert not pending.done()
            other.execute(
                'INSERT INTO streamkit_events (path, "offset", type, payload, metadata, '
                "created_at) VALUES ('/', 2, 'foreign', '{}', '{}', 'now')"
            )
            other.execute("COMMIT")
            (appended,) = await asyncio.wait_for(pending, 5)
        finally:
            other.close()
        # It ran after the foreign commit, on what that commit left: the next offset.
        assert appended.offset == 3
        page = await stream.read()
        assert [(e.offset, e.type) for e in page.events] == [
            (1, "order.placed"),
            (2, "foreign"),
            (3, "order.placed"),
        ]


async def test_a_lone_plain_append_is_one_short_transaction(log: Log) -> None:
    """One plain event on an idle loop: BEGIN, a look for others' commits, the row, COMMIT.
    The path's heads row is set by the writer's first commit there, and a type's summary
    row by its first event; neither by this one (under STREAMKIT_PLAIN=1 each commit
    raises the heads row and settles the summary)."""
    stream = log.stream()
    await stream.append(order(1))
    await stream.append({"type": "shaped", "payload": {}})
    statements: list[str] = []
    log._backend.writer._conn.set_trace_callback(statements.append)
    before = log.stats
    (appended,) = await stream.append(
        {
            "type": "shaped",
            "payload": {"pair": (1, 2), 3: "x"},
            "metadata": {"m": 1},
            "source": {"tool": "cli"},
        }
    )
    log._backend.writer._conn.set_trace_callback(None)
    words = [statement.split() for statement in statements]
    plain = [
        "INSERT INTO streamkit_heads",
        "INSERT INTO streamkit_type_summary",
        "UPDATE",
    ]
    assert [w[0] if w[0] != "INSERT" else " ".join(w[:3]) for w in words] == [
        "BEGIN",
        "PRAGMA",
        "INSERT INTO streamkit_events",
        *([] if SPEED_TRICKS else plain),
        "COMMIT",
    ]
    assert (log.stats.transactions, log.stats.appended) == (
        before.transactions + 1,
        before.appended + 1,
    )
    # Returned as stored: the tuple became a list and the int key a string, as a read shows.
    (read,) = (await stream.read(2)).events
    assert appended == read
    assert appended.payload == {"pair": [1, 2], "3": "x"}
    assert (appended.metadata, appended.source) == ({"m": 1}, {"tool": "cli"})


async def test_absent_source_and_key_are_stored_as_null_on_every_path(log: Log) -> None:
    """The insert binds '' for an absent source or key (cheaper than None); SQL stores NULL."""
    stream = log.stream()
    await stream.append(order(1))  # a lone plain append
    await stream.append(order(2), order(3))  # a call of several
    await stream.append(order(4, idempotency_key="k"))  # a keyed call
    await asyncio.gather(stream.append(order(5)), stream.append(order(6)))  # a group
    await stream.append({**order(7), "source": {"tool": "cli"}})
    rows = await log.query(
        lambda conn: conn.execute(
            'SELECT "offset", source, idempotency_key FROM streamkit_events ORDER BY "offset"'
        ).fetchall()
    )
    assert rows == [
        (1, None, None),
        (2, None, None),
        (3, None, None),
        (4, None, "k"),
        (5, None, None),
        (6, None, None),
        (7, '{"tool":"cli"}', None),
    ]


async def test_a_lone_append_that_sqlite_refuses_writes_nothing(log: Log) -> None:
    """A failure inside the short transaction is a StorageError; the next append takes the offset."""
    stream = log.stream()
    await stream.append(order(1))
    await log.write_transaction(
        lambda conn: conn.execute(
            "CREATE TRIGGER no_poison BEFORE INSERT ON streamkit_events "
            "WHEN NEW.type = 'poison' BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
        )
    )
    with pytest.raises(StorageError, match="poison refused") as refused:
        await stream.append({"type": "poison"})
    assert "nothing was written" in str(refused.value)
    (after,) = await stream.append(order(2))
    assert after.offset == 2
    assert [e.type for e in (await stream.read()).events] == ["order.placed"] * 2


async def test_a_lone_append_whose_clock_fails_writes_nothing(log_file: Path) -> None:
    """An exception that is not SQLite's reaches the caller as it is, after a rollback."""
    broken = False

    def clock() -> float:
        if broken:
            raise RuntimeError("the clock broke")
        return time.time()

    async with open_log(log_file, clock=clock) as log:
        stream = log.stream()
        await stream.append(order(1))
        broken = True
        with pytest.raises(RuntimeError, match="the clock broke"):
            await stream.append(order(2))
        broken = False
        (after,) = await stream.append(order(3))
        assert after.offset == 2
        assert [e.payload["n"] for e in (await stream.read()).events] == [1, 3]


async def test_a_lone_append_after_a_close_from_another_thread_is_refused(log: Log) -> None:
    """A close begun on another thread (the writer stops accepting) refuses the append."""
    stream = log.stream()
    await stream.append(order(1))
    await asyncio.to_thread(log._backend.writer.thread.request_close)
    with pytest.raises(LogClosed):
        await stream.append(order(2))


@pytest.mark.speed_trick
async def test_an_inline_commit_waits_out_a_follow_poll_instead_of_handing_over(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread polling for a follower holds the connection briefly: wait, stay inline."""
    # The wait is bounded (2 ms); on a loaded machine the poll can outlast that, so the
    # bound is widened here: what is pinned is that the commit waits, not how long.
    monkeypatch.setattr(writer_module, "POLL_WAIT_SECONDS", 1.0)
    stream = log.stream()
    writer = log._backend.writer
    polling = threading.Event()
    poll = writer._foreign.poll

    def slow_poll() -> None:
        polling.set()
        time.sleep(0.001)  # long enough for the append below to find the connection taken
        poll()

    writer._foreign.poll = slow_poll  # type: ignore[method-assign]
    threads: list[int] = []
    writer._conn.set_trace_callback(
        lambda sql: (
            threads.append(threading.get_ident())
            if sql.startswith("INSERT INTO streamkit_events")
            else None
        )
    )
    follow = stream.follow()
    try:
        for n in range(5):
            polling.clear()
            assert polling.wait(5)  # the thread is in a poll now, holding the connection
            await stream.append(order(n))
    finally:
        await follow.aclose()
    assert threads == [threading.get_ident()] * 5


async def test_inline_commits_keep_group_commit_for_concurrent_appends(log_file: Path) -> None:
    """Appends ready in the same turn share one transaction even with inline commits on."""
    async with open_log(log_file) as log:
        stream = log.stream()
        before = log.stats.transactions
        results = await asyncio.gather(*(stream.append(order(n)) for n in range(16)))
        assert sorted(r[0].offset for r in results) == list(range(1, 17))
        assert log.stats.transactions == before + 1


@pytest.mark.speed_trick
async def test_an_inline_group_refuses_one_call_alone(log_file: Path) -> None:
    """An inline group with a refused call commits the others, on the loop, in one transaction."""
    async with open_log(log_file) as log:
        stream = log.stream()
        await stream.append(order(0, idempotency_key="taken"))
        threads: set[int] = set()
        log._backend.writer._conn.set_trace_callback(
            lambda sql: threads.add(threading.get_ident()) if sql.startswith("INSERT") else None
        )
        before = log.stats.transactions
        results = await asyncio.gather(
            stream.append(order(1)),
            stream.append(order(2, offset=99)),  # a stale view: refused
            stream.append({**order(3), "idempotency_key": "taken"}),  # another body: refused
            stream.append(order(4)),
            return_exceptions=True,
        )
        assert isinstance(results[1], OffsetConflict)
        assert isinstance(results[2], IdempotencyConflict)
        assert [r[0].offset for r in (results[0], results[3])] == [2, 3]  # type: ignore[index]
        assert log.stats.transactions == before + 1
        assert threads == {threading.get_ident()}
        page = await stream.read()
        assert [e.payload["n"] for e in page.events] == [0, 1, 4]


@pytest.mark.speed_trick
async def test_a_group_that_cannot_be_refused_needs_no_savepoint(log_file: Path) -> None:
    """Calls without keys or offset preconditions share a group with no savepoint statements."""
    async with open_log(log_file) as log:
        stream = log.stream()
        statements: list[str] = []
        log._backend.writer._conn.set_trace_callback(statements.append)
        await asyncio.gather(
            stream.append(order(1)),
            stream.append({"type": "tick", "ephemeral": True}),
            stream.append(order(2), order(3)),
        )
        assert not [s for s in statements if s.startswith("SAVEPOINT")]
        statements.clear()
        await asyncio.gather(stream.append(order(4)), stream.append(order(5, idempotency_key="k")))
        assert [s for s in statements if s.startswith("SAVEPOINT")] == ["SAVEPOINT streamkit_group"]
        assert [e.payload["n"] for e in (await stream.read()).events] == [1, 2, 3, 4, 5]


async def test_the_writer_polls_only_when_no_transaction_looked_lately(log_file: Path) -> None:
    """Every commit looks for other processes' commits, so the follow poll waits behind the latest."""
    async with open_log(log_file) as log:
        writer = log._backend.writer
        polls: list[float] = []
        poll = writer._foreign.poll

        def counted() -> None:
            polls.append(time.monotonic())
            poll()

        writer._foreign.poll = counted  # type: ignore[method-assign]
        follow = log.stream().follow()
        try:
            await asyncio.sleep(0.05)
            assert polls  # following and idle: the writer polls
            writer._foreign.synced_at = time.monotonic() + 1.0  # as if a commit looked just now
            await asyncio.sleep(0.01)
            quiet_from = time.monotonic()
            await asyncio.sleep(0.2)
            assert [t for t in polls if t > quiet_from] == []
            await asyncio.sleep(1.0)
            assert [t for t in polls if t > quiet_from]  # due again once that look is old
        finally:
            await follow.aclose()


async def test_a_group_commits_on_the_thread_while_the_loop_has_other_work(log_file: Path) -> None:
    """With other callbacks ready, the group's fsync runs on the writer thread, not the loop."""
    async with open_log(log_file) as log:
        stream = log.stream()
        threads: set[int] = set()
        log._backend.writer._conn.set_trace_callback(
            lambda sql: threads.add(threading.get_ident()) if sql.startswith("INSERT") else None
        )
        loop = asyncio.get_running_loop()
        busy = True

        def other_work() -> None:  # always ready again: the loop is never idle
            if busy:
                loop.call_soon(other_work)

        loop.call_soon(other_work)
        try:
            results = await asyncio.gather(stream.append(order(1)), stream.append(order(2)))
        finally:
            busy = False
        assert sorted(r[0].offset for r in results) == [1, 2]
        assert len(threads) == 1
        assert threading.get_ident() not in threads


# -- fenced appends (what a host's engine writes) ---------------------------------------------


def _refuse(conn: sqlite3.Connection) -> None:
    assert conn.in_transaction  # the fence runs inside the append's own transaction
    raise LeaseLost("lease lost in this test; nothing was written", details={})


async def test_a_refusing_fence_writes_nothing_and_leaves_no_hole(log_file: Path) -> None:
    """A fence that raises refuses the whole call; the next append takes the next offset."""
    async with open_log(log_file) as log:
        stream = log.stream("/")
        await stream.append(order(1))
        with pytest.raises(LeaseLost):
            await stream.append(order(2), order(3), fence=_refuse)
        with pytest.raises(LeaseLost):
            await stream.append(order(4), fence=_refuse)
        (later,) = await stream.append(order(5))
        assert later.offset == 2
        assert await offsets(log) == [1, 2]


async def test_a_fenced_call_in_a_group_is_refused_alone(log_file: Path) -> None:
    """Appends committed in one group: the fenced-off call is refused, its peers commit."""
    async with open_log(log_file) as log:
        stream = log.stream("/")
        passed: list[bool] = []

        def allow(conn: sqlite3.Connection) -> None:
            passed.append(conn.in_transaction)

        results = await asyncio.gather(
            stream.append(order(1)),
            stream.append(order(2), fence=_refuse),
            stream.append(order(3), fence=allow),
            return_exceptions=True,
        )
        assert isinstance(results[1], LeaseLost)
        assert passed == [True]
        assert await offsets(log) == [1, 2]
        assert [e["payload"]["n"] for e in await _payloads(log)] == [1, 3]


async def test_a_fence_is_not_asked_for_ephemerals_only(log_file: Path) -> None:
    """Ephemerals reach no transaction, so a call of ephemerals only does not run the fence."""
    async with open_log(log_file) as log:
        (event,) = await log.stream("/").append({"type": "tick", "ephemeral": True}, fence=_refuse)
        assert event.ephemeral


async def _payloads(log: Log) -> list[dict[str, Any]]:
    page = await log.stream("/").read()
    return [{"payload": e.payload} for e in page.events]


# -- tampering and clocks ---------------------------------------------------------------------


def _remove_wal(db: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink()


async def test_a_wal_deleted_under_a_live_writer_refuses_every_later_write(log_file: Path) -> None:
    """Deleting -wal and -shm under an open log: its next writes fail LOG_TAMPERED, none lands."""
    async with open_log(log_file) as log:
        stream = log.stream("/")
        await stream.append(order(1), order(2))
        _remove_wal(log_file)
        for call in (stream.append(order(3)), stream.append(order(4), order(5))):
            with pytest.raises(LogTampered) as caught:
                await call
            assert caught.value.code == "LOG_TAMPERED"
            assert "nothing was written" in caught.value.message
        with pytest.raises(LogTampered):
            await log.write_transaction(lambda conn: None)
    # No offset 3 was ever acknowledged, so none can be reused.


_HOLDER = """
import asyncio, sys
from streamkit import open_log

async def main(db):
    async with open_log(db) as log:
        await log.stream("/").append({"type": "held", "payload": {}})
        print("ready", flush=True)
        sys.stdin.readline()

asyncio.run(main(sys.argv[1]))
"""


async def test_opening_a_log_whose_wal_was_deleted_under_another_process_is_refused(
    log_file: Path,
) -> None:
    """A process that opens the file after its -wal went missing under a live one is refused."""
    import subprocess
    import sys

    holder = subprocess.Popen(  # noqa: ASYNC220 - a plain child that holds the file
        [sys.executable, "-c", _HOLDER, str(log_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        _remove_wal(log_file)
        with pytest.raises(LogTampered, match="another process has the log open"):
            open_log(log_file)
    finally:
        assert holder.stdin is not None
        assert holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    # With the holder gone the file opens again (what it holds is for the operator to check).
    async with open_log(log_file) as log:
        await log.stream("/").head()


async def test_created_at_never_goes_backwards_when_the_clock_does(log_file: Path) -> None:
    """A clock that steps back an hour: later commits keep the latest stamp, never an earlier one."""
    readings = iter([1_800_000_000.0, 1_800_000_000.5, 1_799_996_400.0, 1_799_996_401.0])
    async with open_log(log_file, clock=lambda: next(readings)) as log:
        stamps = []
        for n in range(4):
            (event,) = await log.stream("/").append(order(n))
            stamps.append(event.created_at)
    assert stamps == sorted(stamps)
    assert stamps[2] == stamps[1]


async def test_created_at_never_goes_backwards_across_processes_clocks(log_file: Path) -> None:
    """A writer whose clock is an hour behind stamps its commit no earlier than the latest one."""
    async with (
        open_log(log_file) as ahead,
        open_log(log_file, clock=lambda: time.time() - 3600) as behind,
    ):
        (first,) = await ahead.stream("/orders").append(order(1))
        (second,) = await behind.stream("/").append(order(2))
        (third,) = await behind.stream("/").append(order(3))
    assert first.created_at <= second.created_at <= third.created_at


# -- pages bounded by bytes -------------------------------------------------------------------


async def test_a_page_of_large_events_is_cut_by_bytes_with_an_exact_proof(log_file: Path) -> None:
    """Ten 900 KB events, limit 10: pages stop at 4 MiB, prove through their last event, not at head."""
    big = "x" * 900_000
    async with open_log(log_file) as log:
        stream = log.stream("/")
        for n in range(10):
            await stream.append({"type": "blob", "payload": {"n": n, "data": big}})
        pages = []
        after = 0
        while True:
            page = await stream.read(after, 10)
            pages.append(page)
            after = page.scanned_through_offset
            if page.at_head:
                break
    assert [len(page.events) for page in pages] == [4, 4, 2]
    for page in pages[:-1]:
        assert page.scanned_through_offset == page.events[-1].offset
        assert not page.at_head
    assert [e.payload["n"] for page in pages for e in page.events] == list(range(10))
    assert pages[-1].at_head


def test_a_page_always_holds_its_first_event_and_cuts_before_the_budget() -> None:
    """Whatever the budget, a page holds at least one event; it never holds one past the budget."""
    from streamkit._requests import PageRead
    from streamkit.backends.sqlite._read import read_page_sized

    conn = sqlite3.connect(":memory:")
    try:
        conn.execute(
            'CREATE TABLE streamkit_events (path TEXT, "offset" INTEGER, type TEXT, payload TEXT,'
            " metadata TEXT, source TEXT, idempotency_key TEXT, created_at TEXT,"
            " payload_version INTEGER)"
        )
        for offset, size in enumerate([50, 10, 10, 10, 40, 10], start=1):
            conn.execute(
                "INSERT INTO streamkit_events VALUES ('/', ?, 't', ?, '{}', NULL, NULL, 'now', NULL)",
                (offset, json.dumps({"d": "y" * size})),
            )
        first = read_page_sized(conn, PageRead("/", 0, 100), max_bytes=5)[0]
        assert ([e.offset for e in first.events], first.scanned_through_offset, first.at_head) == (
            [1],
            1,
            False,
        )
        middle = read_page_sized(conn, PageRead("/", 1, 100), max_bytes=70)[0]
        assert [e.offset for e in middle.events] == [2, 3, 4]
        assert (middle.scanned_through_offset, middle.at_head) == (4, False)
        rest = read_page_sized(conn, PageRead("/", 4, 100), max_bytes=10_000)[0]
        assert ([e.offset for e in rest.events], rest.at_head) == ([5, 6], True)
    finally:
        conn.close()


# -- integers out of range ---------------------------------------------------------------------


async def test_offsets_past_2_63_are_refused_with_a_coded_error(log_file: Path) -> None:
    """read, follow and an offset precondition at 2^63 name the argument and its range."""
    async with open_log(log_file) as log:
        stream = log.stream("/")
        with pytest.raises(InvalidRequest, match=r"after_offset must be an integer from 0 to"):
            await stream.read(2**63)
        with pytest.raises(InvalidRequest, match=r"after_offset must be an integer from 0 to"):
            stream.follow(2**63)
        with pytest.raises(InvalidEvent, match=r"'offset' must be an integer from 1 to"):
            await stream.append({"type": "t", "offset": 2**63})
        assert (await stream.read(2**63 - 1)).events == []


# -- expect_head: optimistic concurrency -------------------------------------------------------


async def test_expect_head_refuses_after_a_durable_append_not_after_ephemerals(
    log_file: Path,
) -> None:
    """expect_head=N passes while only ephemerals took offsets, and refuses once a durable one did."""
    async with open_log(log_file) as log:
        stream = log.stream("/")
        (first,) = await stream.append(order(1))
        await stream.append({"type": "tick", "ephemeral": True})  # takes offset 2
        (second,) = await stream.append(order(2), expect_head=first.offset)
        assert second.offset > 2
        with pytest.raises(OffsetConflict) as caught:
            await stream.append(order(3), order(4), expect_head=first.offset)
        assert caught.value.details == {
            "path": "/",
            "expected_head": first.offset,
            "actual_head": second.offset,
        }
        assert "nothing was appended" in caught.value.message
        assert await offsets(log) == [first.offset, second.offset]


async def test_expect_head_lets_the_retry_of_a_landed_append_return_it(log_file: Path) -> None:
    """A keyed append that landed, retried with the same expect_head, returns the first result."""
    async with open_log(log_file) as log:
        stream = log.stream("/")
        (first,) = await stream.append(order(1, idempotency_key="k1"), expect_head=0)
        (again,) = await stream.append(order(1, idempotency_key="k1"), expect_head=0)
        assert again.offset == first.offset
        with pytest.raises(OffsetConflict):
            await stream.append(order(2, idempotency_key="k2"), expect_head=0)


async def test_expect_head_is_checked_across_processes(log_file: Path) -> None:
    """Another process's append moves the head: a writer with a stale view is refused."""
    async with open_log(log_file) as mine, open_log(log_file) as theirs:
        (seen,) = await mine.stream("/").append(order(1))
        await theirs.stream("/").append(order(2))
        with pytest.raises(OffsetConflict):
            await mine.stream("/").append(order(3), expect_head=seen.offset)


@pytest.mark.speed_trick
async def test_a_lone_append_on_an_idle_loop_commits_without_yielding(log: Log) -> None:
    """SQLite commits inline: with nothing else ready on the loop, the append commits at once
    and its await never suspends (a PostgreSQL commit always goes to the writer thread)."""
    stream = log.stream()
    await stream.append(order(1))
    call = stream.append(order(2))
    with pytest.raises(StopIteration) as finished:
        call.send(None)
    (appended,) = finished.value.value
    assert appended.offset == 2
    # With another callback ready, a peer may still join: the append waits for the turn's end.
    asyncio.get_running_loop().call_soon(lambda: None)
    call = stream.append(order(3))
    waiting_on = call.send(None)
    assert isinstance(waiting_on, asyncio.Future)
    assert not waiting_on.done()
    await asyncio.wait([waiting_on])
    with pytest.raises(StopIteration) as finished:
        call.send(None)
    assert finished.value.value[0].offset == 3


async def test_a_short_transaction_shares_the_group_commit_of_the_appends_beside_it(
    log: Log,
) -> None:
    """Appends and a short transaction issued in one loop turn commit in ONE transaction."""
    await log.write_transaction(lambda c: c.execute("CREATE TABLE t (x)"))
    stream = log.stream("/")
    before = log.stats.transactions
    results = await asyncio.gather(
        stream.append({"type": "a"}),
        log.write_transaction(
            lambda c: c.execute("INSERT INTO t VALUES (1)").rowcount, inline=True
        ),
        stream.append({"type": "b"}),
    )
    assert results[1] == 1
    assert log.stats.transactions == before + 1
    assert [e.type for e in (await stream.read()).events] == ["a", "b"]
    assert await log.query(lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0]) == 1


async def test_a_failing_transaction_in_a_group_rolls_back_alone(log: Log) -> None:
    """Its writes are undone and its caller gets its error; the appends beside it commit."""
    await log.write_transaction(lambda c: c.execute("CREATE TABLE t (x)"))
    stream = log.stream("/")

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (1)")
        raise ValueError("refused after one row")

    def missing_table(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO nowhere VALUES (1)")

    outcomes = await asyncio.gather(
        stream.append({"type": "a"}),
        log.write_transaction(half_then_fail, inline=True),
        log.write_transaction(missing_table, inline=True),
        log.write_transaction(lambda c: c.execute("INSERT INTO t VALUES (2)"), inline=True),
        stream.append({"type": "b"}),
        return_exceptions=True,
    )
    assert isinstance(outcomes[1], ValueError)
    assert isinstance(outcomes[2], StorageError)
    assert not isinstance(outcomes[3], BaseException)
    assert [e.type for e in (await stream.read()).events] == ["a", "b"]
    rows = await log.query(lambda c: c.execute("SELECT x FROM t").fetchall())
    assert rows == [(2,)]

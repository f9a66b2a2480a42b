"""The PostgreSQL writer when another session gets in its way: a deadlock, a frozen transaction.

A group the server aborts as a deadlock victim wrote nothing and runs again
(``backends.postgres._group_commit``); a writer session that sits idle
inside a transaction (its process frozen, say) is ended by the server, so
its locks do not hold every other writer for ever, and the next job
connects again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from support.backends import Target
from support.log import durable

from streamkit import Log
from streamkit.backends.postgres import _connect, _group_commit
from streamkit.errors import StorageBusy, StorageError

pytestmark = pytest.mark.slow


def _deadlocks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _writer_waits_on_a_lock(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'streamkit writer' "
        "AND wait_event_type = 'Lock'"
    ).fetchone()
    return row is not None and int(row[0]) > 0


async def _until(check: Any) -> None:
    """Poll ``check`` (the server's view, or another thread's flag) for up to 20 s."""
    async with asyncio.timeout(20):
        while not check():  # noqa: ASYNC110 (what is polled has no event to wait on)
            await asyncio.sleep(0.05)


async def _deadlocked_group(log: Log, url: str, schema: str) -> list[Any]:
    """Appends to /a and /b in one group while another session locks /b, then /a.

    Returns each append's outcome (its events, or the exception it raised)
    once the other session has its locks and has committed.
    """
    heads = f'"{schema}".streamkit_heads'
    await log.stream("/a").append(durable(1))
    await log.stream("/b").append(durable(1))
    with psycopg.connect(url, autocommit=True) as watch, psycopg.connect(url) as other:
        before = _deadlocks(watch)
        # The other session waits long before it looks for a cycle, so the server
        # picks the writer (which looks after its default second) as the victim.
        other.execute("SET deadlock_timeout = '30s'")
        other.execute(f"SELECT 1 FROM {heads} WHERE path = '/b' FOR UPDATE")
        # One loop turn: one group over both paths, locking /a, then waiting on /b.
        group = asyncio.gather(
            log.stream("/a").append(durable(2)),
            log.stream("/b").append(durable(2)),
            return_exceptions=True,
        )
        await _until(lambda: _writer_waits_on_a_lock(watch))

        def lock_a_then_commit() -> None:
            other.execute(f"SELECT 1 FROM {heads} WHERE path = '/a' FOR UPDATE")
            other.commit()

        closing = asyncio.get_running_loop().run_in_executor(None, lock_a_then_commit)
        outcomes = await asyncio.wait_for(group, 30)
        await asyncio.wait_for(closing, 30)
        assert _deadlocks(watch) > before
    return list(outcomes)


async def test_a_group_chosen_as_deadlock_victim_runs_again_and_commits(pg: Target) -> None:
    """Another session locks /b then /a while a group holds /a and waits on /b: both commit."""
    assert pg.schema is not None
    async with pg.open() as log:
        a, b = await _deadlocked_group(log, *pg.schema)
        assert [(e.path, e.offset) for e in (*a, *b)] == [("/a", 2), ("/b", 2)]
        for path in ("/a", "/b"):
            page = await log.stream(path).read()
            assert [e.offset for e in page.events] == [1, 2]


async def test_a_group_the_server_keeps_rolling_back_is_refused_as_busy(
    pg: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of reruns, the victim's callers get STORAGE_BUSY (not "unreachable"); nothing written."""
    monkeypatch.setattr(_group_commit, "RETRIES", 1)
    assert pg.schema is not None
    async with pg.open() as log:
        outcomes = await _deadlocked_group(log, *pg.schema)
        for outcome in outcomes:
            assert isinstance(outcome, StorageBusy)
            assert outcome.code == "STORAGE_BUSY"
            assert "nothing was written" in outcome.message
        for path in ("/a", "/b"):
            page = await log.stream(path).read()
            assert [e.offset for e in page.events] == [1]
        (event,) = await log.stream("/a").append(durable(3))
        assert event.offset == 2


def test_a_frozen_session_is_ended_before_the_writers_behind_it_give_up() -> None:
    """The idle-in-transaction limit is half the lock timeout, never under a second."""
    assert _connect.idle_in_transaction_timeout(5.0) == 2.5
    assert _connect.idle_in_transaction_timeout(0.2) == _connect.IDLE_IN_TRANSACTION_FLOOR
    options = _connect.session_options(5.0)
    assert options == {"lock_timeout": "5000ms", "idle_in_transaction_session_timeout": "2500ms"}


async def _frozen_writer(log: Log, heads: str, sleep: float) -> tuple[Any, threading.Event]:
    """A write transaction that locks the heads row of ``/`` and then sits idle, as if frozen.

    Returns its future and an event set when it wakes (after ``sleep`` seconds).
    """
    locked, woke = threading.Event(), threading.Event()

    def hold(conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"SELECT 1 FROM {heads} WHERE path = '/' FOR UPDATE")
        locked.set()
        time.sleep(sleep)  # the session is idle in its transaction meanwhile, as if frozen
        woke.set()
        conn.execute("SELECT 1")

    held = asyncio.ensure_future(log.write_transaction(hold))
    await _until(locked.is_set)
    return held, woke


async def test_a_writer_idle_in_a_transaction_is_ended_and_the_next_job_reconnects(
    pg: Target,
) -> None:
    """A transaction held open on the writer is ended by the server; its lock frees; appends go on."""
    assert pg.schema is not None
    url, schema = pg.schema
    heads = f'"{schema}".streamkit_heads'
    async with pg.open() as log:
        await log.stream("/").append(durable(1))
        held, woke = await _frozen_writer(log, heads, 4.0)
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SET lock_timeout = '20s'")
            with other.transaction():
                other.execute(f"SELECT 1 FROM {heads} WHERE path = '/' FOR UPDATE")
                # The lock came free when the server ended the session, not when hold() woke.
                assert not woke.is_set()
        with pytest.raises(StorageError):
            await asyncio.wait_for(held, 30)
        (event,) = await log.stream("/").append(durable(2))
        assert event.offset == 2


async def test_a_writer_connection_left_in_pipeline_mode_is_opened_again(pg: Target) -> None:
    """A connection libpq left in pipeline mode (an ``executemany`` cut off by an outage)
    refuses every query without being broken; the next job opens a new one."""
    async with pg.open() as log:
        await log.stream("/").append(durable(1))
        writer = log.backend.writer  # type: ignore[attr-defined]
        stuck = writer._connection()
        pid = stuck.info.backend_pid
        stuck.pgconn.enter_pipeline_mode()
        assert not stuck.broken
        try:
            async with asyncio.timeout(20):
                (event,) = await log.stream("/").append(durable(2))
        except TimeoutError:
            # Without the check the writer waits on that connection for ever (or refuses
            # every job on it): end its session so the writer thread, and the test, go on.
            assert pg.schema is not None
            with psycopg.connect(pg.schema[0], autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
            pytest.fail("the writer kept a connection libpq left in pipeline mode")
        assert event.offset == 2
        assert writer._connection() is not stuck
        assert [e.offset for e in (await log.stream("/").read()).events] == [1, 2]


async def test_an_append_behind_a_frozen_writer_waits_for_it_to_be_ended_and_lands(
    pg: Target,
) -> None:
    """Another process's append, queued behind a frozen writer's lock, lands: it is not refused.

    With the default busy_timeout of 5 s the frozen session is ended after
    2.5 s idle, so the append behind it never reaches its own lock timeout.
    """
    assert pg.schema is not None
    _, schema = pg.schema
    heads = f'"{schema}".streamkit_heads'
    async with pg.open() as frozen, pg.open() as other:
        await frozen.stream("/").append(durable(1))
        held, woke = await _frozen_writer(frozen, heads, 12.0)
        (event,) = await other.stream("/").append(durable(2))
        assert event.offset == 2
        assert not woke.is_set()
        with pytest.raises(StorageError):
            await asyncio.wait_for(held, 30)
        (event,) = await frozen.stream("/").append(durable(3))
        assert event.offset == 3


def _stopped_session(url: str, heads: str, application: str) -> psycopg.Connection[Any]:
    """A session that wrote the heads row of ``/`` and then waits for its client, as if its
    process were stopped, with no server timer to end it (as one was seen on PostgreSQL 15)."""
    conn = psycopg.connect(
        url,
        autocommit=True,
        application_name=application,
        options="-c idle_in_transaction_session_timeout=0",
    )
    conn.execute("BEGIN")
    conn.execute(f"UPDATE {heads} SET head = head WHERE path = '/'")
    return conn


@pytest.mark.parametrize("how", ["append", "write_transaction"])
async def test_a_frozen_session_the_server_did_not_end_is_ended_by_the_writer_behind_it(
    pg: Target, how: str
) -> None:
    """A streamkit session stopped mid-write holds the head row past the writer's lock timeout:
    the writer ends it, counts it, and its append (or transaction) lands instead of failing."""
    assert pg.schema is not None
    url, schema = pg.schema
    heads = f'"{schema}".streamkit_heads'
    async with pg.open(busy_timeout=0.5) as log:
        await log.stream("/").append(durable(1))
        stopped = _stopped_session(url, heads, "streamkit writer")
        try:
            await asyncio.sleep(2.1)  # past frozen_after(0.5) == 2 s of waiting for its client
            if how == "append":
                (event,) = await log.stream("/").append(durable(2))
                assert event.offset == 2
            else:
                touched = await log.write_transaction(
                    lambda conn: (
                        conn.execute(
                            f"UPDATE {heads} SET stamped = stamped WHERE path = '/'"
                        ).rowcount
                    )
                )
                assert touched == 1
            assert log.stats.frozen_sessions_ended == 1
            with pytest.raises(psycopg.OperationalError):
                stopped.execute("SELECT 1")
        finally:
            stopped.close()


async def test_a_session_that_is_not_a_stopped_streamkit_one_is_never_ended(pg: Target) -> None:
    """Another program's transaction, or a streamkit one waiting less than 2 s, is waited for
    as before: the writer's StorageBusy stands and the session lives on."""
    assert pg.schema is not None
    url, schema = pg.schema
    heads = f'"{schema}".streamkit_heads'
    async with pg.open(busy_timeout=0.5) as log:
        await log.stream("/").append(durable(1))
        for application, waited in (("psql", 2.1), ("streamkit writer", 0.0)):
            other = _stopped_session(url, heads, application)
            try:
                await asyncio.sleep(waited)
                with pytest.raises(StorageBusy):
                    await log.stream("/").append(durable(2))
                assert other.execute("SELECT 1").fetchone() == (1,)
                other.execute("ROLLBACK")
            finally:
                other.close()
        assert log.stats.frozen_sessions_ended == 0
        (event,) = await log.stream("/").append(durable(2))
        assert event.offset == 2

"""Clients contend while one of their appends waits for its commit (``Log.clients_contend``).

Only then does a fenced append (what a host's processor makes) or a
``processor=True`` transaction (its checkpoint) wait, up to ``HOLD_SECONDS``,
to share a client's group commit. An append that commits at once, on an idle
loop, is no contention: a client that appends and then waits for a
processor has nothing in flight. A client's append is kept in flight here by
having other work ready on the loop when it is made (it is then grouped at
the end of the loop turn instead of committed inline).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from support.log import offsets, order

from streamkit import OffsetConflict, StreamEvent, open_log
from streamkit._requests import AppendCall
from streamkit.log import Log
from streamkit.log import _grouping as log_module


def _fence(conn: sqlite3.Connection) -> None:
    assert conn.in_transaction


async def _in_flight(log: Log, event: dict[str, Any], **kw: Any) -> asyncio.Task[list[StreamEvent]]:
    """A client's append, started while other work is ready: handed over, not yet committed."""
    task = asyncio.ensure_future(log.stream("/").append(event, **kw))
    await asyncio.sleep(0)  # the task runs while this coroutine's wake-up is ready
    assert not task.done()
    return task


async def test_an_append_that_commits_at_once_is_no_contention(log_file: Path) -> None:
    async with open_log(log_file) as log:
        assert not log.clients_contend()
        await log.stream("/").append(order(1))
        assert not log.clients_contend()


async def test_clients_contend_while_an_append_of_theirs_is_in_flight(log_file: Path) -> None:
    async with open_log(log_file) as log:
        client = await _in_flight(log, order(1))
        assert log.clients_contend()
        await client
        assert not log.clients_contend()


async def test_an_append_that_settled_is_no_contention_before_its_callbacks_run(
    log_file: Path,
) -> None:
    """A processor woken by a client's commit asks in the same turn: the answer is already no."""
    async with open_log(log_file) as log:
        loop = asyncio.get_running_loop()
        committed: asyncio.Future[Any] = loop.create_future()
        log._grouping.client_waits(committed, AppendCall(loop, committed, "/", []))
        assert log.clients_contend()
        committed.set_result([])  # its done-callbacks run on a later turn
        assert not log.clients_contend()


@pytest.mark.speed_trick
async def test_an_append_the_writer_committed_holds_no_write_before_it_settles(
    log_file: Path,
) -> None:
    """A catch-up may read a client's event before its future is settled: its checkpoint
    must not wait to share a commit that was made already. The client still counts as
    contending (for the pacing of ranges) until it settles."""
    async with open_log(log_file) as log:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call = AppendCall(loop, future, "/", [])
        grouping = log._grouping
        grouping.client_waits(future, call)
        assert (log.clients_contend(), grouping.holds()) == (True, True)
        call.fresh = [StreamEvent(path="/", offset=1, type="order")]  # the writer committed it
        assert (log.clients_contend(), grouping.holds()) == (True, False)
        future.set_result([])


@pytest.mark.speed_trick
@pytest.mark.usefixtures("long_hold")
async def test_a_held_write_goes_once_no_client_commit_is_left(log_file: Path) -> None:
    """A write held for a client's commit is handed over when that client settles without
    one to carry it, not a minute later."""
    async with open_log(log_file) as log:
        await log.write_transaction(lambda conn: conn.execute("CREATE TABLE cp (n INTEGER)"))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        log._grouping.client_waits(future, AppendCall(loop, future, "/", []))
        held = asyncio.ensure_future(
            log.write_transaction(
                lambda conn: conn.execute("INSERT INTO cp VALUES (7)").rowcount,
                inline=True,
                processor=True,
            )
        )
        await asyncio.sleep(0.05)
        assert (log.held_writes, held.done()) == (1, False)
        future.set_result([])  # the client settled (its commit went elsewhere)
        assert await asyncio.wait_for(held, 10) == 1


@pytest.fixture
def long_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A held write waits a minute for a client (no outcome depends on this machine's speed)."""
    monkeypatch.setattr(log_module, "HOLD_SECONDS", 60.0)


@pytest.mark.speed_trick
@pytest.mark.usefixtures("long_hold")
async def test_a_processors_append_rides_a_contending_clients_commit(log_file: Path) -> None:
    async with open_log(log_file) as log:
        stream = log.stream("/")
        before = log.stats.transactions
        client = await _in_flight(log, order(1))
        (written,) = await stream.append(order(2), fence=_fence)
        await client
        assert log.stats.transactions == before + 1  # one commit for both
        assert log.held_writes == 1
        assert written.offset == 2
        assert await offsets(log) == [1, 2]


@pytest.mark.speed_trick
@pytest.mark.usefixtures("long_hold")
async def test_a_processors_checkpoint_transaction_rides_too(log_file: Path) -> None:
    async with open_log(log_file) as log:
        await log.write_transaction(lambda conn: conn.execute("CREATE TABLE cp (n INTEGER)"))
        before = log.stats.transactions
        client = await _in_flight(log, order(1))
        written = await log.write_transaction(
            lambda conn: conn.execute("INSERT INTO cp VALUES (7)").rowcount,
            inline=True,
            processor=True,
        )
        await client
        assert written == 1
        assert log.stats.transactions == before + 1
        assert log.held_writes == 1
        rows = await log.query(lambda conn: conn.execute("SELECT n FROM cp").fetchall())
        assert rows == [(7,)]


@pytest.mark.usefixtures("long_hold")
async def test_a_refused_client_append_still_carries_the_held_write(log_file: Path) -> None:
    async with open_log(log_file) as log:
        stream = log.stream("/")
        await stream.append(order(1))
        client = await _in_flight(log, order(3), expect_head=0)
        (written,) = await stream.append(order(2), fence=_fence)
        with pytest.raises(OffsetConflict):
            await client
        assert written.offset == 2
        assert await offsets(log) == [1, 2]


@pytest.mark.speed_trick
async def test_a_held_write_goes_alone_when_no_client_comes(
    log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write held while a client contended, and joined by no later client append, commits."""
    monkeypatch.setattr(log_module, "HOLD_SECONDS", 0.05)
    async with open_log(log_file, inline_commits=True) as log:
        stream = log.stream("/")
        busy = threading.Event()
        # The writer thread is kept busy, so the client's append stays in flight.
        blocker = asyncio.ensure_future(log.write_transaction(lambda conn: busy.wait(10)))
        client = await _in_flight(log, order(1))
        for _ in range(3):
            await asyncio.sleep(0)  # the client's group is handed to the (busy) writer
        assert log.clients_contend()
        held = asyncio.ensure_future(stream.append(order(2), fence=_fence))
        await asyncio.sleep(0)
        assert log.held_writes == 1
        busy.set()
        await blocker
        await client
        (written,) = await asyncio.wait_for(held, 10)
        assert written.offset == 2
        assert await offsets(log) == [1, 2]


async def test_with_no_client_contending_a_processors_write_is_not_held(
    log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "HOLD_SECONDS", 3600.0)  # a hold would time the test out
    async with open_log(log_file) as log:
        stream = log.stream("/")
        await stream.append(order(1))  # a client, committed at once
        assert not log.clients_contend()
        (written,) = await asyncio.wait_for(stream.append(order(2), fence=_fence), 10)
        assert written.offset == 2
        done = log.write_transaction(lambda conn: "ok", inline=True, processor=True)
        assert await asyncio.wait_for(done, 10) == "ok"
        assert log.held_writes == 0


@pytest.mark.usefixtures("long_hold")
async def test_a_close_commits_a_held_write(log_file: Path) -> None:
    log = open_log(log_file)
    stream = log.stream("/")
    client = await _in_flight(log, order(1))
    held = asyncio.ensure_future(stream.append(order(2), fence=_fence))
    await asyncio.sleep(0)
    await log.aclose()
    await client
    (written,) = await held
    assert written.offset == 2
    async with open_log(log_file) as again:
        assert await offsets(again) == [1, 2]


@pytest.mark.usefixtures("long_hold")
async def test_a_log_that_groups_on_its_thread_holds_nothing(log_file: Path) -> None:
    """As PostgreSQL's: with inline commits off, a processor's write is handed over at once."""
    async with open_log(log_file, inline_commits=False) as log:
        stream = log.stream("/")
        client = await _in_flight(log, order(1))
        assert log.clients_contend()
        (written,) = await asyncio.wait_for(stream.append(order(2), fence=_fence), 10)
        await client
        assert written.offset == 2
        done = log.write_transaction(lambda conn: "ok", inline=True, processor=True)
        assert await asyncio.wait_for(done, 10) == "ok"
        assert log.held_writes == 0


async def test_a_due_timer_keeps_appends_off_the_inline_path(log_file: Path) -> None:
    """A caller whose appends all commit inline never gives the loop a turn; a timer that came
    due is work waiting, so the next append is handed over and the timer fires."""
    async with open_log(log_file) as log:
        stream = log.stream("/")
        fired = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, fired.set)
        n = 0
        while not fired.is_set():
            n += 1
            assert n < 100_000, "the timer never fired: inline commits starved the loop"
            await stream.append(order(n))
        assert fired.is_set()

"""A processor's writes ride a client's commit while clients append (``Log.clients_active``).

A fenced append (what a host's processor makes) or a ``processor=True``
transaction (its checkpoint) made while clients append waits, up to
``HOLD_SECONDS``, for a client's append to take it along into one group
commit. With no client appending it is not held at all. The windows are
widened here so that no outcome depends on how fast this machine runs.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from support.log import offsets, order

from streamkit import OffsetConflict, open_log
from streamkit.log import _grouping as log_module


def _fence(conn: sqlite3.Connection) -> None:
    assert conn.in_transaction


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients count as appending for a minute, and a held write waits a minute for one."""
    monkeypatch.setattr(log_module, "CLIENT_ACTIVE_SECONDS", 60.0)
    monkeypatch.setattr(log_module, "HOLD_SECONDS", 60.0)


@pytest.mark.usefixtures("wide")
async def test_a_processors_append_rides_the_next_client_commit(log_file: Path) -> None:
    async with open_log(log_file) as log:
        stream = log.stream("/")
        assert not log.clients_active()
        await stream.append(order(1))  # a client: no fence
        assert log.clients_active()
        before = log.stats.transactions
        held = asyncio.create_task(stream.append(order(2), fence=_fence))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not held.done()
        assert log.stats.transactions == before  # not even handed to the writer
        await stream.append(order(3))
        (written,) = await held
        assert log.stats.transactions == before + 1  # one commit for both
        assert written.offset == 2
        assert await offsets(log) == [1, 2, 3]


@pytest.mark.usefixtures("wide")
async def test_a_processors_checkpoint_transaction_rides_too(log_file: Path) -> None:
    async with open_log(log_file) as log:
        stream = log.stream("/")
        await stream.append(order(1))
        await log.write_transaction(lambda conn: conn.execute("CREATE TABLE cp (n INTEGER)"))
        before = log.stats.transactions
        held = asyncio.create_task(
            log.write_transaction(
                lambda conn: conn.execute("INSERT INTO cp VALUES (7)").rowcount,
                inline=True,
                processor=True,
            )
        )
        for _ in range(5):
            await asyncio.sleep(0)
        assert not held.done()
        await stream.append(order(2))
        assert await held == 1
        assert log.stats.transactions == before + 1
        rows = await log.query(lambda conn: conn.execute("SELECT n FROM cp").fetchall())
        assert rows == [(7,)]


@pytest.mark.usefixtures("wide")
async def test_a_refused_client_append_still_carries_the_held_write(log_file: Path) -> None:
    async with open_log(log_file) as log:
        stream = log.stream("/")
        await stream.append(order(1))
        held = asyncio.create_task(stream.append(order(2), fence=_fence))
        await asyncio.sleep(0)
        with pytest.raises(OffsetConflict):
            await stream.append(order(3), expect_head=0)
        (written,) = await held
        assert written.offset == 2
        assert await offsets(log) == [1, 2]


async def test_a_held_write_goes_alone_when_no_client_comes(
    log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "CLIENT_ACTIVE_SECONDS", 60.0)
    monkeypatch.setattr(log_module, "HOLD_SECONDS", 0.05)
    async with open_log(log_file) as log:
        stream = log.stream("/")
        await stream.append(order(1))
        before = log.stats.transactions
        (written,) = await asyncio.wait_for(stream.append(order(2), fence=_fence), 10)
        assert written.offset == 2
        assert log.stats.transactions == before + 1


async def test_with_no_client_appending_a_processors_write_is_not_held(
    log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "HOLD_SECONDS", 3600.0)  # a hold would time the test out
    async with open_log(log_file) as log:
        stream = log.stream("/")
        assert not log.clients_active()
        (written,) = await asyncio.wait_for(stream.append(order(1), fence=_fence), 10)
        assert written.offset == 1
        done = log.write_transaction(lambda conn: "ok", inline=True, processor=True)
        assert await asyncio.wait_for(done, 10) == "ok"


@pytest.mark.usefixtures("wide")
async def test_a_close_commits_a_held_write(log_file: Path) -> None:
    log = open_log(log_file)
    stream = log.stream("/")
    await stream.append(order(1))
    held = asyncio.create_task(stream.append(order(2), fence=_fence))
    await asyncio.sleep(0)
    await log.aclose()
    (written,) = await held
    assert written.offset == 2
    async with open_log(log_file) as again:
        assert await offsets(again) == [1, 2]


@pytest.mark.usefixtures("wide")
async def test_a_log_that_groups_on_its_thread_holds_nothing(log_file: Path) -> None:
    """As PostgreSQL's: with inline commits off, a processor's write is handed over at once."""
    async with open_log(log_file, inline_commits=False) as log:
        stream = log.stream("/")
        await stream.append(order(1))
        assert log.clients_active()
        (written,) = await asyncio.wait_for(stream.append(order(2), fence=_fence), 10)
        assert written.offset == 2
        done = log.write_transaction(lambda conn: "ok", inline=True, processor=True)
        assert await asyncio.wait_for(done, 10) == "ok"

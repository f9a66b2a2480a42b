"""Ephemeral events in the log: offsets they take, writes they cost, holes they leave."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
from pathlib import Path

from support.log import durable, tick

from streamkit import OffsetConflict, open_log
from streamkit.backends.sqlite._offsets import BLOCK_MIN
from streamkit.log import Log


def reservation(path: Path, stream: str = "/") -> tuple[int, str] | None:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT reserved_through, reserved_by FROM streamkit_heads WHERE path = ?", (stream,)
        ).fetchone()
        return None if row is None else (row[0], row[1])
    finally:
        conn.close()


async def test_an_ephemeral_is_returned_but_never_written(log: Log) -> None:
    """An ephemeral comes back with its offset and ephemeral=True, and no read returns it."""
    stream = log.stream()
    d1, e, d2 = await stream.append(durable(1), tick(5), durable(2))
    assert (e.offset, e.type, e.payload, e.ephemeral) == (2, "tick", {"n": 5}, True)
    assert [x.offset for x in (await stream.read()).events] == [1, 3]
    assert (d1.offset, d2.offset) == (1, 3)
    count = await log.query(lambda c: c.execute("SELECT count(*) FROM streamkit_events").fetchone())
    assert count == (2,)


async def test_a_clean_reopen_leaves_no_hole(log_file: Path) -> None:
    """Closing gives back the unused reservation: the next incarnation continues right after."""
    async with open_log(log_file) as log:
        await log.stream().append(durable(1), tick(), tick(), durable(2), tick())
    assert reservation(log_file) == (5, "")
    async with open_log(log_file) as log:
        (d,) = await log.stream().append(durable(3))
        assert d.offset == 6
        (e,) = await log.stream().append(tick())
        assert e.offset == 7


async def test_an_unclean_end_leaves_a_hole_never_a_reuse(log_file: Path) -> None:
    """A reservation not given back (a crash) makes later offsets skip the whole block."""
    async with open_log(log_file) as log:
        await log.stream().append(durable(1), tick())
    # What a crash leaves: the block still reserved by a writer that is gone.
    conn = sqlite3.connect(log_file)
    conn.execute("UPDATE streamkit_heads SET reserved_through = 258, reserved_by = 'dead'")
    conn.commit()
    conn.close()
    async with open_log(log_file) as log:
        (d,) = await log.stream().append(durable(2))
        assert d.offset == 259
        (e,) = await log.stream().append(tick())
        assert e.offset == 260


async def test_two_writers_never_give_one_offset_twice(log_file: Path) -> None:
    """Two logs on one file (as two processes): no durable lands at or below the other's ephemerals."""
    async with open_log(log_file) as a, open_log(log_file) as b:
        sa, sb = a.stream(), b.stream()
        (a1,) = await sa.append(durable(1))
        (ae,) = await sa.append(tick())  # a reserves a block
        (b1,) = await sb.append(durable(2))  # lands above a's whole block: a hole
        (ae2,) = await sa.append(tick())  # a's block is void: a reserves above b1
        (a2,) = await sa.append(durable(3))
        (be,) = await sb.append(tick())  # b reserves above a's new block
        (b2,) = await sb.append(durable(4))
        handed = [a1.offset, ae.offset, b1.offset, ae2.offset, a2.offset, be.offset, b2.offset]
        assert handed == sorted(handed)
        assert len(set(handed)) == len(handed)
        assert (a1.offset, ae.offset) == (1, 2)
        assert b1.offset > ae.offset + 1  # the rest of a's block became a hole
        assert a2.offset == ae2.offset + 1  # a's own durable follows its own ephemeral
        assert b2.offset == be.offset + 1
        page = await sa.read()
        assert [e.offset for e in page.events] == [a1.offset, b1.offset, a2.offset, b2.offset]


async def test_a_refusal_inside_a_group_gives_back_its_offsets(log: Log) -> None:
    """A refused call in a group commit hands none of its offsets out; its neighbours keep order."""
    stream = log.stream()
    entered, release = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        entered.set()
        release.wait(10)

    holder = asyncio.create_task(log.write_transaction(hold))
    await asyncio.to_thread(entered.wait, 10)
    calls = [
        [tick(1)],
        [durable(1)],
        [tick(2), durable(2, offset=1)],  # refused: its ephemeral must not take an offset
        [tick(3)],
        [durable(3)],
    ]
    tasks = [asyncio.create_task(stream.append(*events)) for events in calls]
    await asyncio.sleep(0)
    release.set()
    await holder
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[2], OffsetConflict)
    got = [[(e.offset, e.ephemeral) for e in r] for r in results if isinstance(r, list)]
    assert got == [[(1, True)], [(2, False)], [(3, True)], [(4, False)]]
    assert log.stats.ephemeral == 2


async def test_another_writers_durables_do_not_grow_the_skipped_block(log_file: Path) -> None:
    """A block voided by another writer's durable append is not mistaken for used up: holes stay small."""
    live = open_log(log_file)
    other = open_log(log_file)
    try:
        offsets: list[int] = []
        for round_ in range(40):
            await live.stream().append(*(tick(i) for i in range(5)))
            (event,) = await other.stream().append(durable(round_))
            offsets.append(event.offset)
        gaps = [b - a for a, b in itertools.pairwise(offsets)]
        # Each foreign durable skips at most one minimum block plus the ephemerals handed.
        assert max(gaps) <= BLOCK_MIN + 6, gaps
    finally:
        await live.aclose()
        await other.aclose()

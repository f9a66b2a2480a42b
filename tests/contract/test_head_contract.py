"""An offset is never handed out twice, on every backend, whatever rows are deleted.

A path's durable head lives in a row of its own (``streamkit_heads``): on
PostgreSQL every commit storing an event moves it; on SQLite it is a floor
that the path's first event sets and a trigger raises, in the deleting
transaction, to every deleted offset above it. It is never derived from the
rows alone. Deleting the newest rows by hand (what a user trying to trim a
log does first) therefore leaves the head where it was: the next append
takes a fresh offset, ``head()`` still says how far the path went, and the
path is still listed. Before SQLite kept the row, its head was
``max(offset)`` and the deleted offsets were handed out again.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing

import psycopg
from psycopg import sql
from support.backends import Target


def delete_by_hand(target: Target, path: str, offsets: list[int]) -> None:
    """Delete rows of ``path`` from another connection, as a user with a SQL shell would."""
    if target.schema is None:
        with closing(sqlite3.connect(target.target)) as conn, conn:
            conn.executemany(
                'DELETE FROM streamkit_events WHERE path = ? AND "offset" = ?',
                [(path, offset) for offset in offsets],
            )
        return
    url, schema = target.schema
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                'DELETE FROM {}.streamkit_events WHERE path = %s AND "offset" = ANY(%s)'
            ).format(sql.Identifier(schema)),
            (path, offsets),
        )


async def test_the_newest_rows_deleted_by_hand_never_hand_their_offsets_out_again(
    log_target: Target,
) -> None:
    async with log_target.open() as log:
        stream = log.stream("/orders")
        await stream.append(*[{"type": "placed"}] * 3)
        await stream.append({"type": "placed", "idempotency_key": "k4"})
        await stream.append({"type": "placed"})
        # Deleted while this log is open (another connection, as another process), then
        # once more with the log closed: the writer's cache and a fresh open both hold.
        delete_by_hand(log_target, "/orders", [4, 5])
        assert await stream.head() == 5
        (sixth,) = await stream.append({"type": "placed"})
        assert sixth.offset == 6
        (keyed,) = await stream.append({"type": "placed", "idempotency_key": "k7"})
        assert keyed.offset == 7
    delete_by_hand(log_target, "/orders", [6, 7])
    async with log_target.open() as log:
        stream = log.stream("/orders")
        assert await stream.head() == 7
        (eighth,) = await stream.append({"type": "placed"}, expect_head=7)
        assert eighth.offset == 8
        page = await stream.read()
        assert [e.offset for e in page.events] == [1, 2, 3, 8]


async def test_a_path_whose_rows_were_all_deleted_keeps_its_head_and_its_place(
    log_target: Target,
) -> None:
    async with log_target.open() as log:
        await log.stream("/a").append(*[{"type": "x"}] * 2)
        await log.stream("/b").append({"type": "x"})
    delete_by_hand(log_target, "/a", [1, 2])
    async with log_target.open() as log:
        assert await log.paths() == ["/a", "/b"]
        assert await log.stream("/a").head() == 2
        page = await log.stream("/a").read()
        assert (list(page.events), page.at_head) == ([], True)
        (third,) = await log.stream("/a").append({"type": "x"})
        assert third.offset == 3

"""Following a PostgreSQL log across processes when the hint fails: no NOTIFY, a lost connection.

A notification is only a hint (``streamkit.backends.postgres._listener``):
a commit nobody notified still reaches a follower by the once-a-second read,
and a listener whose connection the server ends reconnects and reads on.
"""

from __future__ import annotations

import asyncio

import psycopg
from support.backends import Target
from support.log import durable


async def test_a_commit_nobody_notified_is_read_within_the_poll(pg: Target) -> None:
    """Rows written by a writer that sends no NOTIFY still reach a follower (the poll)."""
    assert pg.schema is not None
    url, schema = pg.schema
    async with pg.open() as ours:
        await ours.stream("/").append(durable(1))
        it = ours.stream("/").follow(1)
        try:
            await asyncio.sleep(0.2)  # the listener is up and has read the path once
            with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
                # What a foreign writer that never notifies would commit: offset 2.
                conn.execute(
                    f'UPDATE "{schema}".streamkit_heads SET head = 2 WHERE path = %s', ("/",)
                )
                conn.execute(
                    f'INSERT INTO "{schema}".streamkit_events (path, "offset", type, payload, '
                    "metadata, created_at) VALUES ('/', 2, 'silent', '{}', '{}', "
                    "'2026-12-01T00:00:00.000000Z')"
                )
            # No notification will come: only the once-a-second read can deliver it.
            events, _ = await asyncio.wait_for(it.__anext__(), 10)
        finally:
            await it.aclose()
    assert [(e.offset, e.type) for e in events] == [(2, "silent")]


async def test_a_listener_whose_connection_is_ended_reconnects_and_reads_on(pg: Target) -> None:
    """The server ends the listener's session: commits made since still reach the follower."""
    assert pg.schema is not None
    url, _ = pg.schema
    async with pg.open() as ours, pg.open() as theirs:
        it = ours.stream("/").follow(0)
        try:
            await theirs.stream("/").append(durable(1))
            events, _ = await asyncio.wait_for(it.__anext__(), 10)
            assert [e.offset for e in events] == [1]
            with psycopg.connect(url, autocommit=True) as conn:
                ended = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'streamkit listener'"
                ).fetchall()
            assert ended, "no listener session found"
            await theirs.stream("/").append(durable(2), durable(3))
            seen: list[int] = []
            while len(seen) < 2:
                events, _ = await asyncio.wait_for(it.__anext__(), 15)
                seen += [e.offset for e in events]
        finally:
            await it.aclose()
    assert seen == [2, 3]
    backend = ours.backend
    assert backend.listener.reconnects >= 1

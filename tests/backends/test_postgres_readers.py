"""PostgreSQL reader connections that the server ended while idle are replaced, not reported."""

from __future__ import annotations

import asyncio

import psycopg
from support.backends import Target
from support.log import durable

from streamkit.backends.postgres._backend import READERS


async def test_reads_after_the_server_ended_every_idle_reader_still_succeed(pg: Target) -> None:
    """A reader whose connection broke while idle reads again on a new one: no error, no gap."""
    assert pg.schema is not None
    url, _ = pg.schema
    async with pg.open() as log:
        stream = log.stream("/")
        await stream.append(durable(1), durable(2))
        # Enough reads at once that every reader thread holds a connection.
        await asyncio.gather(*(stream.read(0, 10) for _ in range(4 * READERS)))
        with psycopg.connect(url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'streamkit reader' AND pid <> pg_backend_pid()"
            ).fetchall()
        assert ended
        for _ in range(4 * READERS):
            page = await stream.read(0, 10)
            assert [e.offset for e in page.events] == [1, 2]
            assert await stream.head() == 2

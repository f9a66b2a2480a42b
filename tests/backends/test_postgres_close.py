"""A PostgreSQL backend closed under a live Log refuses reads with LOG_CLOSED, not a crash."""

from __future__ import annotations

import asyncio

import pytest
from support.backends import Target
from support.log import durable

from streamkit._requests import PageRead
from streamkit.backends.postgres._backend import PostgresLogBackend
from streamkit.errors import LogClosed


async def test_a_read_after_the_backend_released_its_readers_is_refused_as_closed(
    pg: Target,
) -> None:
    """The reader pool shut down (as a close from another thread does): LogClosed, coded."""
    async with pg.open() as log:
        await log.stream("/").append(durable(1))
        backend = log.backend
        assert isinstance(backend, PostgresLogBackend)
        await asyncio.to_thread(backend.shutdown)
        with pytest.raises(LogClosed) as refused:
            await backend.read_sized(PageRead("/", 0, 10))
        assert refused.value.code == "LOG_CLOSED"
        assert "nothing was read" in refused.value.message

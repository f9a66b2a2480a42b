"""A retention cut on PostgreSQL commits through a log of its own and holds the path's head briefly.

The cut's slow half (the segment's row, the keys' hashes, the deleted rows)
runs before its control event takes the path's head row, so appends to the
path commit while it runs; two runs of one path are ordered by a lock of
their own, and the second is refused with nothing written.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.backends import Target

from streamkit.backends import host_store
from streamkit.backends._retention.cuts import Cut
from streamkit.backends._retention.run import run_retention
from streamkit.backends.postgres._backend import PostgresLogBackend, second_log
from streamkit.backends.postgres.retention import PostgresRetentionRows
from streamkit.errors import InvalidRequest
from streamkit.history import TRUNCATED_EVENT
from streamkit.log import Log
from streamkit.protocols import RetentionAsk


class _Paused:
    """The log's retention rows, whose ``take`` stops after its statements until released."""

    def __init__(self, rows: PostgresRetentionRows) -> None:
        self._rows = rows
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rows, name)

    def take(self, conn: psycopg.Connection[Any], cut: Cut) -> int:
        taken = self._rows.take(conn, cut)
        self.entered.set()
        self.release.wait(30)
        return taken


def _rows(log: Log) -> PostgresRetentionRows:
    backend = log.backend
    assert isinstance(backend, PostgresLogBackend)
    return PostgresRetentionRows(backend.target.schema)


def _cutter(log: Log) -> Callable[[], Log]:
    backend = log.backend
    assert isinstance(backend, PostgresLogBackend)
    return functools.partial(second_log, backend)


async def _fill(log: Log, count: int) -> None:
    await log.stream("/").append(
        *[
            {"type": "t", "payload": {"n": n}, "idempotency_key": f"k{n}" if n % 2 else None}
            for n in range(count)
        ]
    )


async def test_an_append_to_the_path_commits_while_a_cut_deletes_its_rows(
    pg: Target, tmp_path: Path
) -> None:
    """Before: the cut ran on the appends' writer with the head row locked, so this
    append waited for the whole cut (the wait below timed out)."""
    # A long lock timeout: the paused cut sits idle in its transaction, which the server
    # ends after half of it.
    async with pg.open(busy_timeout=30.0) as log:
        await host_store(log).prepare()
        await _fill(log, 10)
        paused = _Paused(_rows(log))
        archive = str(tmp_path / "archive")
        try:
            run = asyncio.create_task(
                run_retention(
                    log, paused, RetentionAsk("/", archive=archive), open_cutter=_cutter(log)
                )  # type: ignore[arg-type]
            )
            assert await asyncio.to_thread(paused.entered.wait, 30)
            # The cut's transaction has deleted offsets 1..10 and not committed yet.
            (appended,) = await asyncio.wait_for(
                log.stream("/").append({"type": "t", "payload": {"n": 10}}), 20
            )
            assert not run.done()
            paused.release.set()
            done = await run
        finally:
            paused.release.set()
        assert appended.offset == 11
        assert (done.events, done.chunks, done.start_after) == (10, 1, 11)
        page = await log.stream("/").read(10, 10)
        assert [(e.offset, e.type) for e in page.events] == [(11, "t"), (12, TRUNCATED_EVENT)]
        # A retry of a key whose event went still answers with the original offset.
        (again,) = await log.stream("/").append(
            {"type": "t", "payload": {"n": 3}, "idempotency_key": "k3"}
        )
        assert again.offset == 4
        assert await host_store(log).retention.verify_archive("/") == []


async def test_two_runs_of_one_path_wait_for_each_other_and_the_second_takes_nothing(
    pg: Target,
) -> None:
    """Before: the second run's cut got past the start check while the first's was
    uncommitted and recorded a second cut of the same events."""
    # A long lock timeout: the paused cut sits idle in its transaction, which the server
    # ends after half of it.
    async with pg.open(busy_timeout=30.0) as log:
        await host_store(log).prepare()
        await _fill(log, 6)
        first, second = _Paused(_rows(log)), _Paused(_rows(log))
        second.release.set()
        try:
            one = asyncio.create_task(
                run_retention(log, first, RetentionAsk("/"), open_cutter=_cutter(log))
            )  # type: ignore[arg-type]
            assert await asyncio.to_thread(first.entered.wait, 30)
            two = asyncio.create_task(
                run_retention(log, second, RetentionAsk("/"), open_cutter=_cutter(log))
            )  # type: ignore[arg-type]
            await asyncio.to_thread(_await_advisory_wait, pg)
            first.release.set()
            done = await one
            with pytest.raises(
                InvalidRequest, match=r"by another run meanwhile.*nothing was written"
            ):
                await two
        finally:
            first.release.set()
        assert (done.events, done.start_after) == (6, 7)
        page = await log.stream("/").read(6, 10)
        assert [e.type for e in page.events] == [TRUNCATED_EVENT]


def _await_advisory_wait(pg: Target) -> None:
    """Until a session of the test server waits for an advisory lock (the second run's cut)."""
    assert pg.schema is not None
    url, _ = pg.schema
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND wait_event = 'advisory'"
            ).fetchone()
            if row is not None and row[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the second run never waited for the first")

"""Preparing retention chunks and pacing runs, on every backend.

A chunk prepared in the worker process must be the chunk a thread of this
process prepares (the rows, the segment's record, the keys' hashes); a
worker that cannot read is a coded refusal with nothing taken; and a run
keeps to its share of the writer while other writes go on, and only then.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.retention import retention_rows

import streamkit.backends._retention.chunk_prep as chunk_prep
import streamkit.backends._retention.run as truncation
from streamkit import SPEED_TRICKS
from streamkit.backends._retention.chunk_prep import (
    ChunkAsk,
    Prepared,
    ProcessPreparer,
    ThreadPreparer,
)
from streamkit.backends._retention.chunk_worker import NICENESS
from streamkit.backends.sqlite._schema import connect_reader
from streamkit.errors import InvalidRequest, StorageError
from streamkit.log import Log
from streamkit.protocols import HostStore, RetentionAsk


async def fill(log: Log, count: int) -> None:
    await log.stream("/").append(
        *(
            {
                "type": "n",
                "payload": {"i": i},
                **({"idempotency_key": f"k{i}"} if i % 3 == 0 else {}),
            }
            for i in range(count)
        )
    )


def ask(folder: Path | None, *, after: int = 0, limit: int = 20, chunk: int = 8) -> ChunkAsk:
    return ChunkAsk(
        path="/",
        after=after,
        limit=limit,
        chunk=chunk,
        young=None,
        folder=None if folder is None else str(folder),
        prev=None,
        created_at="2026-12-05T00:00:00.000000Z",
    )


def without_file(prepared: Prepared) -> Prepared:
    segment = prepared.segment
    if segment is None:
        return prepared
    return dataclasses.replace(prepared, segment=dataclasses.replace(segment, file=""))


@pytest.mark.speed_trick
async def test_a_host_store_prepares_chunks_in_a_worker_process(
    log: Log, store: HostStore, tmp_path: Path
) -> None:
    """The store's runs prepare in another process, and what comes back is exactly what a
    thread of this process prepares from the log's own readers: delete and archive alike."""
    await fill(log, 20)
    preparer = store.retention.preparer  # type: ignore[attr-defined]
    assert isinstance(preparer, ProcessPreparer)
    assert not preparer.in_process
    thread = ThreadPreparer(log, retention_rows(log))
    for folder in (None, "archive"):
        elsewhere = await preparer.prepare(ask(None if folder is None else tmp_path / "w"))
        here = await thread.prepare(ask(None if folder is None else tmp_path / "t"))
        assert without_file(elsewhere) == without_file(here)
        assert here.through == 8
        assert here.count == 8
        assert [k[0] for k in here.keys] == ["k0", "k3", "k6"]
    worker = chunk_prep._WORKER.pid
    assert worker not in (None, os.getpid())
    # Background work: it yields the CPU to this process's event loop.
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, worker) == min(19, ours + NICENESS) > ours
    run = await store.retention.run(
        RetentionAsk("/", through=16, archive=str(tmp_path / "run"), chunk=8)
    )
    assert (run.events, run.chunks, run.start_after) == (16, 2, 17)
    assert [e.offset for e in (await log.stream("/").read(16, 3)).events][:2] == [17, 18]


async def test_a_worker_that_cannot_read_takes_nothing(log: Log, tmp_path: Path) -> None:
    """A worker process whose connection cannot be opened: STORAGE_ERROR naming the chunk,
    and the path keeps every event."""
    await fill(log, 10)
    missing = str(tmp_path / "no-such-dir" / "log.db")
    preparer = ProcessPreparer(
        functools.partial(connect_reader, missing, busy_timeout=1.0), retention_rows(log)
    )
    with pytest.raises(StorageError, match=r"the chunk of '/' after offset 0 could not be read"):
        await truncation.run_retention(
            log, retention_rows(log), RetentionAsk("/"), preparer=preparer
        )
    assert [e.offset for e in (await log.stream("/").read(0, 20)).events] == list(range(1, 11))


class WritesBeside:
    """A thread preparer that appends to another path before each chunk: other writes."""

    in_process = True

    def __init__(self, log: Log) -> None:
        self._log = log
        self._thread = ThreadPreparer(log, retention_rows(log))

    async def prepare(self, ask: ChunkAsk) -> Prepared:
        await self._log.stream("/other").append({"type": "beside"})
        return await self._thread.prepare(ask)


async def test_a_run_beside_other_writes_pauses_to_keep_its_share(log: Log) -> None:
    """With other writes between its cuts, a run of share 0.25 waits three times its own
    time after each cut but the last, and counts the waits."""
    await fill(log, 20)
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    run = await truncation.run_retention(
        log,
        retention_rows(log),
        RetentionAsk("/", through=20, chunk=5, share=0.25),
        preparer=WritesBeside(log),
        sleep=sleep,
    )
    assert run.chunks == 4
    assert len(pauses) == 3
    assert all(p > 0 for p in pauses)
    assert run.paused_seconds == pytest.approx(sum(pauses))
    assert run.to_dict()["paused_seconds"] == round(sum(pauses), 3)


async def test_a_run_on_an_idle_log_does_not_pause(log: Log) -> None:
    """Nothing else writes: whatever the share, the run goes at full speed."""
    await fill(log, 20)
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    run = await truncation.run_retention(
        log, retention_rows(log), RetentionAsk("/", through=20, chunk=5, share=0.01), sleep=sleep
    )
    assert (run.chunks, pauses, run.paused_seconds) == (4, [], 0.0)


@pytest.mark.parametrize("share", [0, -0.5, 1.5, True, float("nan")])
async def test_a_share_outside_zero_to_one_is_refused(log: Log, share: float) -> None:
    await fill(log, 5)
    with pytest.raises(InvalidRequest, match="a retention share must be a number in"):
        await truncation.run_retention(log, retention_rows(log), RetentionAsk("/", share=share))
    assert len((await log.stream("/").read(0, 10)).events) == 5


SCRIPT = """
import asyncio, sys
from pathlib import Path

from streamkit import open_log
from streamkit.backends import host_store
from streamkit.protocols import RetentionAsk

with open(sys.argv[2], "a") as marker:  # at import: once per run of this file
    marker.write("ran\\n")


async def main() -> None:
    async with open_log(sys.argv[1]) as log:
        await log.stream("/").append(*({"type": "n"} for _ in range(30)))
        run = await host_store(log).retention.run(RetentionAsk("/", through=30, chunk=10))
        print(run.events, run.chunks)


asyncio.run(main())  # no __name__ guard, as many scripts are written
"""


@pytest.mark.speed_trick
def test_a_script_without_a_main_guard_is_not_run_again_by_the_worker(tmp_path: Path) -> None:
    """The worker process starts clean: the application's script runs once, not again in
    the worker (as multiprocessing's spawn would), and its run takes what it asked."""
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "marker"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "log.db"), str(marker)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["30", "3"]
    assert marker.read_text() == "ran\n"


async def test_the_switch_chooses_where_chunks_are_prepared(store: HostStore) -> None:
    """Speed tricks on: the worker process; STREAMKIT_PLAIN=1: the plain twin, a thread."""
    preparer = store.retention.preparer  # type: ignore[attr-defined]
    assert isinstance(preparer, ProcessPreparer if SPEED_TRICKS else ThreadPreparer)
    assert preparer.in_process is not SPEED_TRICKS

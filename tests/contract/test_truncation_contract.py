"""Retention runs, as every backend's HostStore makes them: below the horizon only, with proof.

Over every backend (the ``store`` fixture): a run takes a path's oldest
events, archived to segment files or deleted, never at or past the horizon;
a read below the path's start is HISTORY_TRUNCATED, never a jump; no offset
is reused; a retry of a key whose event went returns its original offset
and appends nothing; the segments are chained and every byte of them is
proven; a segment no row records (a crashed run's) is removed by the next.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.backends import Target
from support.retention import retention_rows

import streamkit.backends._retention.chunk_prep as chunk_prep
import streamkit.backends._retention.run as truncation
from streamkit.backends import host_store
from streamkit.backends._retention.cuts import Cut
from streamkit.backends._retention.segments import check_chain, check_segment, read_segment
from streamkit.backends._stored import decode_rows
from streamkit.errors import (
    HistoryTruncated,
    IdempotencyConflict,
    InvalidRequest,
    LeaseLost,
    LogTampered,
)
from streamkit.history import TRUNCATED_EVENT
from streamkit.holds import check_hold
from streamkit.host._lease_keeper import HeldLease
from streamkit.log import Log
from streamkit.protocols import HostStore, LeaseAsk, RetentionAsk

# On a private in-memory log too: these tests keep to the one log they open.
ALSO_IN_MEMORY = True

TTL = 60.0


async def fill(log: Log, path: str, count: int, keyed: bool = False) -> None:
    await log.stream(path).append(
        *(
            {"type": "n", "payload": {"i": i}, **({"idempotency_key": f"k{i}"} if keyed else {})}
            for i in range(count)
        )
    )


def damage(changed: str, removed: str) -> None:
    """Flip a byte near the end of ``changed``; remove ``removed``."""
    data = bytearray(Path(changed).read_bytes())
    data[-100] ^= 0xFF
    Path(changed).write_bytes(bytes(data))
    Path(removed).unlink()


async def cursor_at(store: HostStore, path: str, slug: str, cursor: int) -> None:
    lease = await store.try_acquire(LeaseAsk(path, slug, "owner", time.time(), TTL))
    assert lease is not None
    held = HeldLease(
        lease, store.check_fence, ttl=TTL, renewal_started=time.monotonic(), clock=time.time
    )
    await store.checkpoints(held, path).save(
        slug, reducer_version="1", reduced_through_offset=cursor, state_json="{}"
    )


async def test_a_run_stops_at_the_horizon_and_the_path_then_starts_after_it(
    log: Log, store: HostStore
) -> None:
    """Deleted below the horizon only; a read below the start is refused, naming it."""
    await fill(log, "/orders", 30, keyed=True)
    await cursor_at(store, "/orders", "board", 20)
    run = await store.retention.run(RetentionAsk("/orders", through=25, chunk=8))
    assert (run.mode, run.horizon, run.start_before, run.start_after) == ("delete", 21, 1, 21)
    assert (run.events, run.chunks) == (20, 3)
    stream = log.stream("/orders")
    with pytest.raises(HistoryTruncated) as refused:
        await stream.read(0, 10)
    assert refused.value.details == {
        "path": "/orders",
        "requested": 0,
        "start": 21,
        "archive": [],
        "archived": [],
        "deleted": [[1, 20]],
    }
    assert "starts at offset 21: of its events through 20, 1..20 was deleted;" in (
        refused.value.message
    )
    assert refused.value.message.endswith(
        "offsets 1..20 cannot be read by anyone: read after offset 20"
    )
    page = await stream.read(20, 5)
    assert [e.offset for e in page.events] == [21, 22, 23, 24, 25]
    truncations = [e for e in (await stream.read(30, 10)).events if e.type == TRUNCATED_EVENT]
    assert [t.payload["through"] for t in truncations] == [8, 16, 20]
    # No offset is reused, and a key of a deleted event still answers, appending nothing.
    head = await stream.head()
    (again,) = await stream.append({"type": "n", "payload": {"i": 3}, "idempotency_key": "k3"})
    assert again.offset == 4
    with pytest.raises(IdempotencyConflict):
        await stream.append({"type": "n", "payload": {"i": 99}, "idempotency_key": "k3"})
    (fresh,) = await stream.append({"type": "n"})
    assert (fresh.offset, await stream.head()) == (head + 1, head + 1)
    # The summary of stored types counts what is left.
    (summary,) = [t for t in await log.stored_types("/orders") if t.type == "n"]
    assert (summary.count, summary.first_offset) == (11, 21)


async def test_nothing_goes_while_a_hold_or_an_unstarted_processor_keeps_it(
    log: Log, store: HostStore
) -> None:
    await fill(log, "/", 10)
    now = time.time()
    await store.retention.place_hold(check_hold("/", "audit", 4, None, "ops", "audit", now))
    run = await store.retention.run(RetentionAsk("/"))
    assert (run.events, run.start_after) == (3, 4)
    await store.host_beat("host-a", ["mailer@/"], now)
    run = await store.retention.run(RetentionAsk("/"))
    assert run.events == 0
    assert [e.offset for e in (await log.stream("/").read(3, 2)).events] == [4, 5]


async def test_an_archive_keeps_every_event_in_a_proven_chain(
    log: Log, store: HostStore, tmp_path: Path
) -> None:
    """Segments hold exactly the events the log held; the chain links; verify names damage."""
    await fill(log, "/orders", 25, keyed=True)
    before = (await log.stream("/orders").read(0, 100)).events
    archive = tmp_path / "archive"
    summary = await log.stored_types("/orders")
    run = await store.retention.run(
        RetentionAsk("/orders", through=22, archive=str(archive), chunk=10)
    )
    kept = [t for t in await log.stored_types("/orders") if t.type != TRUNCATED_EVENT]
    assert kept == summary  # archived events are still read, by rebuilds: still counted
    assert (run.mode, run.events, [(s.first, s.last) for s in run.segments]) == (
        "archive",
        22,
        [(1, 10), (11, 20), (21, 22)],
    )
    recorded = await store.retention.segments("/orders")
    assert recorded == run.segments
    assert check_chain(recorded) == []
    assert all(check_segment(s) is None for s in recorded)
    archived = [e for s in recorded for e in decode_rows("/orders", read_segment(s.file))]
    assert archived == before[:22]
    with pytest.raises(HistoryTruncated) as refused:
        await log.stream("/orders").read(5, 1)
    assert refused.value.details["archive"] == [s.file for s in recorded]
    # A changed byte in the middle segment is named; so is a missing one.
    damage(recorded[1].file, recorded[2].file)
    assert "was changed after it was written" in (check_segment(recorded[1]) or "")
    assert "is missing" in (check_segment(recorded[2]) or "")


async def test_a_segment_no_row_records_is_removed_by_the_run_that_takes_its_range(
    log: Log, store: HostStore, tmp_path: Path
) -> None:
    """A crash between the segment's write and its transaction leaves a file; it goes once
    the path's start passes it. One above the start stays: it may be another run's."""
    await fill(log, "/", 6)
    archive = tmp_path / "archive"
    archive.mkdir()
    orphan = archive / "_.00000000000000000001-00000000000000000003.0badc0de.segment"
    orphan.write_bytes(b"left by a crashed run")
    partial = archive / "_.00000000000000000001-00000000000000000003.segment.partial"
    partial.write_bytes(b"")
    pending = archive / "_.00000000000000000004-00000000000000000006.5ca1ab1e.segment"
    pending.write_bytes(b"another run's, not recorded yet")
    other_path = archive / "_other.00000000000000000001-00000000000000000003.segment"
    other_path.write_bytes(b"not this path's")
    run = await store.retention.run(RetentionAsk("/", through=3, archive=str(archive)))
    assert sorted(run.orphans_removed) == sorted([str(orphan), str(partial)])
    assert other_path.exists()
    assert pending.exists()
    (segment,) = run.segments
    assert Path(segment.file).name.startswith("_.00000000000000000001-00000000000000000003.")
    assert check_segment(segment) is None
    # The next run takes 4..6: the file above the start is now dead and goes too.
    later = await store.retention.run(RetentionAsk("/", through=6, archive=str(archive)))
    assert later.orphans_removed == [str(pending)]
    assert sorted(str(f) for f in archive.iterdir()) == sorted(
        [s.file for s in await store.retention.segments("/")] + [str(other_path)]
    )


async def test_two_runs_that_write_one_range_at_once_leave_the_recorded_segment_whole(
    log: Log, store: HostStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host's run and `streamkit retention run` of one path at once: both write the
    chunk's segment before either cuts. Before: one file name for both, so the second
    write replaced the first's bytes and the refused run removed the winner's file."""
    await fill(log, "/", 6)
    archive = tmp_path / "archive"
    both_written = threading.Barrier(2, timeout=30)
    real = chunk_prep.write_segment

    def write_then_wait(*args: Any) -> Any:
        written = real(*args)
        both_written.wait()
        return written

    monkeypatch.setattr(chunk_prep, "write_segment", write_then_wait)
    rows = retention_rows(log)
    # The rule itself, chunks prepared in this process (where the patch is).
    outcomes = await asyncio.gather(
        *(
            truncation.run_retention(log, rows, RetentionAsk("/", archive=str(archive)))
            for _ in range(2)
        ),
        return_exceptions=True,
    )
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    (done,) = [o for o in outcomes if not isinstance(o, BaseException)]
    (error,) = refused
    assert isinstance(error, InvalidRequest), error
    assert "by another run meanwhile" in error.message
    assert done.events == 6
    assert await store.retention.verify_archive("/") == []
    recorded = await store.retention.segments("/")
    assert sorted(str(f) for f in archive.iterdir()) == [s.file for s in recorded]
    page = await log.stream("/").read(0, 10, include_archive=True)
    assert [e.payload for e in page.events if e.type != TRUNCATED_EVENT] == [
        {"i": i} for i in range(6)
    ]


async def test_a_cut_the_horizon_moved_under_is_refused_and_its_segment_removed(
    log: Log, store: HostStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hold placed while the segment is written holds the cut: refused, no file, no row gone."""
    await fill(log, "/", 6)
    archive = tmp_path / "archive"
    loop = asyncio.get_running_loop()
    real = chunk_prep.write_segment

    def write_then_hold(*args: Any) -> Any:
        written = real(*args)
        hold = check_hold("/", "late", 2, None, "ops", "placed meanwhile", time.time())
        asyncio.run_coroutine_threadsafe(store.retention.place_hold(hold), loop).result(timeout=30)
        return written

    monkeypatch.setattr(chunk_prep, "write_segment", write_then_hold)
    with pytest.raises(InvalidRequest, match=r"the horizon is 2 now \(held by hold late\)"):
        # The rule itself, chunks prepared in this process (where the patch is).
        await truncation.run_retention(
            log, retention_rows(log), RetentionAsk("/", through=5, archive=str(archive))
        )
    assert [f.name for f in archive.iterdir()] == []
    assert [e.offset for e in (await log.stream("/").read(0, 3)).events] == [1, 2, 3]
    assert await store.retention.segments() == []


async def test_a_read_may_include_the_archive_and_goes_on_into_the_log(
    log: Log, store: HostStore, tmp_path: Path
) -> None:
    """Page by page from the first archived event into the live rows: the log's history whole."""
    await fill(log, "/", 25)
    await log.stream("/").append({"type": "delta", "ephemeral": True})
    await fill(log, "/", 5)
    before = await read_everything(log, "/", include_archive=False)
    await store.retention.run(
        RetentionAsk("/", through=28, archive=str(tmp_path / "archive"), chunk=7)
    )
    after = await read_everything(log, "/", include_archive=True)
    assert [e for e in after if e.type != TRUNCATED_EVENT] == before


async def test_a_range_deleted_after_an_archive_is_refused_even_with_the_archive(
    log: Log, store: HostStore, tmp_path: Path
) -> None:
    await fill(log, "/", 10)
    await store.retention.run(RetentionAsk("/", through=4, archive=str(tmp_path / "archive")))
    await store.retention.run(RetentionAsk("/", through=7))  # deleted, no archive
    stream = log.stream("/")
    page = await stream.read(0, 10, include_archive=True)
    assert ([e.offset for e in page.events], page.scanned_through_offset) == ([1, 2, 3, 4], 4)
    with pytest.raises(HistoryTruncated) as refused:
        await stream.read(4, 10, include_archive=True)
    assert refused.value.details["start"] == 8
    # Which part was deleted and which archived, each said once, with advice that works.
    assert (refused.value.details["deleted"], refused.value.details["archived"]) == (
        [[5, 7]],
        [[1, 4]],
    )
    message = refused.value.message
    assert "of its events through 7, 5..7 was deleted and 1..4 is archived in" in message
    assert message.endswith("offsets 5..7 cannot be read by anyone: read after offset 7")
    with pytest.raises(HistoryTruncated) as refused:
        await stream.read(0, 10)
    assert refused.value.message.endswith(
        "include the archive (streamkit read --include-archive), or read after offset 7"
    )
    assert [e.offset for e in (await stream.read(7, 3)).events] == [8, 9, 10]


async def read_everything(log: Log, path: str, *, include_archive: bool) -> list[Any]:
    events: list[Any] = []
    after = 0
    while True:
        page = await log.stream(path).read(after, 4, include_archive=include_archive)
        events += page.events
        if page.at_head:
            return events
        after = page.scanned_through_offset


async def test_two_runs_at_once_never_cut_one_range_twice(log: Log, store: HostStore) -> None:
    """A chunk whose start another run moved is refused, nothing written; together they cut all."""
    await fill(log, "/", 12)
    outcomes = await asyncio.gather(
        store.retention.run(RetentionAsk("/", through=12, chunk=1)),
        store.retention.run(RetentionAsk("/", through=12, chunk=1)),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, InvalidRequest), outcome
            assert "by another run meanwhile" in outcome.message
    cuts = [
        e.payload["through"]
        for e in (await log.stream("/").read(12, 100)).events
        if e.type == TRUNCATED_EVENT
    ]
    assert len(cuts) == len(set(cuts))
    assert max(cuts) == 12
    with pytest.raises(HistoryTruncated):
        await log.stream("/").read(11, 1)


async def test_a_run_gives_the_space_back_on_sqlite(
    log: Log, store: HostStore, log_target: Target
) -> None:
    """A new SQLite file shrinks once its history is taken (an in-memory log gives its pages
    back too); PostgreSQL's autovacuum reuses it."""
    big = {"blob": "x" * 2000}
    for _ in range(10):
        await log.stream("/").append(*({"type": "n", "payload": big} for _ in range(100)))
    file = log.path if log_target.backend.name == "sqlite" else None
    before = await asyncio.to_thread(size_after_checkpoint, file)
    run = await store.retention.run(RetentionAsk("/", chunk=400))
    assert run.events == 1000
    if log_target.backend.name == "postgres":
        assert run.pages_reclaimed == 0
        return
    assert run.pages_reclaimed > 400
    if file is None:
        return
    after = await asyncio.to_thread(size_after_checkpoint, file)
    assert after < before / 4, (before, after)


def size_after_checkpoint(file: str | None) -> int:
    if file is None:
        return 0
    conn = sqlite3.connect(file, timeout=30)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()
    return Path(file).stat().st_size


async def test_keep_last_keeps_the_newest_offsets_whatever_the_horizon_allows(
    log: Log, store: HostStore
) -> None:
    """A policy by count: the newest N offsets stay, and the run says what stopped it."""
    await fill(log, "/", 30)
    run = await store.retention.run(RetentionAsk("/", keep_last=10, chunk=8))
    assert (run.events, run.start_after, run.stopped_by) == (20, 21, "keep_last")
    # Each chunk's control event is an offset too: the head is 33, the newest 10 24..33.
    again = await store.retention.run(RetentionAsk("/", keep_last=10))
    assert (again.events, again.start_after, again.stopped_by) == (3, 24, "keep_last")
    assert (await store.retention.run(RetentionAsk("/", keep_last=0))).stopped_by == "horizon"
    # What is left is the runs' own records: a run leaves them and writes nothing, or each
    # run would take the one before's record and write its own, forever.
    head = await log.stream("/").head()
    idle = await store.retention.run(RetentionAsk("/", keep_last=0))
    assert (idle.events, idle.chunks, idle.stopped_by) == (0, 0, "own_records")
    assert await log.stream("/").head() == head


async def test_keep_for_stops_at_the_first_event_too_young_to_go(
    log_target: Target, tmp_path: Path
) -> None:
    """A policy by age: events older than keep_for go, in offset order, up to the first young one."""
    stamp = [time.time() - 7200]
    log = log_target.open(clock=lambda: stamp[0])
    try:
        store = host_store(log)
        await store.prepare()
        await fill(log, "/", 12)
        stamp[0] = time.time() - 60
        await fill(log, "/", 6)
        stamp[0] = time.time()  # the runs' own control events
        run = await store.retention.run(
            RetentionAsk("/", keep_for=3600, chunk=5, archive=str(tmp_path / "archive"))
        )
        assert (run.events, run.chunks, run.start_after, run.stopped_by) == (12, 3, 13, "keep_for")
        assert [s.last for s in run.segments] == [5, 10, 12]
        assert (await store.retention.run(RetentionAsk("/", keep_for=3600))).events == 0
        # Younger than an hour, no longer younger than a minute: they go too.
        run = await store.retention.run(RetentionAsk("/", keep_for=30))
        assert (run.events, run.start_after) == (6, 19)
    finally:
        await log.aclose()


async def test_a_run_under_a_lease_it_no_longer_holds_writes_nothing(
    log: Log, store: HostStore, tmp_path: Path
) -> None:
    """The fence runs first in each cut's transaction: a lost lease refuses the cut whole."""
    await fill(log, "/", 6)
    lease = await store.try_acquire(LeaseAsk("/", "streamkit:retention", "here", time.time(), TTL))
    assert lease is not None
    held = HeldLease(
        lease, store.check_fence, ttl=TTL, renewal_started=time.monotonic(), clock=time.time
    )
    assert await store.release(lease)
    archive = tmp_path / "archive"
    with pytest.raises(LeaseLost, match="this holder released it; nothing was written"):
        await store.retention.run(RetentionAsk("/", archive=str(archive), fence=held.fence))
    assert list(archive.iterdir()) == []
    assert [e.offset for e in (await log.stream("/").read(0, 10)).events] == list(range(1, 7))
    assert await store.retention.segments() == []
    # Taken again, the same run goes through.
    taken = await store.try_acquire(LeaseAsk("/", "streamkit:retention", "here", time.time(), TTL))
    assert taken is not None
    held = HeldLease(
        taken, store.check_fence, ttl=TTL, renewal_started=time.monotonic(), clock=time.time
    )
    run = await store.retention.run(RetentionAsk("/", archive=str(archive), fence=held.fence))
    assert (run.events, run.start_after) == (6, 7)


@pytest.mark.parametrize(
    ("keep", "refused"),
    [
        ({"keep_last": -1}, "keep_last must be an integer >= 0"),
        ({"keep_last": True}, "keep_last must be an integer >= 0"),
        ({"keep_for": -5.0}, "keep_for must be a number of seconds >= 0"),
        ({"keep_for": float("nan")}, "keep_for must be a number of seconds >= 0"),
        ({"chunk": 0}, "chunk must be an integer >= 1"),
    ],
)
async def test_a_policy_that_cannot_be_kept_is_refused_before_anything_is_read(
    log: Log, store: HostStore, keep: dict[str, Any], refused: str
) -> None:
    await fill(log, "/", 3)
    with pytest.raises(InvalidRequest, match=refused + ".*nothing was written"):
        await store.retention.run(RetentionAsk("/", **keep))
    assert len((await log.stream("/").read(0, 10)).events) == 3


async def test_a_run_cancelled_while_its_cut_commits_keeps_the_segment_the_cut_records(
    log: Log, store: HostStore, tmp_path: Path
) -> None:
    """A host stopping mid-chunk cancels the wait, not the transaction: the commit lands,
    and the segment it records must still be there (it was deleted: archive lost)."""
    await fill(log, "/", 6)
    rows = retention_rows(log)
    entered, release = threading.Event(), threading.Event()

    class Slow:
        def __getattr__(self, name: str) -> Any:
            return getattr(rows, name)

        def move_start(self, conn: Any, cut: Cut) -> None:
            entered.set()
            # On the writer thread (PostgreSQL) this holds the commit past the cancel. A
            # SQLite log idle enough commits inline, on the loop: there it only delays.
            release.wait(2)
            rows.move_start(conn, cut)

    run = asyncio.create_task(
        truncation.run_retention(log, Slow(), RetentionAsk("/", archive=str(tmp_path / "archive")))  # type: ignore[arg-type]
    )
    await asyncio.to_thread(entered.wait, 30)
    run.cancel()
    await asyncio.sleep(0.05)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    # The writer finished the transaction after the wait was cancelled.
    for _ in range(200):
        if await store.retention.segments("/"):
            break
        await asyncio.sleep(0.05)
    (segment,) = await store.retention.segments("/")
    assert await asyncio.to_thread(Path(segment.file).exists)
    assert await store.retention.verify_archive("/") == []


@pytest.mark.parametrize("attack", ["a payload changed", "a row deleted", "a segment swapped"])
async def test_a_segment_that_does_not_match_its_record_is_refused_on_every_read(
    log: Log, store: HostStore, tmp_path: Path, attack: str
) -> None:
    """Issue 55: `verify --archive` found each of these, but reads served the altered history
    (and a rebuild over it cut over with a wrong state). Each read now proves the segment."""
    await fill(log, "/", 20)
    archive = tmp_path / "archive"
    await store.retention.run(RetentionAsk("/", through=16, archive=str(archive), chunk=8))
    segments = sorted(archive.glob("*.segment"))
    assert len(segments) == 2
    stream = log.stream("/")
    page = await stream.read(0, 4, include_archive=True)  # proven once, as recorded
    assert [e.offset for e in page.events] == [1, 2, 3, 4]
    first, second = segments
    if attack == "a segment swapped":
        second.replace(first)  # the second range's file where the first's should be
    else:
        with sqlite3.connect(first) as conn:
            if attack == "a payload changed":
                conn.execute("""UPDATE events SET payload = '{"i":9}' WHERE "offset" = 2""")
            else:
                conn.execute('DELETE FROM events WHERE "offset" = 3')
        conn.close()
    with pytest.raises(LogTampered) as refused:
        await stream.read(0, 4, include_archive=True)
    assert refused.value.details["first"] == 1
    assert "the read was refused" in refused.value.message
    assert check_segment(await _first_segment(store)) is not None  # as verify says too


async def _first_segment(store: HostStore) -> Any:
    (first, *_) = await store.retention.segments("/")
    return first


async def test_a_retry_is_judged_as_json_the_same_before_and_after_retention(
    log: Log, store: HostStore, tmp_path: Path
) -> None:
    """Issue 55: `{"on": 1}` was taken as a retry of `{"on": true}` while stored (Python's
    True == 1) and refused once archived. JSON's types decide, the same both times; 1.0
    and 1 stay one number."""
    stream = log.stream("/")
    (first,) = await stream.append(
        {"type": "flag", "payload": {"on": True, "n": 1.0}, "idempotency_key": "f"}
    )
    await fill(log, "/", 3)

    async def verdicts() -> tuple[str, str]:
        with pytest.raises(IdempotencyConflict):
            await stream.append(
                {"type": "flag", "payload": {"on": 1, "n": 1}, "idempotency_key": "f"}
            )
        (again,) = await stream.append(
            {"type": "flag", "payload": {"n": 1, "on": True}, "idempotency_key": "f"}
        )
        assert again.offset == first.offset
        return "conflict", "same"

    assert await verdicts() == ("conflict", "same")  # stored
    await store.retention.run(RetentionAsk("/", through=2, archive=str(tmp_path / "archive")))
    assert await verdicts() == ("conflict", "same")  # archived: only its hash is compared

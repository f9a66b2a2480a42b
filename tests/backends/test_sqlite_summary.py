"""The SQLite summary of stored types, settled in steps: rows from the first event on,
counts exact after every commit whether or not a settle ran, through retention cuts.

The contract suite (tests/contract/test_stored_types_contract.py) holds every backend
to exact counts; these tests pin how SQLite keeps them without moving a row in every
commit (streamkit/backends/sqlite/_summary.py), with a small settle step so that a
few hundred events cross it many times.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import streamkit.backends.sqlite._summary as summary
from streamkit import SPEED_TRICKS, open_log
from streamkit.backends import host_store
from streamkit.history import TRUNCATED_EVENT
from streamkit.protocols import RetentionAsk
from streamkit.records import StoredType


def rows(db: Path) -> list[tuple[str, str, int, int]]:
    """The summary table as stored: (path, type, version, events)."""
    with closing(sqlite3.connect(db)) as conn:
        return list(
            conn.execute(
                "SELECT path, type, version, events FROM streamkit_type_summary ORDER BY 1, 2, 3"
            )
        )


def marks(db: Path) -> dict[str, int]:
    with closing(sqlite3.connect(db)) as conn:
        return dict(conn.execute("SELECT path, summarized_through FROM streamkit_heads"))


def event(type_: str, version: int = 1) -> dict[str, Any]:
    return {"type": type_, "payload": {}, "payload_version": version}


def stored_rows(db: Path) -> list[tuple[str, str, int, int]]:
    """Every event row the file holds: (path, type, payload version, offset)."""
    with closing(sqlite3.connect(db)) as conn:
        return list(
            conn.execute(
                'SELECT path, type, coalesce(payload_version, 1), "offset" FROM streamkit_events'
            )
        )


def counted(db: Path, archived: dict[tuple[str, str, int], list[int]]) -> list[StoredType]:
    """What the summary must say: the rows the file holds, plus the archived events."""
    found = {key: list(offsets) for key, offsets in archived.items()}
    for path, type_, version, offset in stored_rows(db):
        found.setdefault((path, type_, version), []).append(offset)
    return [
        StoredType(p, t, v, len(o), min(o), max(o)) for (p, t, v), o in sorted(found.items()) if o
    ]


@pytest.mark.speed_trick
async def test_the_first_event_of_a_type_makes_its_row_and_later_commits_leave_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    async with open_log(db) as log:
        await log.stream("/").append(event("a"))
        # Made in the first event's transaction, counted by reads until a settle.
        assert rows(db) == [("/", "a", 1, 0)]
        assert await log.stored_types() == [StoredType("/", "a", 1, 1, 1, 1)]
        for _ in range(5):
            await log.stream("/").append(event("a"))
        await log.stream("/").append(event("a", 2))
        assert rows(db) == [("/", "a", 1, 0), ("/", "a", 2, 0)]
        assert await log.stored_types() == [
            StoredType("/", "a", 1, 6, 1, 6),
            StoredType("/", "a", 2, 1, 7, 7),
        ]
    # A writer that starts again remembers nothing and inserts-if-absent again: no harm.
    async with open_log(db) as log:
        await log.stream("/").append(event("a"))
        assert await log.stored_types("/") == [
            StoredType("/", "a", 1, 7, 1, 8),
            StoredType("/", "a", 2, 1, 7, 7),
        ]


async def test_a_path_is_settled_once_it_runs_a_step_past_its_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(summary, "SETTLE_EVERY", 10)
    db = tmp_path / "log.db"
    async with open_log(db) as log:
        for _ in range(9):
            await log.stream("/").append(event("a"))
        assert marks(db)["/"] == (0 if SPEED_TRICKS else 9)
        await log.stream("/").append(event("a"))  # ten past the mark: settled in this commit
        assert marks(db)["/"] == 10
        assert rows(db) == [("/", "a", 1, 10)]
        await log.stream("/").append(*[event("b")] * 3)
        assert await log.stored_types() == [
            StoredType("/", "a", 1, 10, 1, 10),
            StoredType("/", "b", 1, 3, 11, 13),
        ]


@pytest.mark.parametrize("mode", ["archive", "delete"])
async def test_counts_stay_exact_across_settles_two_writers_and_retention_cuts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Seeded: waves of appends from two logs on one file over three paths, with retention
    cuts between them; after each wave the summary equals a full count (archived events
    counted). After a delete cut a first offset may be the path's new start rather than
    the first event left of its type (a lower bound, as before the summary was settled)."""
    monkeypatch.setattr(summary, "SETTLE_EVERY", 16)
    rng = random.Random(56)
    db = tmp_path / "log.db"
    archived: dict[tuple[str, str, int], list[int]] = {}
    async with open_log(db) as one, open_log(db) as two:
        for wave in range(14):
            calls = []
            for _ in range(rng.randint(1, 12)):
                writer = rng.choice((one, two))
                path = rng.choice(("/a", "/b", "/c"))
                batch = [
                    event(rng.choice("xyz"), rng.randint(1, 2)) for _ in range(rng.randint(1, 5))
                ]
                calls.append(writer.stream(path).append(*batch))
            await asyncio.gather(*calls)
            if wave % 4 == 3:
                path = rng.choice(("/a", "/b"))
                head = await one.stream(path).head()
                before = [row for row in stored_rows(db) if row[0] == path]
                archive = mode == "archive"
                run = await host_store(one).retention.run(
                    RetentionAsk(
                        path,
                        through=head - 3,
                        archive=str(tmp_path / "archive") if archive else None,
                    )
                )
                if archive:
                    for p, t, v, o in before:
                        if o <= run.start_after - 1:
                            archived.setdefault((p, t, v), []).append(o)
            expected = counted(db, archived)
            for writer in (one, two):
                found = await writer.stored_types()
                assert [(t.path, t.type, t.version, t.count, t.last_offset) for t in found] == [
                    (t.path, t.type, t.version, t.count, t.last_offset) for t in expected
                ]
                for got, want in zip(found, expected, strict=True):
                    assert got.first_offset <= want.first_offset
                    if mode == "archive":
                        assert got.first_offset == want.first_offset
        assert sum(t.count for t in expected) > 150


async def test_a_cut_that_takes_every_event_of_a_type_leaves_its_row_at_zero(
    tmp_path: Path,
) -> None:
    """Rows are never deleted (a writer may remember one exists); reads leave out a row of
    no events, and the type's next event is counted from its own offset."""
    db = tmp_path / "log.db"
    async with open_log(db) as log:
        await log.stream("/").append(event("gone"), event("gone"), event("kept"))
        await host_store(log).retention.run(RetentionAsk("/", through=2))
        assert ("/", "gone", 1, 0) in rows(db)
        kept = [t for t in await log.stored_types("/") if t.type != TRUNCATED_EVENT]
        assert kept == [StoredType("/", "kept", 1, 1, 3, 3)]
        (back,) = await log.stream("/").append(event("gone"))
        types = {t.type: t for t in await log.stored_types("/")}
        assert types["gone"] == StoredType("/", "gone", 1, 1, back.offset, back.offset)

"""A new SQLite log can give the space of deleted rows back to the file system.

New files are made with ``auto_vacuum = INCREMENTAL`` (it can only be set
before the first table), so ``PRAGMA incremental_vacuum`` returns freed
pages without rewriting the file; a file made by an earlier release keeps
its mode until the documented offline ``VACUUM`` (docs/log.md, "Space").
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from streamkit import open_log


def pragma(path: Path, name: str) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute(f"PRAGMA {name}").fetchone()[0])


async def test_a_new_log_returns_the_pages_of_deleted_rows_to_the_file_system(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.db"
    async with open_log(path, synchronous="NORMAL") as log:
        for start in range(0, 4000, 500):
            await log.stream("/").append(
                *(
                    {"type": "x", "payload": {"n": n, "pad": "p" * 400}}
                    for n in range(start, start + 500)
                )
            )
    assert pragma(path, "auto_vacuum") == 2  # INCREMENTAL
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    full = path.stat().st_size
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute('DELETE FROM streamkit_events WHERE "offset" <= 3000')
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert path.stat().st_size == full  # freed pages stay in the file...
        assert int(conn.execute("PRAGMA freelist_count").fetchone()[0]) > 0
        # executescript steps the pragma to its end (execute() frees one page per step)
        conn.executescript("PRAGMA incremental_vacuum;")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert int(conn.execute("PRAGMA freelist_count").fetchone()[0]) == 0
    assert path.stat().st_size < full * 0.4  # ...until the incremental vacuum gives them back
    async with open_log(path) as log:
        (event,) = await log.stream("/").append({"type": "x"})
        assert event.offset == 4001


async def test_a_log_made_before_keeps_its_mode_until_the_offline_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with open_log(path) as log:
        await log.stream("/").append({"type": "x"})
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute("VACUUM")  # what a file of an earlier release looks like
    assert pragma(path, "auto_vacuum") == 0
    async with open_log(path) as log:
        await log.stream("/").append({"type": "x"})
    assert pragma(path, "auto_vacuum") == 0  # opening never rewrites the file
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("VACUUM")  # the documented offline step
    assert pragma(path, "auto_vacuum") == 2
    async with open_log(path) as log:
        assert [e.offset for e in (await log.stream("/").read()).events] == [1, 2]

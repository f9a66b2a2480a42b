"""``streamkit schema check`` and ``schema recount``: exit codes, what is printed, refusals."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from support.upcasting import board_log

from streamkit import open_log
from streamkit.backends import host_store
from streamkit.cli import main
from streamkit.cli._schema_commands import PROBLEMS_FOUND
from streamkit.protocols import RetentionAsk

NEXT = "support.upcasting:NextTaskBoard@/tasks"
BOARD = "support.upcasting:TaskBoard@/tasks"


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture
def db(tmp_path: Path) -> tuple[str, list[int]]:
    path = str(tmp_path / "board.db")

    async def fill() -> list[int]:
        async with open_log(path) as log:
            return await board_log(log)

    return path, asyncio.run(fill())


def test_a_processor_that_reads_every_stored_key_passes(db: tuple[str, list[int]]) -> None:
    path, _ = db
    code, out = run("schema", "check", "--db", path, "--processor", NEXT)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "task-board on /tasks (on_malformed=stall): ok"
    assert "   task.created v3: 3 events (4..6): lifted to v4" in lines
    assert "   task.opened (now task.created) v1: 2 events (1..2): lifted to v4" in lines
    assert lines[-1] == "schema check: ok"


def test_validation_finds_the_payload_that_would_be_skipped(db: tuple[str, list[int]]) -> None:
    path, offsets = db
    code, out = run("schema", "check", "--db", path, "--processor", NEXT, "--validate", "all")
    assert code == PROBLEMS_FOUND
    (line,) = [line for line in out.splitlines() if line.startswith(" ! ")]
    assert line.startswith(" ! task.created v3: 3 events (4..6): lifted to v4; validated 3, ")
    assert (
        f"1 malformed: the processor would stall at {offsets[4]} (priority: Input should be "
        "a valid integer"
    ) in line
    assert out.splitlines()[-1] == "schema check: 1 problem(s) in 1 of 1 processor(s)"
    code, out = run(
        "schema", "check", "--db", path, "--processor", NEXT, "--validate", "sample=1", "--json"
    )
    assert code == 0
    (shown,) = [json.loads(line) for line in out.splitlines()]
    assert (shown["ok"], shown["validation"], shown["slug"]) == (True, "sample=1", "task-board")
    assert {(k["type"], k["version"], k["validated"]) for k in shown["stored"]} >= {
        ("task.created", 3, 1)
    }


def test_old_code_is_told_it_would_stall_at_a_newer_version(db: tuple[str, list[int]]) -> None:
    path, offsets = db
    code, out = run("schema", "check", "--db", path, "--processor", BOARD)
    assert code == PROBLEMS_FOUND
    assert (
        f" ! task.created v4: 1 events ({offsets[6]}..{offsets[6]}): AHEAD: this code reads v3; "
        f"the processor stalls at {offsets[6]} (SCHEMA_AHEAD) until newer code runs it"
    ) in out.splitlines()


def test_all_checks_every_processor_of_the_config(
    db: tuple[str, list[int]], tmp_path: Path
) -> None:
    path, _ = db
    config = tmp_path / "deploy.toml"
    config.write_text(
        f'db = "{path}"\n'
        '[[processors]]\nclass = "support.upcasting:NextTaskBoard"\npath = "/tasks"\n'
        '[[processors]]\nclass = "support.host:Tally"\npath = "/tasks"\n'
    )
    code, out = run("schema", "check", "--all", "--config", str(config))
    assert code == 0
    assert out.splitlines()[0] == "task-board on /tasks (on_malformed=stall): ok"
    # Tally defines no payload: nothing stored is its to judge.
    assert (
        "tally on /tasks (on_malformed=stall): ok\n  (nothing stored that this processor reads)"
        in out
    )


def test_a_check_without_processors_or_with_a_bad_sample_is_refused(
    db: tuple[str, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = db
    assert run("schema", "check", "--db", path) == (1, "")
    assert "needs --processor module:Class" in capsys.readouterr().err
    assert run("schema", "check", "--db", path, "--processor", NEXT, "--validate", "some") == (
        1,
        "",
    )
    assert "--validate: expected 'all' or 'sample=N'" in capsys.readouterr().err


def test_a_summary_behind_the_log_fails_the_check_until_it_is_recounted(
    db: tuple[str, list[int]],
) -> None:
    path, offsets = db
    with closing(sqlite3.connect(path)) as conn, conn:
        # A row the summary misses: added by hand, with the path's settled mark moved past
        # it (reads count what lies past the mark themselves; no writer leaves this).
        conn.execute(
            'INSERT INTO streamkit_events (path, "offset", type, payload, metadata, created_at) '
            'VALUES (\'/tasks\', ?, \'task.opened\', \'{"title": "z", "assignee": "zo"}\', '
            "'{}', '2026-01-01T00:00:00Z')",
            (offsets[-1] + 1,),
        )
        conn.execute(
            "INSERT INTO streamkit_type_summary SELECT path, type, coalesce(payload_version, 1),"
            ' count(*), min("offset"), max("offset") FROM streamkit_events'
            ' WHERE "offset" <= ? GROUP BY path, type, coalesce(payload_version, 1)'
            " ON CONFLICT DO UPDATE SET events = excluded.events,"
            " first_offset = excluded.first_offset, last_offset = excluded.last_offset",
            (offsets[-1],),
        )
        conn.execute("UPDATE streamkit_heads SET summarized_through = ?", (offsets[-1] + 1,))
    code, out = run("schema", "check", "--db", path, "--processor", NEXT)
    assert code == PROBLEMS_FOUND
    assert "  SUMMARY BEHIND: the log's head is 10 but its summary" in out
    assert run("schema", "recount", "--db", path) == (
        0,
        "recounted the summary of stored types: 6 (path, type, version) rows, 10 events\n",
    )
    assert run("schema", "check", "--db", path, "--processor", NEXT)[0] == 0


def test_validation_reads_archived_payloads_and_names_what_was_deleted(
    db: tuple[str, list[int]], tmp_path: Path
) -> None:
    """Issue 55: --validate exited 1 (HISTORY_TRUNCATED) on any log with archived history.
    It reads through the archive as a rebuild does; what was deleted is named, not hidden."""
    path, offsets = db

    async def archive_then_delete() -> None:
        async with open_log(path) as log:
            retention = host_store(log).retention
            await retention.run(
                RetentionAsk("/tasks", through=offsets[4], archive=str(tmp_path / "archive"))
            )

    asyncio.run(archive_then_delete())
    code, out = run("schema", "check", "--db", path, "--processor", NEXT, "--validate", "all")
    # The malformed payload at offsets[4] is in the archive now, and still found there.
    assert code == PROBLEMS_FOUND, out
    (line,) = [line for line in out.splitlines() if line.startswith(" ! ")]
    assert f"1 malformed: the processor would stall at {offsets[4]}" in line

    # Its archive's files gone: the ranges that cannot be read are named, the rest checked.
    shutil.rmtree(tmp_path / "archive")
    code, out = run("schema", "check", "--db", path, "--processor", NEXT, "--validate", "all")
    assert code == 0, out
    lines = out.splitlines()
    gone = "(taken by retention, and no archive of it is readable)"
    assert f"   task.created v2: 1 events (3..3): lifted to v4; NOT CHECKED: 3..3 {gone}" in lines
    assert (
        f"   task.created v3: 3 events (4..6): lifted to v4; validated 1; NOT CHECKED: 4..5 {gone}"
        in lines
    )

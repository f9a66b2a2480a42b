"""The data check before a deploy, on every backend: what the code would make of what is stored.

From the summary alone each stored (type, version) a processor reads is
current, lifted, ahead of the code or without a chain; with validation the
payloads go through chain and model as the fold reads them, and the check
counts exactly what would be skipped (with the first offsets) and what the
upcasters drop. A summary behind the log (a writer of an earlier release
appended after the upgrade) is reported, and a recount makes it exact.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

import psycopg
from psycopg import sql
from support.backends import Target
from support.upcasting import (
    CREATED,
    RETIRED,
    NextTaskBoard,
    TaskBoard,
    Tasks,
    board_log,
    stored_at,
)

from streamkit import EventDefinition, StreamProcessor, define_processor_contract, open_log
from streamkit.log import Log
from streamkit.schema_check import ProcessorCheck, check_processor


class ShortChainBoard(StreamProcessor[Tasks]):
    """A release that deleted the upcaster from version 1: task.opened v1 has no way up."""

    contract = define_processor_contract(
        slug="short-board",
        version="1",
        state_schema=Tasks,
        events={
            "task.created": EventDefinition(
                description="a task was opened",
                payload_schema=CREATED.payload_schema,
                version=3,
                upcasters={2: CREATED.upcasters[2]},
                renamed_from=("task.opened",),
            ),
            "task.retired": RETIRED,
        },
        consumes=["task.created", "task.retired"],
    )


async def check(log: Log, processor: StreamProcessor[Any], **options: Any) -> ProcessorCheck:
    stream = log.stream("/tasks")
    head = await stream.head()
    stored = await log.stored_types("/tasks")
    return await check_processor(processor.contract, stream, stored, head, **options)


def outcomes(result: ProcessorCheck) -> dict[tuple[str, int], str]:
    return {(v.stored.type, v.stored.version): v.outcome for v in result.verdicts}


async def test_each_stored_key_is_judged_from_the_summary(log: Log) -> None:
    offsets = await board_log(log)
    result = await check(log, TaskBoard())
    assert outcomes(result) == {
        ("task.created", 2): "lifted",
        ("task.created", 3): "current",
        ("task.created", 4): "ahead",
        ("task.opened", 1): "lifted",
        ("task.retired", 1): "lifted",
    }  # the note is not read by this processor: not judged
    (ahead,) = result.problems
    assert (ahead.stored.count, ahead.stored.first_offset) == (1, offsets[6])
    assert "stalls at" in ahead.describe("skip")
    assert "SCHEMA_AHEAD" in ahead.describe("skip")
    assert not result.ok
    assert not result.summary_behind
    opened = next(v for v in result.verdicts if v.stored.type == "task.opened")
    assert (opened.reads_as, opened.stored.count, opened.validated) == ("task.created", 2, 0)

    assert outcomes(await check(log, NextTaskBoard()))[("task.created", 4)] == "current"
    short = await check(log, ShortChainBoard())
    assert outcomes(short)[("task.opened", 1)] == "no_chain"
    assert outcomes(short)[("task.created", 2)] == "lifted"
    assert [v.stored.type for v in short.problems] == ["task.created", "task.opened"]


async def test_validation_counts_exactly_what_would_be_skipped_and_dropped(log: Log) -> None:
    offsets = await board_log(log)
    result = await check(log, NextTaskBoard(), validate="all")
    verdicts = {(v.stored.type, v.stored.version): v for v in result.verdicts}
    v3 = verdicts[("task.created", 3)]
    assert (v3.validated, v3.skipped, v3.first_skipped) == (3, 1, (offsets[4],))
    assert v3.why is not None
    assert "priority" in v3.why
    assert "1 would be skipped" in v3.describe("skip")
    assert f"would stall at {offsets[4]}" in v3.describe("stall")
    retired = verdicts[("task.retired", 1)]
    assert (retired.validated, retired.dropped, retired.skipped) == (1, 1, 0)
    assert verdicts[("task.opened", 1)].validated == 2
    assert [v.stored.version for v in result.problems] == [3]
    # A strict processor: the same payload is a stall, named as one.
    strict = await check(log, NextTaskBoard(), validate="all", on_malformed="stall")
    assert strict.on_malformed == "stall"
    # A sample reads at most N of each key: here the first v3 payload, which is fine.
    sampled = await check(log, NextTaskBoard(), validate=1)
    v3 = next(v for v in sampled.verdicts if v.stored.version == 3)
    assert (v3.validated, v3.skipped) == (1, 0)
    assert sampled.validation == "sample=1"


async def test_appends_between_the_head_and_the_summary_are_not_a_summary_behind(
    log: Log,
) -> None:
    """Read as callers do (the head first), a commit in between is counted, not flagged."""
    await board_log(log)
    stream = log.stream("/tasks")
    head = await stream.head()
    await stream.append(stored_at(3, "late", 1, "la"))  # another writer, meanwhile
    stored = await log.stored_types("/tasks")
    result = await check_processor(TaskBoard.contract, stream, stored, head)
    assert not result.summary_behind
    assert result.summary_through == head + 1


async def write_as_an_earlier_release(log_target: Target, path: str, offset: int) -> None:
    """An event row written by a writer that does not know the summary (nor moves it)."""
    if log_target.schema is None:
        with closing(sqlite3.connect(log_target.target)) as conn, conn:
            conn.execute(
                'INSERT INTO streamkit_events (path, "offset", type, payload, metadata, '
                "created_at) VALUES (?, ?, 'task.opened', '{}', '{}', '2026-01-01T00:00:00Z')",
                (path, offset),
            )
        return
    url, schema = log_target.schema
    name = sql.Identifier(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                'INSERT INTO {}.streamkit_events (path, "offset", type, payload, metadata, '
                "created_at) VALUES (%s, %s, 'task.opened', '{{}}', '{{}}', '2026')"
            ).format(name),
            (path, offset),
        )
        conn.execute(
            sql.SQL("UPDATE {}.streamkit_heads SET head = %s WHERE path = %s").format(name),
            (offset, path),
        )


async def test_a_summary_behind_the_log_is_reported_and_a_recount_makes_it_exact(
    log_target: Target,
) -> None:
    """PostgreSQL: a row the summary does not count is reported; on SQLite a read counts
    every row past the path's settled mark, so a row a writer of an earlier release added
    there is counted at once (it can add none below it: it appends past the head)."""
    async with open_log(log_target.target) as log:
        offsets = await board_log(log)
    await write_as_an_earlier_release(log_target, "/tasks", offsets[-1] + 1)
    async with open_log(log_target.target) as log:
        if log_target.schema is None:
            counted = await check(log, TaskBoard())
            assert not counted.summary_behind
            opened = next(v for v in counted.verdicts if v.stored.type == "task.opened")
            assert (opened.stored.count, opened.stored.last_offset) == (3, offsets[-1] + 1)
            return
        behind = await check(log, TaskBoard())
        assert behind.summary_behind
        assert not behind.ok
        assert (behind.head, behind.summary_through) == (offsets[-1] + 1, offsets[-1])
        assert "SUMMARY BEHIND" in "\n".join(behind.lines())
        await log.stream("/tasks").append(stored_at(3, "g", 1, "gi"))  # appends go on
        await log.recount_stored_types()
        after = await check(log, TaskBoard())
        assert not after.summary_behind
        opened = next(v for v in after.verdicts if v.stored.type == "task.opened")
        assert (opened.stored.count, opened.stored.last_offset) == (3, offsets[-1] + 1)

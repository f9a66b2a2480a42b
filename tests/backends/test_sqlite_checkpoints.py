"""Tests for streamkit.checkpoint: one row per slug, one statement per write, a hard ceiling."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamkit import (
    CheckpointStorage,
    CheckpointTooLarge,
    CutoverRaced,
    InvalidRequest,
    ReduceCheckpoint,
    ReduceCheckpointTable,
    StorageBusy,
    StorageError,
)
from streamkit.checkpoint import MAX_CHECKPOINT_STATE_BYTES


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(tmp_path / "checkpoints.db")
    yield connection
    connection.close()


@pytest.fixture
def table(conn: sqlite3.Connection) -> ReduceCheckpointTable:
    return ReduceCheckpointTable(conn)


def stored_row(conn: sqlite3.Connection, slug: str) -> tuple[object, ...] | None:
    row = conn.execute(
        "SELECT reducer_version, reduced_through_offset, state FROM streamkit_checkpoints"
        " WHERE slug = ?",
        (slug,),
    ).fetchone()
    return None if row is None else tuple(row)


def traced(conn: sqlite3.Connection) -> list[str]:
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    return statements


def test_round_trip(table: ReduceCheckpointTable) -> None:
    """A written checkpoint reads back field for field."""
    table.write("board", reducer_version="3", reduced_through_offset=42, state_json='{"n":1}')
    assert table.read("board") == ReduceCheckpoint("3", 42, '{"n":1}')


def test_missing_slug_reads_none(table: ReduceCheckpointTable) -> None:
    """A slug that never wrote has no checkpoint."""
    assert table.read("nobody") is None
    assert table.slugs() == []


def test_none_state_keeps_the_stored_state_column(
    conn: sqlite3.Connection, table: ReduceCheckpointTable
) -> None:
    """state_json=None moves version and cursor but leaves the state column as stored."""
    table.write("board", reducer_version="1", reduced_through_offset=5, state_json='{"n":7}')
    table.write("board", reducer_version="1", reduced_through_offset=9, state_json=None)
    assert stored_row(conn, "board") == ("1", 9, '{"n":7}')


def test_none_state_on_a_new_slug_stores_null(
    conn: sqlite3.Connection, table: ReduceCheckpointTable
) -> None:
    """A first write without a state stores NULL: the reduce never changed the initial state."""
    table.write("fresh", reducer_version="1", reduced_through_offset=3, state_json=None)
    assert stored_row(conn, "fresh") == ("1", 3, None)
    assert table.read("fresh") == ReduceCheckpoint("1", 3, None)


@pytest.mark.parametrize("isolation_level", [None, "", "IMMEDIATE"])
@pytest.mark.parametrize("state_json", ['{"n":1}', None])
def test_each_save_is_exactly_one_statement(
    tmp_path: Path, isolation_level: str | None, state_json: str | None
) -> None:
    """A write issues one SQL statement (an UPSERT) besides the driver's own BEGIN/COMMIT."""
    with closing(sqlite3.connect(tmp_path / "c.db", isolation_level=isolation_level)) as conn:
        table = ReduceCheckpointTable(conn)
        table.write("board", reducer_version="1", reduced_through_offset=1, state_json="{}")
        statements = traced(conn)
        table.write("board", reducer_version="1", reduced_through_offset=2, state_json=state_json)
        conn.set_trace_callback(None)
        work = [s for s in statements if s.split()[0].upper() not in {"BEGIN", "COMMIT"}]
        assert len(work) == 1
        assert work[0].lstrip().upper().startswith("INSERT INTO")
        assert "ON CONFLICT" in work[0].upper()
        if isolation_level is None:
            assert statements == work  # autocommit: the UPSERT is the whole transaction
        assert not conn.in_transaction
        assert table.writes == 2


def test_writes_counts_successful_statements(table: ReduceCheckpointTable) -> None:
    """``writes`` counts checkpoint statements, not the DDL and not refusals."""
    assert table.writes == 0
    table.write("a", reducer_version="1", reduced_through_offset=1, state_json=None)
    table.write("a", reducer_version="1", reduced_through_offset=2, state_json="[]")
    with pytest.raises(CheckpointTooLarge):
        table.write(
            "a",
            reducer_version="1",
            reduced_through_offset=3,
            state_json="x" * (MAX_CHECKPOINT_STATE_BYTES + 1),
        )
    assert table.writes == 2


def test_ceiling_refusal_writes_nothing(
    conn: sqlite3.Connection, table: ReduceCheckpointTable
) -> None:
    """A state over the ceiling is refused before any SQL: the stored row is unchanged."""
    table.write("board", reducer_version="1", reduced_through_offset=10, state_json='{"n":1}')
    statements = traced(conn)
    oversized = '"' + "x" * MAX_CHECKPOINT_STATE_BYTES + '"'
    with pytest.raises(CheckpointTooLarge) as refused:
        table.write("board", reducer_version="2", reduced_through_offset=11, state_json=oversized)
    conn.set_trace_callback(None)
    assert statements == []
    assert stored_row(conn, "board") == ("1", 10, '{"n":1}')
    error = refused.value
    assert error.code == "REDUCE_CHECKPOINT_TOO_LARGE"
    assert error.retryable is False
    assert error.details == {
        "slug": "board",
        "size": len(oversized),
        "limit": MAX_CHECKPOINT_STATE_BYTES,
    }
    assert "a reduce must keep a summary, not the events" in str(error)
    assert "nothing was written" in str(error)
    assert '"board"' in str(error)


def test_ceiling_counts_utf8_bytes_and_allows_exactly_the_limit(
    conn: sqlite3.Connection, table: ReduceCheckpointTable
) -> None:
    """The ceiling is in UTF-8 bytes: exactly at it is stored, one multi-byte char over is not."""
    at_limit = "a" * MAX_CHECKPOINT_STATE_BYTES
    table.write("edge", reducer_version="1", reduced_through_offset=1, state_json=at_limit)
    assert table.read("edge") == ReduceCheckpoint("1", 1, at_limit)
    over = "é" * (MAX_CHECKPOINT_STATE_BYTES // 2 + 1)  # fewer chars than the limit, more bytes
    assert len(over) < MAX_CHECKPOINT_STATE_BYTES
    with pytest.raises(CheckpointTooLarge):
        table.write("edge", reducer_version="1", reduced_through_offset=2, state_json=over)
    assert stored_row(conn, "edge") == ("1", 1, at_limit)


def test_each_version_has_its_row_and_the_first_one_serves(table: ReduceCheckpointTable) -> None:
    """A second version's write is a row of its own; the serving one is untouched."""
    table.write("board", reducer_version="1", reduced_through_offset=100, state_json='{"v":1}')
    table.write("board", reducer_version="2", reduced_through_offset=7, state_json='{"v":2}')
    table.write("board", reducer_version="1", reduced_through_offset=101, state_json=None)
    assert table.read("board") == ReduceCheckpoint("1", 101, '{"v":1}')
    assert table.read("board", "2") == ReduceCheckpoint("2", 7, '{"v":2}', serving=False)
    assert table.read("board", "3") is None
    assert table.slugs() == ["board"]
    assert [c.reducer_version for c in table.versions("board")] == ["1", "2"]


def test_a_cutover_moves_the_serving_mark_and_keeps_the_replaced_row(
    table: ReduceCheckpointTable,
) -> None:
    table.write("board", reducer_version="1", reduced_through_offset=100, state_json='{"v":1}')
    table.write("board", reducer_version="2", reduced_through_offset=40, state_json='{"v":2}')
    table.serve(
        "board",
        reducer_version="2",
        reduced_through_offset=100,
        state_json='{"v":22}',
        replacing="1",
    )
    assert table.read("board") == ReduceCheckpoint("2", 100, '{"v":22}', cutover_offset=100)
    assert table.read("board", "1") == ReduceCheckpoint(
        "1", 100, '{"v":1}', serving=False, retired_at=100
    )
    assert [c.reducer_version for c in table.versions("board")] == ["2", "1"]
    # A rollback is a cutover too: version 1 serves again from where 2 stands.
    table.write("board", reducer_version="2", reduced_through_offset=120, state_json=None)
    table.serve(
        "board",
        reducer_version="1",
        reduced_through_offset=120,
        state_json='{"v":1}',
        replacing="2",
    )
    assert table.read("board") == ReduceCheckpoint("1", 120, '{"v":1}', cutover_offset=120)
    assert table.read("board", "2") == ReduceCheckpoint(
        "2", 120, '{"v":22}', serving=False, cutover_offset=100, retired_at=120
    )


@pytest.mark.parametrize(
    ("replacing", "through", "why"),
    [
        ("1", 99, "has processed through offset 100"),
        ("0", 100, "version '1' serves now"),
        (None, 100, "version '1' serves now"),
    ],
)
def test_a_cutover_that_the_serving_version_outran_writes_nothing(
    table: ReduceCheckpointTable, replacing: str | None, through: int, why: str
) -> None:
    table.write("board", reducer_version="1", reduced_through_offset=100, state_json='{"v":1}')
    table.write("board", reducer_version="2", reduced_through_offset=40, state_json='{"v":2}')
    before = table.versions("board")
    with pytest.raises(CutoverRaced, match=why) as raised:
        table.serve(
            "board",
            reducer_version="2",
            reduced_through_offset=through,
            state_json='{"v":22}',
            replacing=replacing,
        )
    assert raised.value.retryable
    assert "nothing was written" in str(raised.value)
    assert table.versions("board") == before


def test_two_slugs_are_independent(conn: sqlite3.Connection, table: ReduceCheckpointTable) -> None:
    """Writing one slug never touches another's row."""
    table.write("a", reducer_version="1", reduced_through_offset=1, state_json='"A"')
    table.write("b", reducer_version="9", reduced_through_offset=50, state_json='"B"')
    table.write("a", reducer_version="1", reduced_through_offset=2, state_json=None)
    assert table.read("a") == ReduceCheckpoint("1", 2, '"A"')
    assert table.read("b") == ReduceCheckpoint("9", 50, '"B"')
    assert table.slugs() == ["a", "b"]
    assert conn.execute("SELECT count(*) FROM streamkit_checkpoints").fetchone() == (2,)


def test_reopened_file_gives_the_same_checkpoint(tmp_path: Path) -> None:
    """A checkpoint written to a file is read back by a new connection after the first closed."""
    path = tmp_path / "durable.db"
    with closing(sqlite3.connect(path)) as first:
        ReduceCheckpointTable(first).write(
            "board", reducer_version="4", reduced_through_offset=12, state_json='{"open":[1,2]}'
        )
    with closing(sqlite3.connect(path)) as second:
        table = ReduceCheckpointTable(second, create_table=False)
        assert table.read("board") == ReduceCheckpoint("4", 12, '{"open":[1,2]}')


def test_write_leaves_no_open_transaction(conn: sqlite3.Connection) -> None:
    """In Python's default transaction mode a write commits its own implicit transaction."""
    table = ReduceCheckpointTable(conn)
    table.write("board", reducer_version="1", reduced_through_offset=1, state_json="{}")
    assert not conn.in_transaction


def test_write_joins_a_transaction_the_caller_holds(conn: sqlite3.Connection) -> None:
    """Inside the caller's transaction the write is theirs to commit or roll back."""
    table = ReduceCheckpointTable(conn)
    conn.commit()
    conn.execute("BEGIN")
    table.write("board", reducer_version="1", reduced_through_offset=1, state_json="{}")
    assert conn.in_transaction
    conn.rollback()
    assert table.read("board") is None


def test_custom_and_keyword_table_names(conn: sqlite3.Connection) -> None:
    """A table name that is an SQL keyword still works, and tables do not share rows."""
    named = ReduceCheckpointTable(conn, table="order")
    default = ReduceCheckpointTable(conn)
    named.write("x", reducer_version="1", reduced_through_offset=1, state_json="1")
    assert named.read("x") == ReduceCheckpoint("1", 1, "1")
    assert default.read("x") is None


@pytest.mark.parametrize(
    "bad", ["", "1abc", "a-b", "t; DROP TABLE x", 'a"b', "a b", "x" * 129, 7, None]
)
def test_table_name_must_be_an_identifier(conn: sqlite3.Connection, bad: object) -> None:
    """A table name that is not a plain identifier is refused before any SQL."""
    statements = traced(conn)
    with pytest.raises(InvalidRequest, match="not a plain SQL identifier"):
        ReduceCheckpointTable(conn, table=bad)  # type: ignore[arg-type]
    conn.set_trace_callback(None)
    assert statements == []


def test_missing_table_without_create_is_a_storage_error(conn: sqlite3.Connection) -> None:
    """create_table=False over a database without the table fails as StorageError from sqlite3."""
    table = ReduceCheckpointTable(conn, create_table=False)
    with pytest.raises(StorageError) as failed:
        table.read("board")
    assert isinstance(failed.value.__cause__, sqlite3.OperationalError)
    assert not isinstance(failed.value, StorageBusy)


def test_closed_connection_is_a_storage_error(tmp_path: Path) -> None:
    """Using a closed connection raises StorageError chained to the sqlite3 error."""
    conn = sqlite3.connect(tmp_path / "c.db")
    table = ReduceCheckpointTable(conn)
    conn.close()
    with pytest.raises(StorageError) as failed:
        table.write("board", reducer_version="1", reduced_through_offset=1, state_json=None)
    assert isinstance(failed.value.__cause__, sqlite3.Error)
    assert table.writes == 0


def test_locked_database_is_storage_busy(tmp_path: Path) -> None:
    """A write blocked by another connection's lock is StorageBusy (retryable) and writes nothing."""
    path = tmp_path / "shared.db"
    with (
        closing(sqlite3.connect(path, isolation_level=None)) as holder,
        closing(sqlite3.connect(path, timeout=0)) as writer,
    ):
        table = ReduceCheckpointTable(writer)
        table.write("board", reducer_version="1", reduced_through_offset=1, state_json="{}")
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StorageBusy) as busy:
            table.write("board", reducer_version="1", reduced_through_offset=2, state_json="[]")
        assert busy.value.retryable is True
        assert not writer.in_transaction
        holder.execute("ROLLBACK")
        assert table.read("board") == ReduceCheckpoint("1", 1, "{}")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("slug", ""),
        ("reducer_version", 1),
        ("reduced_through_offset", -1),
        ("reduced_through_offset", True),
        ("reduced_through_offset", 1.5),
        ("state_json", {"n": 1}),
    ],
)
def test_bad_arguments_are_refused_before_writing(
    conn: sqlite3.Connection, table: ReduceCheckpointTable, field: str, value: object
) -> None:
    """A malformed argument is an InvalidRequest and the row stays as it was."""
    table.write("board", reducer_version="1", reduced_through_offset=1, state_json='"s"')
    args: dict[str, object] = {
        "slug": "board",
        "reducer_version": "1",
        "reduced_through_offset": 2,
        "state_json": None,
    }
    args[field] = value
    with pytest.raises(InvalidRequest, match="nothing was written"):
        table.write(**args)  # type: ignore[arg-type]
    assert stored_row(conn, "board") == ("1", 1, '"s"')


def test_state_that_is_not_valid_unicode_is_refused(
    conn: sqlite3.Connection, table: ReduceCheckpointTable
) -> None:
    """A state string with a lone surrogate is refused as bad input, not a crash."""
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        table.write("board", reducer_version="1", reduced_through_offset=1, state_json='"\ud800"')
    assert stored_row(conn, "board") is None


async def test_async_twins_and_protocol(table: ReduceCheckpointTable) -> None:
    """load/save are the async face of read/write, and the table is a CheckpointStorage."""
    assert isinstance(table, CheckpointStorage)
    storage: CheckpointStorage = table
    await storage.save("board", reducer_version="1", reduced_through_offset=3, state_json="[1]")
    await storage.save("board", reducer_version="1", reduced_through_offset=4, state_json=None)
    assert await storage.load("board") == ReduceCheckpoint("1", 4, "[1]")
    assert await storage.load("other") is None
    assert table.writes == 2


writes_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["1", "2"]),
        st.integers(min_value=0, max_value=2**62),
        st.none() | st.text(max_size=20),
    ),
    max_size=30,
)


@given(writes=writes_strategy)
def test_any_write_sequence_reads_back_the_last_cursor_and_last_given_state(
    writes: list[tuple[str, str, int, str | None]],
) -> None:
    """Per slug and version: the last cursor and the last state that was not None.

    The first version written for a slug is the one that serves.
    """
    with closing(sqlite3.connect(":memory:")) as conn:
        table = ReduceCheckpointTable(conn)
        expected: dict[tuple[str, str], ReduceCheckpoint] = {}
        first: dict[str, str] = {}
        for slug, version, offset, state in writes:
            table.write(
                slug, reducer_version=version, reduced_through_offset=offset, state_json=state
            )
            key = (slug, version)
            kept = expected[key].state_json if key in expected and state is None else state
            serving = first.setdefault(slug, version) == version
            expected[key] = ReduceCheckpoint(version, offset, kept, serving=serving)
        stored = {
            (slug, c.reducer_version): c for slug in table.slugs() for c in table.versions(slug)
        }
        assert stored == expected
        assert {slug: table.read(slug) for slug in table.slugs()} == {
            slug: expected[(slug, version)] for slug, version in first.items()
        }
        assert table.writes == len(writes)

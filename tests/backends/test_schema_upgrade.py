"""Logs of schemas 1 to 5 are upgraded in place when opened for writing, in both backends.

Schema 2 gave a checkpoint's state an offset of its own (``state_offset``);
schema 3 gave an event row the version of its payload (``payload_version``);
schema 4 added the summary of stored types, counted from the rows at upgrade;
schema 5 keys checkpoints by slug and version, each old row serving;
schema 6 keeps idempotency keys in a table of their own, copied from the
index over the events, and on SQLite each path's durable head in its heads
row, set from the rows (PostgreSQL always kept it there).
A row an older schema wrote reads as current (NULL: the state is the
cursor's; the payload is version 1), the version moves in the same
transaction as the columns, and a reader that may not write says how to
upgrade instead of guessing.
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.postgres import dropped_after, fresh_schema_name, postgres_url
from support.retention import retention_rows

from streamkit import (
    SPEED_TRICKS,
    IdempotencyConflict,
    LogOpenError,
    ReduceCheckpoint,
    ReduceCheckpointTable,
    open_log,
)
from streamkit.backends import host_store
from streamkit.backends._retention.key_windows import forget_expired_keys
from streamkit.backends.postgres._schema import SCHEMA_VERSION, ensure_schema, stored_version
from streamkit.backends.sqlite._layout import SCHEMA_VERSION as SQLITE_VERSION
from streamkit.cli import main
from streamkit.history import TRUNCATED_EVENT
from streamkit.host._lease_keeper import HeldLease
from streamkit.protocols import LeaseAsk, RetentionAsk
from streamkit.records import StoredType


def old_checkpoint_table(schema: int, name: str = "streamkit_checkpoints") -> str:
    """The checkpoint table as schema ``schema`` (before 5) made it: one row per slug."""
    state_offset = ", state_offset INTEGER" if schema >= 2 else ""
    return (
        f"CREATE TABLE {name} (slug TEXT PRIMARY KEY, reducer_version TEXT NOT NULL,"
        f" reduced_through_offset INTEGER NOT NULL, state TEXT{state_offset})"
    )


OLD_KEY_INDEX = (
    "CREATE UNIQUE INDEX streamkit_events_idempotency ON {schema}streamkit_events "
    "(path, idempotency_key) WHERE idempotency_key IS NOT NULL"
)
"""Where schemas 1 to 5 kept idempotency keys: an index over the events."""


def downgrade_sqlite(path: Path, to: int = 1) -> None:
    """Make ``path`` look as schema ``to`` left it: without what later schemas added."""
    with closing(sqlite3.connect(path)) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if to < 10:
            # Schemas 4 to 9 moved streamkit_stored_types in every commit: exact, no marks.
            conn.execute(
                "CREATE TABLE streamkit_stored_types (path TEXT NOT NULL, type TEXT NOT NULL,"
                " version INTEGER NOT NULL, events INTEGER NOT NULL,"
                " first_offset INTEGER NOT NULL, last_offset INTEGER NOT NULL,"
                " PRIMARY KEY (path, type, version)) WITHOUT ROWID"
            )
            # What release 10 reads (archived events counted), as 9 kept it.
            conn.execute(
                "INSERT INTO streamkit_stored_types SELECT path, type, version, sum(n),"
                " min(f), max(la) FROM (SELECT path, type, version, events AS n,"
                " CASE WHEN events > 0 THEN first_offset END AS f,"
                " CASE WHEN events > 0 THEN last_offset END AS la FROM streamkit_type_summary"
                " UNION ALL SELECT e.path, e.type, coalesce(e.payload_version, 1), count(*),"
                ' min(e."offset"), max(e."offset") FROM streamkit_heads h JOIN streamkit_events e'
                ' ON e.path = h.path AND e."offset" > h.summarized_through'
                " GROUP BY e.path, e.type, coalesce(e.payload_version, 1))"
                " GROUP BY path, type, version HAVING sum(n) > 0"
            )
            conn.execute("DROP TABLE streamkit_type_summary")
            conn.execute("ALTER TABLE streamkit_heads DROP COLUMN summarized_through")
        if to < 9:
            # Schemas 6 to 8 moved each heads row in every commit: exact, with no trigger.
            conn.execute("DROP TRIGGER streamkit_events_deleted")
            conn.execute(
                'UPDATE streamkit_heads SET head = max(head, coalesce((SELECT max("offset")'
                " FROM streamkit_events AS e WHERE e.path = streamkit_heads.path), 0))"
            )
        if to < 8:
            conn.execute("DROP TABLE streamkit_key_windows")
            conn.execute("DROP INDEX streamkit_keys_recorded")
        if to < 7:
            conn.execute("DROP TABLE streamkit_holds")
            conn.execute("DROP TABLE streamkit_segments")
            conn.execute("ALTER TABLE streamkit_heads DROP COLUMN truncated_through")
            if "streamkit_checkpoints" in tables:
                conn.execute("ALTER TABLE streamkit_checkpoints DROP COLUMN path")
                conn.execute("ALTER TABLE streamkit_checkpoints DROP COLUMN retain_from")
        if "streamkit_checkpoints" in tables and to < 5:
            conn.execute(old_checkpoint_table(to, "old_checkpoints"))
            conn.execute(
                "INSERT INTO old_checkpoints SELECT slug, reducer_version,"
                f" reduced_through_offset, state{', state_offset' if to >= 2 else ''}"
                " FROM streamkit_checkpoints"
            )
            conn.execute("DROP TABLE streamkit_checkpoints")
            conn.execute("ALTER TABLE old_checkpoints RENAME TO streamkit_checkpoints")
        if to < 3:
            conn.execute("ALTER TABLE streamkit_events DROP COLUMN payload_version")
        if to < 4:
            conn.execute("DROP TABLE streamkit_stored_types")
        if to < 6:
            conn.execute("ALTER TABLE streamkit_heads DROP COLUMN head")
            conn.execute("DROP TABLE streamkit_keys")
            conn.execute(OLD_KEY_INDEX.format(schema=""))
        conn.execute("UPDATE streamkit_meta SET value = ? WHERE key = 'schema_version'", (str(to),))
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def columns(path: Path, table: str = "streamkit_checkpoints") -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def version(path: Path) -> str:
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT value FROM streamkit_meta WHERE key = 'schema_version'")
        return str(row.fetchone()[0])


async def make_schema_1_log(path: Path) -> None:
    async with open_log(path) as log:
        await log.stream("/").append({"type": "item"})
        await host_store(log).prepare()
        await log.write_transaction(
            lambda conn: ReduceCheckpointTable(conn, create_table=False).write(
                "tally", reducer_version="1", reduced_through_offset=1, state_json='{"n":1}'
            )
        )
    downgrade_sqlite(path)


async def test_a_sqlite_log_of_schema_1_is_upgraded_when_opened_for_writing(
    tmp_path: Path,
) -> None:
    """The writer adds the column and moves the version; the old row reads as current."""
    path = tmp_path / "old.db"
    await make_schema_1_log(path)
    assert "state_offset" not in columns(path)
    assert version(path) == "1"
    async with open_log(path) as log:
        stored = await log.query(
            lambda conn: ReduceCheckpointTable(conn, create_table=False).read("tally")
        )
        assert stored == ReduceCheckpoint("1", 1, '{"n":1}', None)
        assert [e.offset for e in (await log.stream("/").read()).events] == [1]
    assert "state_offset" in columns(path)
    assert "payload_version" in columns(path, "streamkit_events")
    assert version(path) == str(SQLITE_VERSION)


async def test_a_sqlite_log_of_schema_1_opened_read_only_says_how_to_upgrade(
    tmp_path: Path,
) -> None:
    """A reader that may not write refuses it, unchanged, and names the way out."""
    path = tmp_path / "old.db"
    await make_schema_1_log(path)
    before = path.read_bytes()
    with pytest.raises(LogOpenError, match=f"upgraded to {SQLITE_VERSION} when a host"):
        open_log(path, read_only=True)
    assert path.read_bytes() == before


def test_a_user_checkpoint_table_of_schema_1_gains_the_column(tmp_path: Path) -> None:
    """ReduceCheckpointTable over a table made before the column adds it; old rows are current."""
    with closing(sqlite3.connect(tmp_path / "app.db")) as conn:
        conn.execute(
            "CREATE TABLE mine (slug TEXT PRIMARY KEY, reducer_version TEXT NOT NULL,"
            " reduced_through_offset INTEGER NOT NULL, state TEXT)"
        )
        conn.execute("INSERT INTO mine VALUES ('a', '1', 4, '[1]')")
        conn.commit()
        table = ReduceCheckpointTable(conn, table="mine")
        assert table.read("a") == ReduceCheckpoint("1", 4, "[1]", None)
        table.write(
            "a", reducer_version="1", reduced_through_offset=6, state_json=None, state_offset=4
        )
        assert table.read("a") == ReduceCheckpoint("1", 6, "[1]", 4)


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(postgres_url(), autocommit=True)


def old_postgres_checkpoints(conn: psycopg.Connection[Any], schema: str, to: int) -> None:
    """Make the (empty) checkpoint table of ``schema`` as schema ``to`` (before 5) made it."""
    name = sql.Identifier(schema)
    conn.execute(sql.SQL("DROP TABLE {}.streamkit_checkpoints").format(name))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {}.streamkit_checkpoints (slug text PRIMARY KEY, reducer_version text "
            "NOT NULL, reduced_through_offset bigint NOT NULL, state text"
            + (", state_offset bigint)" if to >= 2 else ")")
        ).format(name)
    )


def test_a_postgres_log_of_schema_1_is_upgraded_when_opened() -> None:
    """ensure_schema adds the column and moves the version in one transaction; rows survive."""
    schema = fresh_schema_name()
    with dropped_after(postgres_url(), schema), _connect() as conn:
        ensure_schema(conn, schema, "test")
        name = sql.Identifier(schema)
        old_postgres_checkpoints(conn, schema, 1)
        conn.execute(
            sql.SQL("ALTER TABLE {}.streamkit_events DROP COLUMN payload_version").format(name)
        )
        conn.execute(sql.SQL("DROP TABLE {}.streamkit_stored_types").format(name))
        conn.execute(
            sql.SQL("INSERT INTO {}.streamkit_checkpoints VALUES ('tally', '1', 4, '[1]')").format(
                name
            )
        )
        conn.execute(sql.SQL("UPDATE {}.streamkit_meta SET schema_version = 1").format(name))
        assert stored_version(conn, schema) == 1

        ensure_schema(conn, schema, "test")
        assert stored_version(conn, schema) == SCHEMA_VERSION == 9
        row = conn.execute(
            sql.SQL(
                "SELECT reduced_through_offset, state, state_offset FROM {}.streamkit_checkpoints"
            ).format(name)
        ).fetchone()
        assert row == (4, "[1]", None)
        ensure_schema(conn, schema, "test")  # a second opener changes nothing
        assert stored_version(conn, schema) == SCHEMA_VERSION


async def write_lagging_checkpoint(path: Path) -> None:
    async with open_log(path) as log:
        await host_store(log).prepare()
        # The log holds the events the cursor names: a snapshot is never shown past the head.
        await log.stream("/").append(*({"type": "tick", "payload": {}} for _ in range(9)))
        await log.write_transaction(
            lambda conn: ReduceCheckpointTable(conn, create_table=False).write(
                "tally",
                reducer_version="1",
                reduced_through_offset=9,
                state_json='{"n":4}',
                state_offset=4,
            )
        )


def test_a_stopped_processor_s_snapshot_names_the_state_s_offset_and_the_cursor(
    tmp_path: Path,
) -> None:
    """``streamkit snapshot`` from a checkpoint whose state lags prints both offsets."""
    path = tmp_path / "lag.db"
    asyncio.run(write_lagging_checkpoint(path))
    out = io.StringIO()
    assert main(["snapshot", "tally", "--db", str(path), "--json"], out=out) == 0
    shown = json.loads(out.getvalue())
    assert (shown["offset"], shown["cursor"], shown["state"]) == (4, 9, {"n": 4})
    out = io.StringIO()
    assert main(["snapshot", "tally", "--db", str(path)], out=out) == 0
    assert out.getvalue().splitlines()[0] == (
        "offset 4 (checkpoint; cursor 9, the events after the offset are reduced again at start)"
    )


# -- schema 2 to 3: payload versions ------------------------------------------------------


async def test_a_sqlite_log_of_schema_2_reads_its_events_as_version_1_and_keeps_new_ones(
    tmp_path: Path,
) -> None:
    """Events stored before the column read as version 1; an append after keeps its version."""
    path = tmp_path / "v2.db"
    async with open_log(path) as log:
        await log.stream("/").append({"type": "item", "payload": {"n": 1}})
    downgrade_sqlite(path, to=2)
    assert "payload_version" not in columns(path, "streamkit_events")
    with pytest.raises(LogOpenError, match=f"upgraded to {SQLITE_VERSION} when a host"):
        open_log(path, read_only=True)
    async with open_log(path) as log:
        stream = log.stream("/")
        await stream.append({"type": "item", "payload": {"n": 2}, "payload_version": 4})
        events = (await stream.read()).events
    assert [(e.offset, e.payload_version) for e in events] == [(1, 1), (2, 4)]
    assert version(path) == str(SQLITE_VERSION)
    with closing(sqlite3.connect(path)) as conn:
        stored = conn.execute('SELECT payload_version FROM streamkit_events ORDER BY "offset"')
        assert [row[0] for row in stored] == [None, 4]  # the old row is not rewritten


async def test_a_postgres_log_of_schema_2_reads_its_events_as_version_1_and_keeps_new_ones() -> (
    None
):
    """ensure_schema adds the column; the old row reads as version 1, a new one keeps its own."""
    schema = fresh_schema_name()
    url = postgres_url()
    target = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    with dropped_after(url, schema):
        async with open_log(target) as log:
            await log.stream("/").append({"type": "item", "payload": {"n": 1}})
        with _connect() as conn:
            name = sql.Identifier(schema)
            old_postgres_checkpoints(conn, schema, 2)
            conn.execute(
                sql.SQL("ALTER TABLE {}.streamkit_events DROP COLUMN payload_version").format(name)
            )
            conn.execute(sql.SQL("DROP TABLE {}.streamkit_stored_types").format(name))
            conn.execute(sql.SQL("UPDATE {}.streamkit_meta SET schema_version = 2").format(name))
        async with open_log(target) as log:
            stream = log.stream("/")
            await stream.append({"type": "item", "payload": {"n": 2}, "payload_version": 4})
            events = (await stream.read()).events
        assert [(e.offset, e.payload_version) for e in events] == [(1, 1), (2, 4)]
        with _connect() as conn:
            assert stored_version(conn, schema) == SCHEMA_VERSION


# -- schema 3 to 4: the summary of stored types ------------------------------------------


async def fill(log_target: str) -> None:
    """Events of two types and versions on two paths (the same in each backend)."""
    async with open_log(log_target) as log:
        await log.stream("/a").append(
            {"type": "x", "payload": {}},
            {"type": "x", "payload": {}, "payload_version": 2},
            {"type": "y", "payload": {}},
            {"type": "x", "payload": {}},
        )
        await log.stream("/b").append({"type": "x", "payload": {}, "payload_version": 2})


COUNTED = [
    StoredType("/a", "x", 1, 2, 1, 4),
    StoredType("/a", "x", 2, 1, 2, 2),
    StoredType("/a", "y", 1, 1, 3, 3),
    StoredType("/b", "x", 2, 1, 1, 1),
]


async def test_a_sqlite_log_of_schema_3_gets_its_summary_counted_from_the_rows(
    tmp_path: Path,
) -> None:
    """The upgrade counts every stored row (NULL versions as 1) before the first commit."""
    path = tmp_path / "v3.db"
    await fill(str(path))
    downgrade_sqlite(path, to=3)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE streamkit_events SET payload_version = NULL WHERE type = 'y'")
        conn.commit()
    with pytest.raises(LogOpenError, match=f"upgraded to {SQLITE_VERSION} when a host"):
        open_log(path, read_only=True)
    async with open_log(path) as log:
        assert await log.stored_types() == COUNTED
        await log.stream("/a").append({"type": "y", "payload": {}})
        assert (await log.stored_types("/a"))[-1] == StoredType("/a", "y", 1, 2, 3, 5)
    assert version(path) == str(SQLITE_VERSION)
    async with open_log(path, read_only=True) as log:
        assert len(await log.stored_types()) == 4


async def test_a_postgres_log_of_schema_3_gets_its_summary_counted_from_the_rows() -> None:
    schema = fresh_schema_name()
    url = postgres_url()
    target = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    with dropped_after(url, schema):
        await fill(target)
        with _connect() as conn:
            name = sql.Identifier(schema)
            old_postgres_checkpoints(conn, schema, 3)
            conn.execute(sql.SQL("DROP TABLE {}.streamkit_stored_types").format(name))
            conn.execute(
                sql.SQL(
                    "UPDATE {}.streamkit_events SET payload_version = NULL WHERE type = 'y'"
                ).format(name)
            )
            conn.execute(sql.SQL("UPDATE {}.streamkit_meta SET schema_version = 3").format(name))
        async with open_log(target) as log:
            assert await log.stored_types() == COUNTED
            await log.stream("/a").append({"type": "y", "payload": {}})
            assert (await log.stored_types("/a"))[-1] == StoredType("/a", "y", 1, 2, 3, 5)
        with _connect() as conn:
            assert stored_version(conn, schema) == SCHEMA_VERSION


# -- schema 4 to 5: a checkpoint per slug and version ------------------------------------


async def check_versions_after_upgrade(target: str) -> None:
    """The old row serves; a second version's row is a shadow until its cutover."""
    async with open_log(target) as log:
        store = host_store(log)
        await store.prepare()
        guard = AlwaysHeld()
        checkpoints = store.checkpoints(guard)
        serving = await checkpoints.load("tally")
        assert serving == ReduceCheckpoint("1", 4, "[1]", None, serving=True, cutover_offset=0)
        await checkpoints.save(
            "tally", reducer_version="2", reduced_through_offset=2, state_json="[2]"
        )
        assert (await checkpoints.load("tally")) == serving
        assert (await checkpoints.load("tally", "2")) == ReduceCheckpoint(
            "2", 2, "[2]", None, serving=False
        )
        await checkpoints.cut_over(
            "tally",
            reducer_version="2",
            reduced_through_offset=4,
            state_json="[4]",
            replacing="1",
        )
        assert (await checkpoints.load("tally")) == ReduceCheckpoint(
            "2", 4, "[4]", None, serving=True, cutover_offset=4
        )
        assert (await checkpoints.load("tally", "1")) == ReduceCheckpoint(
            "1", 4, "[1]", None, serving=False, retired_at=4
        )


class AlwaysHeld:
    """A lease guard that lets every write through (no lease is in question here)."""

    def check(self) -> None:
        pass

    def fence(self, conn: Any) -> None:
        pass


async def test_a_sqlite_log_of_schema_4_keeps_each_checkpoint_as_its_slug_s_serving_version(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v4.db"
    async with open_log(path) as log:
        await log.stream("/").append(*({"type": "tick", "payload": {}} for _ in range(4)))
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(old_checkpoint_table(4))
        conn.execute("INSERT INTO streamkit_checkpoints VALUES ('tally', '1', 4, '[1]', NULL)")
        conn.execute("UPDATE streamkit_meta SET value = '4' WHERE key = 'schema_version'")
        conn.commit()
    with pytest.raises(LogOpenError, match=f"upgraded to {SQLITE_VERSION} when a host"):
        open_log(path, read_only=True)
    await check_versions_after_upgrade(str(path))
    assert version(path) == str(SQLITE_VERSION)


async def test_a_postgres_log_of_schema_4_keeps_each_checkpoint_as_its_slug_s_serving_version() -> (
    None
):
    schema = fresh_schema_name()
    url = postgres_url()
    target = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    with dropped_after(url, schema):
        async with open_log(target) as log:
            await log.stream("/").append(*({"type": "tick", "payload": {}} for _ in range(4)))
        with _connect() as conn:
            name = sql.Identifier(schema)
            old_postgres_checkpoints(conn, schema, 4)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.streamkit_checkpoints VALUES ('tally', '1', 4, '[1]', NULL)"
                ).format(name)
            )
            conn.execute(sql.SQL("UPDATE {}.streamkit_meta SET schema_version = 4").format(name))
        await check_versions_after_upgrade(target)
        with _connect() as conn:
            assert stored_version(conn, schema) == SCHEMA_VERSION


async def test_a_sqlite_log_of_schema_5_gets_each_path_s_head_from_its_rows(
    tmp_path: Path,
) -> None:
    """The upgrade sets every path's head row from its last offset (ephemeral reservations
    kept); from then on deleting the newest rows never hands their offsets out again."""
    path = tmp_path / "v5.db"
    async with open_log(path) as log:
        await log.stream("/a").append(*[{"type": "x"}] * 3)
        await log.stream("/b").append({"type": "x"})
        await log.stream("/b").append({"type": "delta", "ephemeral": True})
        await log.stream("/b").append({"type": "x"})
    downgrade_sqlite(path, 5)
    assert "head" not in columns(path, "streamkit_heads")
    with closing(sqlite3.connect(path)) as conn:
        reserved = conn.execute(
            "SELECT reserved_through FROM streamkit_heads WHERE path = '/b'"
        ).fetchone()
    with pytest.raises(LogOpenError, match=f"upgraded to {SQLITE_VERSION} when a host"):
        open_log(path, read_only=True)
    async with open_log(path) as log:
        assert await log.paths() == ["/a", "/b"]
        assert version(path) == str(SQLITE_VERSION) == "10"
    with closing(sqlite3.connect(path)) as conn, conn:
        heads = conn.execute(
            "SELECT path, head, reserved_through FROM streamkit_heads ORDER BY path"
        ).fetchall()
        assert heads == [("/a", 3, 0), ("/b", reserved[0] + 1, reserved[0])]
        conn.execute("DELETE FROM streamkit_events WHERE path = '/a' AND \"offset\" > 1")
    async with open_log(path) as log:
        (fourth,) = await log.stream("/a").append({"type": "x"})
        assert fourth.offset == 4


# -- schema 5 to 6: idempotency keys in a table of their own ------------------------------


async def keyed_log(target: str) -> None:
    async with open_log(target) as log:
        await log.stream("/a").append({"type": "x"}, {"type": "paid", "idempotency_key": "k1"})
        await log.stream("/b").append({"type": "paid", "idempotency_key": "k1"})


async def check_keys_after_upgrade(target: str) -> None:
    """Every key answers as before: a retry returns its event, another body conflicts."""
    async with open_log(target) as log:
        (again,) = await log.stream("/a").append({"type": "paid", "idempotency_key": "k1"})
        assert again.offset == 2
        with pytest.raises(IdempotencyConflict):
            await log.stream("/b").append({"type": "other", "idempotency_key": "k1"})
        (fresh,) = await log.stream("/b").append({"type": "paid", "idempotency_key": "k2"})
        assert fresh.offset == 2
        assert log.stats.appended == 1


async def test_a_sqlite_log_of_schema_5_moves_its_keys_to_their_own_table(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    await keyed_log(str(path))
    downgrade_sqlite(path, 5)
    await check_keys_after_upgrade(str(path))
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute(
            'SELECT path, key, "offset" FROM streamkit_keys ORDER BY path, key'
        ).fetchall() == [("/a", "k1", 2), ("/b", "k1", 1), ("/b", "k2", 2)]
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert "streamkit_events_idempotency" not in indexes


async def test_a_postgres_log_of_schema_5_moves_its_keys_to_their_own_table() -> None:
    schema = fresh_schema_name()
    url = postgres_url()
    target = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    with dropped_after(url, schema):
        await keyed_log(target)
        name = sql.Identifier(schema)
        with _connect() as conn:
            conn.execute(sql.SQL("DROP TABLE {}.streamkit_keys").format(name))
            conn.execute(sql.SQL(OLD_KEY_INDEX.format(schema="{}.")).format(name))
            conn.execute(sql.SQL("UPDATE {}.streamkit_meta SET schema_version = 5").format(name))
        await check_keys_after_upgrade(target)
        with _connect() as conn:
            assert stored_version(conn, schema) == SCHEMA_VERSION == 9
            rows = conn.execute(
                sql.SQL(
                    'SELECT path, key, "offset" FROM {}.streamkit_keys ORDER BY path, key'
                ).format(name)
            ).fetchall()
            assert rows == [("/a", "k1", 2), ("/b", "k1", 1), ("/b", "k2", 2)]
            index = conn.execute(
                "SELECT 1 FROM pg_indexes WHERE schemaname = %s "
                "AND indexname = 'streamkit_events_idempotency'",
                (schema,),
            ).fetchone()
            assert index is None


async def leased_checkpoints(target: str) -> None:
    """Checkpoints of ``board`` (leased on /orders only) and ``audit`` (leased on two paths)."""
    async with open_log(target) as log:
        await log.stream("/orders").append(*[{"type": "x"}] * 5)
        await log.stream("/other").append(*[{"type": "x"}] * 5)
        store = host_store(log)
        await store.prepare()
        for path, slug, cursor in (("/orders", "board", 4), ("/orders", "audit", 2)):
            lease = await store.try_acquire(LeaseAsk(path, slug, "a", time.time(), 60.0))
            assert lease is not None
            held = HeldLease(
                lease,
                store.check_fence,
                ttl=60.0,
                renewal_started=time.monotonic(),
                clock=time.time,
            )
            await store.checkpoints(held, path).save(
                slug, reducer_version="1", reduced_through_offset=cursor, state_json="{}"
            )
        assert (
            await store.try_acquire(LeaseAsk("/other", "audit", "a", time.time(), 60.0)) is not None
        )


async def check_paths_after_upgrade(target: str) -> None:
    """A slug leased on one path gets it; one leased on two stays unknown and holds both."""
    async with open_log(target) as log:
        horizons = {h.path: h for h in await host_store(log).retention.horizons(time.time())}
    assert [(n.name, n.from_offset) for n in horizons["/orders"].needs] == [
        ("audit@1", 3),
        ("board@1", 5),
    ]
    assert [(n.name, n.from_offset) for n in horizons["/other"].needs] == [("audit@1", 3)]


async def test_a_sqlite_log_of_schema_6_learns_each_checkpoint_s_path_from_its_leases(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v6.db"
    await leased_checkpoints(str(path))
    downgrade_sqlite(path, 6)
    assert "path" not in columns(path)
    await check_paths_after_upgrade(str(path))
    assert {"path", "retain_from"} <= columns(path)
    assert version(path) == str(SQLITE_VERSION)
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT slug, path FROM streamkit_checkpoints ORDER BY slug").fetchall()
    assert rows == [("audit", None), ("board", "/orders")]


async def test_a_postgres_log_of_schema_6_learns_each_checkpoint_s_path_from_its_leases() -> None:
    schema = fresh_schema_name()
    url = postgres_url()
    target = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    with dropped_after(url, schema):
        await leased_checkpoints(target)
        name = sql.Identifier(schema)
        with _connect() as conn:
            drop_key_windows(conn, schema)
            conn.execute(sql.SQL("DROP TABLE {}.streamkit_holds").format(name))
            conn.execute(sql.SQL("DROP TABLE {}.streamkit_segments").format(name))
            conn.execute(
                sql.SQL("ALTER TABLE {}.streamkit_heads DROP COLUMN truncated_through").format(name)
            )
            for column in ("path", "retain_from"):
                conn.execute(
                    sql.SQL("ALTER TABLE {}.streamkit_checkpoints DROP COLUMN {}").format(
                        name, sql.Identifier(column)
                    )
                )
            conn.execute(sql.SQL("UPDATE {}.streamkit_meta SET schema_version = 6").format(name))
        await check_paths_after_upgrade(target)
        with _connect() as conn:
            assert stored_version(conn, schema) == SCHEMA_VERSION == 9
            rows = conn.execute(
                sql.SQL("SELECT slug, path FROM {}.streamkit_checkpoints ORDER BY slug").format(
                    name
                )
            ).fetchall()
        assert rows == [("audit", None), ("board", "/orders")]


# -- schema 7 to 8: key windows ---------------------------------------------------------


def drop_key_windows(conn: psycopg.Connection[Any], schema: str) -> None:
    """Take away what schema 8 added to a PostgreSQL log."""
    name = sql.Identifier(schema)
    conn.execute(sql.SQL("DROP TABLE {}.streamkit_key_windows").format(name))
    conn.execute(sql.SQL("DROP INDEX {}.streamkit_keys_recorded").format(name))


async def taken_keys_then_window(target: str, before_upgrade: Callable[[], None]) -> None:
    """Keys of taken events, a downgrade to 7, then a window set and the keys let go."""
    async with open_log(target) as log:
        await log.stream("/").append(*[{"type": "x", "idempotency_key": f"k{n}"} for n in range(3)])
        run = await host_store(log).retention.run(RetentionAsk("/"))
        assert run.events == 3
    before_upgrade()
    async with open_log(target) as log:
        store = host_store(log)
        await store.retention.set_key_window("/", 3600, by="ops", reason="r", now=time.time())
        # Two hours on, the keys of the taken events are let go by the next run.
        forgotten = await forget_expired_keys(log, retention_rows(log), "/", time.time() + 7200)
        assert forgotten == 3


async def test_a_sqlite_log_of_schema_7_gets_key_windows(tmp_path: Path) -> None:
    path = tmp_path / "v7.db"
    await taken_keys_then_window(str(path), lambda: downgrade_sqlite(path, 7))
    assert version(path) == str(SQLITE_VERSION)


async def test_a_sqlite_log_of_schema_7_upgrades_without_touching_what_7_had(
    tmp_path: Path,
) -> None:
    """7 to 8 only adds: stored keys stay (no second copy refused at open) and the summary
    of stored types still counts archived events (a recount from the rows would not)."""
    path = tmp_path / "v7.db"
    async with open_log(path) as log:
        await log.stream("/").append(*[{"type": "x", "idempotency_key": f"k{n}"} for n in range(4)])
        await host_store(log).retention.run(
            RetentionAsk("/", through=2, archive=str(tmp_path / "archive"))
        )
        counted = await log.stored_types("/")
    downgrade_sqlite(path, 7)
    async with open_log(path) as log:
        assert await log.stored_types("/") == counted
        (again,) = await log.stream("/").append({"type": "x", "idempotency_key": "k3"})
        assert again.offset == 4
    assert version(path) == str(SQLITE_VERSION)


# -- schema 8 to 9: a commit writes no heads row -------------------------------------------


async def test_a_sqlite_log_of_schema_8_keeps_deleted_offsets_through_its_new_trigger(
    tmp_path: Path,
) -> None:
    """After 8 to 9 the heads row is no longer moved by each commit; the trigger the upgrade
    makes is what keeps the newest offsets, deleted by hand, from being handed out again."""
    path = tmp_path / "v8.db"
    async with open_log(path) as log:
        await log.stream("/").append({"type": "x"})
    downgrade_sqlite(path, 8)
    async with open_log(path) as log:
        await log.stream("/").append({"type": "x"})  # a writer's first commit to a path sets it
        await log.stream("/").append(*[{"type": "x"}] * 3)  # later ones leave it
    assert version(path) == str(SQLITE_VERSION)
    with closing(sqlite3.connect(path)) as conn, conn:
        (head,) = conn.execute("SELECT head FROM streamkit_heads WHERE path = '/'").fetchone()
        assert head == (2 if SPEED_TRICKS else 5)  # plain: every commit raises the row
        trigger = "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = ?"
        assert conn.execute(trigger, ("streamkit_events_deleted",)).fetchone() is not None
        conn.execute('DELETE FROM streamkit_events WHERE "offset" > 2')
    async with open_log(path) as log:
        assert await log.stream("/").head() == 5
        (sixth,) = await log.stream("/").append({"type": "x"})
        assert sixth.offset == 6


async def test_a_sqlite_log_of_schema_9_keeps_its_summary_and_settles_it_in_steps(
    tmp_path: Path,
) -> None:
    """9 to 10: the summary (exact, archived events counted) moves to its own table as it
    stands and every path's mark is its newest row; the old table is left to a writer of
    release 9 that may still append (it moves it; no read looks at it)."""
    path = tmp_path / "v9.db"
    await fill(str(path))
    async with open_log(path) as log:
        await host_store(log).retention.run(
            RetentionAsk("/b", through=1, archive=str(tmp_path / "archive"))
        )
        before = await log.stored_types()
    assert [t for t in before if t.type != TRUNCATED_EVENT] == COUNTED
    downgrade_sqlite(path, 9)
    with closing(sqlite3.connect(path)) as conn, conn:
        # What release 9 counted: the archived event too, which the rows no longer hold.
        conn.execute("DELETE FROM streamkit_stored_types")
        conn.executemany(
            "INSERT INTO streamkit_stored_types VALUES (?, ?, ?, ?, ?, ?)",
            [(t.path, t.type, t.version, t.count, t.first_offset, t.last_offset) for t in before],
        )
    async with open_log(path) as log:
        assert await log.stored_types() == before
        await log.stream("/a").append({"type": "y", "payload": {}})
        assert (await log.stored_types("/a"))[-1] == StoredType("/a", "y", 1, 2, 3, 5)
    assert version(path) == str(SQLITE_VERSION)
    with closing(sqlite3.connect(path)) as conn:
        marks = dict(conn.execute("SELECT path, summarized_through FROM streamkit_heads"))
        heads = dict(conn.execute('SELECT path, max("offset") FROM streamkit_events GROUP BY path'))
        # The upgrade marked every path at its newest row; the append after it is counted by
        # reads past the mark until a settle (at once under STREAMKIT_PLAIN=1).
        assert marks["/a"] == (5 if not SPEED_TRICKS else 4)
        assert {p: m for p, m in marks.items() if p != "/a"} == {
            p: h for p, h in heads.items() if p != "/a"
        }
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert {"streamkit_stored_types", "streamkit_type_summary"} <= tables


async def test_a_postgres_log_of_schema_7_gets_key_windows() -> None:
    schema = fresh_schema_name()
    url = postgres_url()
    target = f"{url}{'&' if '?' in url else '?'}schema={schema}"

    def downgrade() -> None:
        with _connect() as conn:
            drop_key_windows(conn, schema)
            conn.execute(
                sql.SQL("UPDATE {}.streamkit_meta SET schema_version = 7").format(
                    sql.Identifier(schema)
                )
            )

    with dropped_after(url, schema):
        await taken_keys_then_window(target, downgrade)
        with _connect() as conn:
            assert stored_version(conn, schema) == SCHEMA_VERSION


# -- PostgreSQL schema 8 to 9: each version's skip tally -----------------------------------


async def test_a_postgres_log_of_schema_8_gets_the_table_of_skip_tallies() -> None:
    schema = fresh_schema_name()
    url = postgres_url()
    target = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    with dropped_after(url, schema):
        async with open_log(target) as log:
            await log.stream("/").append({"type": "x"})
        name = sql.Identifier(schema)
        with _connect() as conn:
            conn.execute(sql.SQL("DROP TABLE {}.streamkit_version_incidents").format(name))
            conn.execute(sql.SQL("UPDATE {}.streamkit_meta SET schema_version = 8").format(name))
        async with open_log(target) as log:
            store = host_store(log)
            assert await store.version_incidents("board") == {}
        with _connect() as conn:
            assert stored_version(conn, schema) == SCHEMA_VERSION == 9
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.streamkit_version_incidents VALUES ('board', '1', '{{}}')"
                ).format(name)
            )

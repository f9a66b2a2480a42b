"""The PostgreSQL backend's target and schema: parsing the URL, creating the tables once.

Parsing needs no server; the rest runs against the throwaway server that
scripts/test starts (CI never skips it).
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.postgres import dropped_after, fresh_schema_name, postgres_url

from streamkit._targets import (
    DEFAULT_SCHEMA,
    is_postgres_target,
    postgres_target,
    served_name,
)
from streamkit.backends import open_log
from streamkit.backends.postgres._schema import SCHEMA_VERSION, ensure_schema, stored_version
from streamkit.errors import LogOpenError

# -- the target ------------------------------------------------------------------------


def test_a_target_names_the_server_and_the_schema() -> None:
    """schema= is taken out for streamkit; libpq's own parameters stay in the URL."""
    parsed = postgres_target("postgresql://app:s3cret@db.example:5433/events?schema=orders_v2")
    assert parsed.schema == "orders_v2"
    assert parsed.conninfo == "postgresql://app:s3cret@db.example:5433/events"
    assert "s3cret" not in parsed.shown
    assert parsed.shown == "postgresql://app:***@db.example:5433/events?schema=orders_v2"
    kept = postgres_target("postgres://u@h/d?sslmode=require&schema=a&connect_timeout=3")
    assert kept.conninfo == "postgres://u@h/d?sslmode=require&connect_timeout=3"
    assert postgres_target("postgresql://u@h/d").schema == DEFAULT_SCHEMA
    assert is_postgres_target("postgresql://u@h/d")
    assert is_postgres_target("POSTGRES://u@h/d")
    assert not is_postgres_target("/var/app.db")
    assert not is_postgres_target("sqlite:///var/app.db")
    # What a host says it serves: server, database and schema, however the URL spells them.
    assert served_name("postgresql://app:pw@db.example:5433/events?schema=orders_v2") == (
        served_name("postgres://other@db.example:5433/events?sslmode=require&schema=orders_v2")
    )
    assert served_name("postgresql://u@h/d") == "postgresql://h:5432/d?schema=public"
    # A password given as a parameter is never shown either.
    hidden = postgres_target("postgresql://u@h/d?password=s3cret&sslmode=require")
    assert "s3cret" not in hidden.shown
    assert "password=***" in hidden.shown


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("postgresql://u:pw@h/d?schema=Orders", "lower-case"),
        ("postgresql://u:pw@h/d?schema=1st", "lower-case"),
        ("postgresql://u:pw@h/d?schema=a;drop", "lower-case"),
        ("postgresql://u:pw@h/d?schema=" + "a" * 64, "lower-case"),
        ("postgresql://u:pw@h/d?schema=", "lower-case"),
        ("postgresql://u:pw@h/d?schema=a&schema=b", "2 times"),
        ("postgresql://u:pw@h/d?schema=information_schema", "PostgreSQL's own"),
        ("postgresql://u:pw@h/d?schema=pg_catalog", "PostgreSQL's own"),
        ("postgresql://u:pw@h/d?schema=pg_mine", "PostgreSQL's own"),
        ("postgresql://u:pw@h:notaport/d", "not a valid PostgreSQL URL"),
    ],
)
def test_a_bad_target_is_refused_before_anything_is_opened(target: str, why: str) -> None:
    """Each refusal says what was wrong and that nothing was opened, never the password."""
    with pytest.raises(LogOpenError, match=why) as caught:
        postgres_target(target)
    assert "nothing was opened" in caught.value.message
    assert "pw" not in caught.value.message


def test_libpq_parameters_stay_as_written() -> None:
    """%20 stays %20 (libpq reads no "+" as a space); only schema= is taken out."""
    parsed = postgres_target(
        "postgresql://u@h/d?application_name=my%20app&schema=s1&options=-c%20search_path%3Dx"
    )
    assert parsed.conninfo == (
        "postgresql://u@h/d?application_name=my%20app&options=-c%20search_path%3Dx"
    )


async def test_parameters_reach_the_server_and_its_refusal_is_not_unreachable() -> None:
    """application_name=my%20app arrives as "my app"; a FATAL answer is named as the server's."""
    base = postgres_url()
    joiner = "&" if "?" in base else "?"
    schema = fresh_schema_name()
    with dropped_after(base, schema):
        async with open_log(f"{base}{joiner}application_name=my%20app&schema={schema}") as log:
            await log.stream("/").append({"type": "t", "payload": {}})
            with _connect() as conn:
                names = [
                    row[0]
                    for row in conn.execute(
                        "SELECT application_name FROM pg_stat_activity WHERE datname = "
                        "current_database()"
                    )
                ]
        assert "my app" in names, names
        bad = f"{base}{joiner}options=-c%20no_such_setting%3D1&schema={schema}"
        with pytest.raises(LogOpenError) as refused:
            async with open_log(bad):
                pass
        assert "refused the connection" in refused.value.message
        assert "FATAL" in refused.value.message
        assert "unreachable" not in refused.value.message
        assert refused.value.retryable is False


# -- the schema --------------------------------------------------------------------------


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(postgres_url(), autocommit=True)


def _tables(conn: psycopg.Connection[Any], schema: str) -> set[str]:
    rows = conn.execute(
        "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s", (schema,)
    ).fetchall()
    return {str(row[0]) for row in rows}


def test_the_schema_is_created_once_and_opened_again_unchanged() -> None:
    """The tables and the version row appear; a second ensure changes nothing."""
    schema = fresh_schema_name()
    with dropped_after(postgres_url(), schema), _connect() as conn:
        assert stored_version(conn, schema) is None
        ensure_schema(conn, schema, "test")
        assert stored_version(conn, schema) == SCHEMA_VERSION
        assert _tables(conn, schema) == {
            "streamkit_meta",
            "streamkit_events",
            "streamkit_heads",
            "streamkit_claims",
            "streamkit_keys",
            "streamkit_stored_types",
            "streamkit_leases",
            "streamkit_checkpoints",
            "streamkit_version_incidents",
            "streamkit_skips",
            "streamkit_holds",
            "streamkit_segments",
            "streamkit_key_windows",
            "streamkit_hosts",
        }
        (made,) = conn.execute(
            sql.SQL("SELECT created_at FROM {}.streamkit_meta").format(sql.Identifier(schema))
        ).fetchone() or (None,)
        ensure_schema(conn, schema, "test")
        rows = conn.execute(
            sql.SQL("SELECT created_at FROM {}.streamkit_meta").format(sql.Identifier(schema))
        ).fetchall()
        assert rows == [(made,)]


def test_hosts_starting_together_create_the_schema_once() -> None:
    """Twelve sessions racing to create one schema all succeed, with one version row."""
    schema = fresh_schema_name()
    errors: list[BaseException] = []
    start = threading.Barrier(12)

    def create() -> None:
        try:
            with _connect() as conn:
                start.wait(30)
                ensure_schema(conn, schema, "test")
        except BaseException as exc:  # (reported by the assertion below)
            errors.append(exc)

    with dropped_after(postgres_url(), schema):
        threads = [threading.Thread(target=create) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        with _connect() as conn:
            count = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.streamkit_meta").format(sql.Identifier(schema))
            ).fetchone()
            assert count == (1,)
            assert stored_version(conn, schema) == SCHEMA_VERSION


def test_a_schema_of_another_version_is_refused_and_left_alone() -> None:
    """A layout written by a newer streamkit is not touched: the refusal says so."""
    schema = fresh_schema_name()
    with dropped_after(postgres_url(), schema), _connect() as conn:
        ensure_schema(conn, schema, "test")
        name = sql.Identifier(schema)
        conn.execute(
            sql.SQL("UPDATE {}.streamkit_meta SET schema_version = %s").format(name),
            (SCHEMA_VERSION + 1,),
        )
        with pytest.raises(LogOpenError, match="newer streamkit") as caught:
            ensure_schema(conn, schema, "postgresql://u@h/d")
        assert "nothing was opened or changed" in caught.value.message
        assert stored_version(conn, schema) == SCHEMA_VERSION + 1


def test_two_logs_share_a_database_in_two_schemas() -> None:
    """Each schema holds its own tables; making one leaves the other as it was."""
    first, second = fresh_schema_name(), fresh_schema_name()
    with dropped_after(postgres_url(), first, second), _connect() as conn:
        ensure_schema(conn, first, "test")
        assert stored_version(conn, second) is None
        ensure_schema(conn, second, "test")
        conn.execute(
            sql.SQL("INSERT INTO {}.streamkit_heads (path, head) VALUES ('/', 7)").format(
                sql.Identifier(first)
            )
        )
        rows = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.streamkit_heads").format(sql.Identifier(second))
        ).fetchone()
        assert rows == (0,)

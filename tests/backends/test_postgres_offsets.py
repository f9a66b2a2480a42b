"""The offset rule on PostgreSQL: dense offsets in commit order, even when commits race.

The regression test for the field's most reported bug (a tailing consumer
that skips an event whose lower number became visible after a higher one):
writers that sleep inside their transactions, some rolling back, and a
reader that tails by offset must see every committed event, in offset
order, with no hole.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.postgres import dropped_after, fresh_schema_name, postgres_url

from streamkit.backends.postgres._offsets import take_offsets
from streamkit.backends.postgres._schema import ensure_schema

_INSERT = (
    'INSERT INTO {}.streamkit_events (path, "offset", type, payload, metadata, created_at) '
    "VALUES (%s, %s, 'x', '{{}}', '{{}}', 't')"
)


class _RollBack(Exception):
    """Raised inside a writer's transaction to roll it back on purpose."""


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(postgres_url(), autocommit=True)


def test_a_tailing_reader_misses_nothing_while_commits_race() -> None:
    """8 writers, random sleeps in their transactions, 1 in 10 rolled back: 0 missed, no hole."""
    schema = fresh_schema_name()
    committed: set[int] = set()
    lock = threading.Lock()
    writing = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []
    insert = sql.SQL(_INSERT).format(sql.Identifier(schema))
    tail = sql.SQL(
        'SELECT "offset" FROM {}.streamkit_events WHERE path = %s AND "offset" > %s '
        'ORDER BY "offset"'
    ).format(sql.Identifier(schema))

    def write(number: int) -> None:
        rng = random.Random(number)
        try:
            with _connect() as conn:
                for _ in range(40):
                    count = rng.randint(1, 3)
                    try:
                        with conn.transaction():
                            first = take_offsets(
                                conn, schema, "/", count, writer=f"w{number}"
                            ).first
                            time.sleep(rng.uniform(0, 0.004))  # a slow commit, lock held
                            for offset in range(first, first + count):
                                conn.execute(insert, ("/", offset))
                            if rng.random() < 0.1:
                                raise _RollBack
                    except _RollBack:
                        continue
                    with lock:
                        committed.update(range(first, first + count))
        except BaseException as exc:  # (reported by the assertion below)
            errors.append(exc)

    def read() -> None:
        # The naive tail: after each look, the position moves to the highest offset seen.
        position = 0
        with _connect() as conn:
            while True:
                done = not writing.is_set()
                for (offset,) in conn.execute(tail, ("/", position)).fetchall():
                    seen.append(int(offset))
                    position = int(offset)
                if done:
                    return
                time.sleep(0.0005)

    with dropped_after(postgres_url(), schema):
        with _connect() as conn:
            ensure_schema(conn, schema, "test")
        writing.set()
        reader = threading.Thread(target=read)
        writers = [threading.Thread(target=write, args=(n,)) for n in range(8)]
        reader.start()
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        writing.clear()
        reader.join()
    assert errors == []
    assert len(committed) > 300  # the run really raced (8 x 40 calls of 1-3 events, 10% undone)
    assert seen == sorted(committed)  # none missed, none twice, in offset order
    assert seen == list(range(1, len(seen) + 1))  # dense: the rollbacks left no hole


def test_the_rule_skips_another_writers_block_and_continues_past_its_own() -> None:
    """A new path starts at 1; a foreign ephemeral block is skipped whole; one's own is not."""
    schema = fresh_schema_name()
    name = sql.Identifier(schema)
    with dropped_after(postgres_url(), schema), _connect() as conn:
        ensure_schema(conn, schema, "test")
        with conn.transaction():
            assert take_offsets(conn, schema, "/a", 2, writer="me").first == 1
        with conn.transaction():
            assert take_offsets(conn, schema, "/b", 1, writer="me").first == 1  # paths apart
        # Another writer reserved offsets 3 to 10 of /a for its ephemerals.
        conn.execute(
            sql.SQL(
                "UPDATE {}.streamkit_heads SET reserved_through = 10, reserved_by = 'other' "
                "WHERE path = '/a'"
            ).format(name)
        )
        with conn.transaction():
            assert take_offsets(conn, schema, "/a", 1, writer="me").first == 11
        # Our own block of 12 to 20, used through 14: the next durable offset is 15.
        conn.execute(
            sql.SQL(
                "UPDATE {}.streamkit_heads SET reserved_through = 20, reserved_by = 'me' "
                "WHERE path = '/a'"
            ).format(name)
        )
        with conn.transaction():
            assert take_offsets(conn, schema, "/a", 3, writer="me", last_ephemeral=14).first == 15
        # A rolled-back take leaves the head where it was: no offset is lost or reused.
        with conn.transaction(force_rollback=True):
            assert take_offsets(conn, schema, "/a", 5, writer="me", last_ephemeral=17).first == 18
        with conn.transaction():
            assert take_offsets(conn, schema, "/a", 1, writer="me", last_ephemeral=17).first == 18


def test_a_take_needs_a_count_and_a_writer() -> None:
    """Zero events or an empty writer token is a programming error, refused before any SQL."""
    with pytest.raises(ValueError, match="count >= 1"):
        take_offsets(None, "s", "/", 0, writer="me")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="writer token"):
        take_offsets(None, "s", "/", 1, writer="")  # type: ignore[arg-type]

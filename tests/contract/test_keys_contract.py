"""Idempotency keys outlive their events, on every backend.

Each key lives in ``streamkit_keys`` (path, key, offset), written in the
append's transaction. While the event's row is there, a retry is judged
against it; once the row is gone, by the body's hash recorded in the key's
row (what retention records before it removes a row). A retry of the same
body returns the original offset and writes nothing; another body is an
``IdempotencyConflict``; a key whose row went with nothing recorded is
refused rather than appended twice.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

import psycopg
import pytest
from support.backends import Target

from streamkit import IdempotencyConflict
from streamkit.backends._keys import body_sha256


def run_sql(target: Target, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement from another connection (``{t}`` is the schema prefix); its rows."""
    if target.schema is None:
        with closing(sqlite3.connect(target.target)) as conn, conn:
            return list(conn.execute(statement.replace("{t}", ""), params).fetchall())
    url, schema = target.schema
    prefix = f'"{schema}".'
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement.replace("{t}", prefix).replace("?", "%s"), params)
        return list(cursor.fetchall()) if cursor.description else []


def archive_by_hand(target: Target, path: str, offset: int) -> None:
    """What retention does to a keyed event's row: record the body's hash, then delete it."""
    ((type_, payload, metadata, created_at),) = run_sql(
        target,
        'SELECT type, payload, metadata, created_at FROM {t}streamkit_events WHERE path = ? AND "offset" = ?',
        (path, offset),
    )
    run_sql(
        target,
        'UPDATE {t}streamkit_keys SET body_sha256 = ?, created_at = ? WHERE path = ? AND "offset" = ?',
        (body_sha256(type_, payload, metadata), created_at, path, offset),
    )
    run_sql(
        target, 'DELETE FROM {t}streamkit_events WHERE path = ? AND "offset" = ?', (path, offset)
    )


def keys(target: Target) -> list[tuple[Any, ...]]:
    return [
        tuple(row)
        for row in run_sql(
            target, 'SELECT path, key, "offset" FROM {t}streamkit_keys ORDER BY path, key'
        )
    ]


async def test_each_key_is_kept_in_its_own_table_with_its_event_s_offset(
    log_target: Target,
) -> None:
    async with log_target.open() as log:
        orders = log.stream("/orders")
        await orders.append({"type": "placed"})
        await orders.append(
            {"type": "placed", "idempotency_key": "a"},
            {"type": "placed", "idempotency_key": "b"},
            {"type": "placed", "idempotency_key": "a"},  # the same input twice: one event
        )
        await log.stream("/other").append({"type": "placed", "idempotency_key": "a"})
        (again,) = await orders.append({"type": "placed", "idempotency_key": "b"})
        assert again.offset == 3
        assert await orders.head() == 3
    assert keys(log_target) == [("/orders", "a", 2), ("/orders", "b", 3), ("/other", "a", 1)]


async def test_a_retry_whose_event_is_gone_is_judged_by_the_recorded_hash(
    log_target: Target,
) -> None:
    body = {"type": "paid", "payload": {"order": 7, "amount": 12.0}, "metadata": {"by": "web"}}
    async with log_target.open() as log:
        orders = log.stream("/orders")
        await orders.append({"type": "placed"})
        (paid,) = await orders.append({**body, "idempotency_key": "pay-7"})
        await orders.append({"type": "shipped"})
    archive_by_hand(log_target, "/orders", paid.offset)
    async with log_target.open() as log:
        orders = log.stream("/orders")
        appended = log.stats.appended
        # The same body, its keys in another order and 12.0 written as 12: JSON-equal.
        (retried,) = await orders.append(
            {
                "type": "paid",
                "payload": {"amount": 12, "order": 7},
                "metadata": {"by": "web"},
                "idempotency_key": "pay-7",
            }
        )
        assert (retried.offset, retried.created_at) == (paid.offset, paid.created_at)
        assert (retried.type, retried.payload) == ("paid", {"amount": 12, "order": 7})
        mixed = await orders.append(
            {**body, "idempotency_key": "pay-7"}, {"type": "refunded", "idempotency_key": "r-7"}
        )
        assert [e.offset for e in mixed] == [2, 4]
        with pytest.raises(IdempotencyConflict) as refused:
            await orders.append({**body, "payload": {"order": 8}, "idempotency_key": "pay-7"})
        assert refused.value.details["reason"] == "archived"
        assert "nothing was appended" in refused.value.message
        assert log.stats.appended == appended + 1
        assert await orders.head() == 4


async def test_a_key_whose_event_went_without_a_record_is_refused_never_appended_twice(
    log_target: Target,
) -> None:
    async with log_target.open() as log:
        await log.stream("/orders").append({"type": "paid", "idempotency_key": "pay-1"})
    run_sql(log_target, "DELETE FROM {t}streamkit_events")
    async with log_target.open() as log:
        with pytest.raises(IdempotencyConflict) as refused:
            await log.stream("/orders").append({"type": "paid", "idempotency_key": "pay-1"})
        assert refused.value.details == {
            "key": "pay-1",
            "offset": 1,
            "path": "/orders",
            "reason": "unrecorded",
        }
        assert "cannot be judged" in refused.value.message
        assert await log.stream("/orders").head() == 1
        assert list((await log.stream("/orders").read()).events) == []

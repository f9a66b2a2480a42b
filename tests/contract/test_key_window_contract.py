"""Key windows on every backend: keys of taken events answer forever, or for a path's window.

A key answers retries while its event is stored, whatever the window. Once
retention takes the event the key still answers (forever by default); a
path's key window lets the next run forget the keys of taken events older
than it, each batch with its ``streamkit.keys-forgotten`` record, and a retry
after that appends anew. Setting a window is audited like a hold.
"""

from __future__ import annotations

import math
import time

import pytest
from support.retention import retention_rows

import streamkit.backends._retention.run as truncation
from streamkit.backends._retention.key_windows import forget_expired_keys
from streamkit.errors import HistoryTruncated, InvalidRequest, LeaseLost
from streamkit.key_window import KEY_WINDOW_SET, KEYS_FORGOTTEN
from streamkit.log import Log
from streamkit.protocols import HostStore, RetentionAsk

# On a private in-memory log too: these tests keep to the one log they open.
ALSO_IN_MEMORY = True

HOUR = 3600.0


async def keyed(log: Log, path: str, keys: range) -> list[int]:
    events = [{"type": "n", "payload": {"i": i}, "idempotency_key": f"k{i}"} for i in keys]
    return [e.offset for e in await log.stream(path).append(*events)]


async def retry(log: Log, path: str, i: int) -> int:
    (event,) = await log.stream(path).append(
        {"type": "n", "payload": {"i": i}, "idempotency_key": f"k{i}"}
    )
    return event.offset


async def of_type(log: Log, path: str, etype: str) -> list[dict[str, object]]:
    """The payloads of ``etype`` still stored on ``path`` (above what retention deleted)."""
    try:
        page = await log.stream(path).read(0, 1000)
    except HistoryTruncated as exc:
        page = await log.stream(path).read(int(exc.details["start"]) - 1, 1000)
    return [e.payload for e in page.events if e.type == etype]


async def test_keys_of_taken_events_answer_forever_by_default(log: Log, store: HostStore) -> None:
    offsets = await keyed(log, "/", range(4))
    run = await truncation.run_retention(
        log, retention_rows(log), RetentionAsk("/"), clock=lambda: time.time() + 10 * 365 * 86400
    )
    assert run.events == 4
    assert run.keys_forgotten == 0
    assert await store.retention.key_window("/") is None
    assert [await retry(log, "/", i) for i in range(4)] == offsets


async def test_a_window_lets_the_keys_of_taken_events_go_and_a_retry_then_appends_anew(
    log: Log, store: HostStore
) -> None:
    now = time.time()
    set_event = await store.retention.set_key_window("/", HOUR, by="ops", reason="r", now=now)
    offsets = await keyed(log, "/", range(3))
    # Not yet: an hour has not passed since the events were created.
    early = await truncation.run_retention(
        log, retention_rows(log), RetentionAsk("/"), clock=lambda: now + 60
    )
    assert (early.events, early.keys_forgotten) == (4, 0)
    assert await retry(log, "/", 0) == offsets[0]
    later = await truncation.run_retention(
        log, retention_rows(log), RetentionAsk("/"), clock=lambda: now + 2 * HOUR
    )
    assert later.keys_forgotten == 3
    (record,) = await of_type(log, "/", KEYS_FORGOTTEN)
    assert record["count"] == 3
    assert record["keep_for"] == HOUR
    head = await log.stream("/").head()
    assert await retry(log, "/", 0) == head + 1  # forgotten: a new event
    horizon = (await store.retention.horizons(now, "/"))[0]
    assert horizon.keys_kept_for == HOUR
    assert horizon.to_dict()["keys_kept_for"] == HOUR
    assert set_event.payload == {"keep_for": HOUR, "previous": None, "by": "ops", "reason": "r"}


async def test_a_key_whose_event_is_still_stored_is_never_forgotten(
    log: Log, store: HostStore
) -> None:
    now = time.time()
    await store.retention.set_key_window("/", HOUR, by="ops", reason="r", now=now)
    offsets = await keyed(log, "/", range(3))
    assert await forget_expired_keys(log, retention_rows(log), "/", now + 100 * HOUR) == 0
    assert [await retry(log, "/", i) for i in range(3)] == offsets
    assert await of_type(log, "/", KEYS_FORGOTTEN) == []


async def test_forgetting_is_batched_and_fenced(log: Log, store: HostStore) -> None:
    now = time.time()
    await store.retention.set_key_window("/", HOUR, by="ops", reason="r", now=now)
    await keyed(log, "/", range(7))
    await truncation.run_retention(log, retention_rows(log), RetentionAsk("/"), clock=lambda: now)

    def lost(conn: object) -> None:
        raise LeaseLost("the retention lease was taken over")

    rows = retention_rows(log)
    with pytest.raises(LeaseLost):
        await forget_expired_keys(log, rows, "/", now + 2 * HOUR, fence=lost, batch=3)
    assert await of_type(log, "/", KEYS_FORGOTTEN) == []
    assert await forget_expired_keys(log, rows, "/", now + 2 * HOUR, batch=3) == 7
    assert [r["count"] for r in await of_type(log, "/", KEYS_FORGOTTEN)] == [3, 3, 1]


async def test_forever_restores_the_default_and_each_change_is_recorded(
    log: Log, store: HostStore
) -> None:
    now = time.time()
    await store.retention.set_key_window("/", 2 * HOUR, by="ops", reason="a", now=now)
    await store.retention.set_key_window("/", None, by="ops", reason="b", now=now)
    assert await store.retention.key_window("/") is None
    assert [(r["keep_for"], r["previous"]) for r in await of_type(log, "/", KEY_WINDOW_SET)] == [
        (2 * HOUR, None),
        (None, 2 * HOUR),
    ]
    await keyed(log, "/", range(2))
    await truncation.run_retention(log, retention_rows(log), RetentionAsk("/"), clock=lambda: now)
    assert await forget_expired_keys(log, retention_rows(log), "/", now + 1e9) == 0


@pytest.mark.parametrize("keep_for", [59.0, 0, -1, math.nan, math.inf, True, "1h"])
async def test_a_malformed_window_is_refused_and_nothing_is_written(
    log: Log, store: HostStore, keep_for: object
) -> None:
    await keyed(log, "/", range(1))
    with pytest.raises(InvalidRequest, match="nothing was written"):
        await store.retention.set_key_window(
            "/",
            keep_for,  # type: ignore[arg-type]
            by="ops",
            reason="r",
            now=time.time(),
        )
    with pytest.raises(InvalidRequest, match="reason must be non-empty"):
        await store.retention.set_key_window("/", HOUR, by="ops", reason=" ", now=time.time())
    assert await log.stream("/").head() == 1
    assert await store.retention.key_window("/") is None

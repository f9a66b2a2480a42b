"""The code of docs/log.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/log.py
"""

import asyncio


async def main() -> None:
    # --- docs/log.md:57
    from streamkit import LogOpenError, open_log

    log = open_log("shop.db")  # created if missing
    orders = log.stream("/orders")
    assert log.stream("/orders") is orders  # one object per path
    assert log.path == "shop.db"
    # --- docs/log.md:76
    same = open_log("sqlite://shop.db")
    assert same.path == "shop.db"
    same.close()
    try:
        open_log("redis://localhost/0")
    except LogOpenError as refused:
        assert "redis://" in refused.message
    else:
        raise AssertionError("expected LogOpenError")
    # --- docs/log.md:165
    from pathlib import Path
    from streamkit import LogOpenError

    Path("notes.txt").write_text("not a database\n")
    try:
        open_log("notes.txt")
    except LogOpenError as refused:
        assert refused.code == "LOG_OPEN_REFUSED"
    else:
        raise AssertionError("expected LogOpenError")
    assert Path("notes.txt").read_text() == "not a database\n"
    # --- docs/log.md:212
    import sqlite3
    from contextlib import closing

    async with open_log("trimmed.db") as trimmed:
        await trimmed.stream("/orders").append({"type": "order.placed"})
        await trimmed.stream("/orders").append(*[{"type": "order.placed"}] * 2)
    with closing(sqlite3.connect("trimmed.db")) as conn, conn:
        conn.execute('DELETE FROM streamkit_events WHERE "offset" > 1')  # by hand
    async with open_log("trimmed.db") as trimmed:
        assert await trimmed.stream("/orders").head() == 3
        (placed,) = await trimmed.stream("/orders").append({"type": "order.placed"})
        assert placed.offset == 4  # never 2 again
    # --- docs/log.md:254
    placed, paid = await orders.append(
        {"type": "order.placed", "payload": {"order": 7, "total": 30}},
        {"type": "order.paid", "payload": {"order": 7}, "metadata": {"via": "card"}},
    )
    assert (placed.offset, paid.offset) == (1, 2)
    assert paid.payload == {"order": 7} and paid.path == "/orders"
    # --- docs/log.md:282
    from streamkit import IdempotencyConflict, replayed_offsets

    first = await orders.append(
        {"type": "order.placed", "payload": {"order": 8}, "idempotency_key": "order-8"}
    )
    again = await orders.append(
        {"type": "order.placed", "payload": {"order": 8}, "idempotency_key": "order-8"}
    )
    assert again == first
    assert replayed_offsets(first) == set()
    assert replayed_offsets(again) == {first[0].offset}

    try:
        await orders.append(
            {"type": "order.placed", "payload": {"order": 9}, "idempotency_key": "order-8"}
        )
    except IdempotencyConflict as refused:
        assert str(refused).startswith(
            'idempotency key "order-8" already names a different event at offset 3; nothing was appended'
        )
    else:
        raise AssertionError("expected IdempotencyConflict")
    assert await orders.head() == 3
    # --- docs/log.md:345
    from streamkit import OffsetConflict

    notes = log.stream("/notes")
    await notes.append({"type": "note.added", "payload": {"n": 1}})
    head = await notes.head()
    await notes.append({"type": "note.progress", "ephemeral": True})  # takes an offset
    await notes.append({"type": "note.added", "payload": {"n": 2}}, expect_head=head)
    try:
        await notes.append({"type": "note.added", "payload": {"n": 3}}, expect_head=head)
    except OffsetConflict as stale:
        assert stale.details == {"path": "/notes", "expected_head": head, "actual_head": head + 2}
    else:
        raise AssertionError("expected OffsetConflict")
    # --- docs/log.md:368
    head = await orders.head()
    await orders.append({"type": "order.shipped", "payload": {"order": 7}, "offset": head + 1})
    try:
        await orders.append({"type": "order.shipped", "payload": {"order": 8}, "offset": head + 1})
    except OffsetConflict as refused:
        assert refused.details == {"path": "/orders", "index": 0, "expected": 4, "actual": 5}
    else:
        raise AssertionError("expected OffsetConflict")
    # --- docs/log.md:385
    (tick,) = await orders.append({"type": "order.progress", "payload": {"pct": 50}, "ephemeral": True})
    (done,) = await orders.append({"type": "order.delivered", "payload": {"order": 7}})
    assert tick.ephemeral and (tick.offset, done.offset) == (5, 6)
    page = await orders.read(4)
    assert [e.offset for e in page.events] == [6]  # reads return durable events only
    # --- docs/log.md:408
    from streamkit import InvalidEvent

    try:
        await orders.append({"type": "order.noted"}, {"type": "order.noted", "payload": [1, 2]})
    except InvalidEvent as refused:
        assert refused.details["field"] == "payload" and refused.details["index"] == 1
    else:
        raise AssertionError("expected InvalidEvent")
    assert await orders.head() == 6
    # --- docs/log.md:438
    page = await orders.read(0, limit=2)
    assert [e.offset for e in page.events] == [1, 2]
    assert (page.scanned_through_offset, page.at_head) == (2, False)

    page = await orders.read(2)
    assert [e.offset for e in page.events] == [3, 4, 6]
    assert (page.scanned_through_offset, page.at_head) == (6, True)
    # --- docs/log.md:501
    from pydantic import BaseModel


    class Reading(BaseModel):
        celsius: float


    async with open_log(":memory:") as building:
        sensors = building.stream("/sensors")
        await sensors.append(
            {"type": "sensor.read", "payload": {"celsius": 21.5}},
            {"type": "sensor.read", "payload": {"celsius": "warm"}},
            {"type": "sensor.moved", "payload": {"room": "hall"}},
        )
        page = await sensors.read(0, 10, types={"sensor.read": Reading})
        assert [e.payload for e in page.events] == [
            Reading(celsius=21.5),
            {"celsius": "warm"},  # refused by the model: left as stored
            {"room": "hall"},  # a type not named
        ]
    # --- docs/log.md:529
    import asyncio

    follower = orders.follow()
    events, scanned = await anext(follower)
    assert [e.offset for e in events] == [1, 2, 3, 4, 6] and scanned == (0, 6)

    await orders.append({"type": "order.progress", "ephemeral": True}, {"type": "order.closed"})
    events, scanned = await asyncio.wait_for(anext(follower), 5)
    assert [(e.offset, e.ephemeral) for e in events] == [(7, True), (8, False)]
    assert scanned == (6, 8)
    await follower.aclose()
    # --- docs/log.md:582
    follower = orders.follow()
    follower.skip_to(8)  # offsets 1 to 8 were read another way
    follower.wake()
    assert await follower.next_or_woken() is None
    (opened,) = await orders.append({"type": "order.opened"})
    events, scanned = await asyncio.wait_for(follower.next_or_woken(), 5)
    assert events == [opened] and scanned == (8, opened.offset) and follower.at_head
    follower.close()
    # --- docs/log.md:598
    jobs = log.stream("/jobs")
    await jobs.claim(1_900_000_000.0, claimant="mailer")
    view = jobs.for_processor("billing")  # what a processor engine is given
    await view.claim(1_800_000_000.0)
    assert await jobs.claims() == {"billing": 1_800_000_000.0, "mailer": 1_900_000_000.0}
    await view.claim(None)  # release
    assert await jobs.claims() == {"mailer": 1_900_000_000.0}
    # --- docs/log.md:616
    def create_leases(conn):
        conn.execute("CREATE TABLE IF NOT EXISTS leases (slug TEXT PRIMARY KEY, holder TEXT)")
        conn.execute("INSERT OR REPLACE INTO leases VALUES ('mailer', 'host-1')")
        return "ok"


    assert await log.write_transaction(create_leases) == "ok"
    rows = await log.query(lambda conn: conn.execute("SELECT * FROM leases").fetchall())
    assert rows == [("mailer", "host-1")]
    # --- docs/log.md:682
    async with (
        open_log("inline.db") as quick,
        open_log("threaded.db", inline_commits=False) as threaded,
    ):
        for target in (quick, threaded):
            singles = [
                await target.stream().append({"type": "tick", "payload": {"n": n}}) for n in range(3)
            ]
            together = await asyncio.gather(
                *(target.stream().append({"type": "tock"}) for _ in range(8))
            )
            assert [s[0].offset for s in singles] == [1, 2, 3]
            assert sorted(t[0].offset for t in together) == list(range(4, 12))
    # --- docs/log.md:783
    stats = log.stats
    assert (stats.appended, stats.ephemeral, stats.refused) == (9, 3, 3)
    await log.aclose()
    assert log.closed


if __name__ == "__main__":
    asyncio.run(main())

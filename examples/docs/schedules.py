"""The code of docs/schedules.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/schedules.py
"""

import asyncio


async def main() -> None:
    # --- docs/schedules.md:40
    from datetime import UTC, datetime

    from streamkit.processors.schedules import (
        Catchup,
        Cron,
        Every,
        RunTask,
        Schedule,
        SchedulesProcessor,
        defined_event,
        sync,
    )
    from streamkit.processors.tasks import TASK_REQUESTED
    from streamkit.testing import ManualClock, memory_storage, memory_stream, settle

    from streamkit import ProcessorEngine

    nightly = Schedule(
        "nightly-report",
        Cron("0 3 * * *", tz="Europe/Berlin"),
        action=RunTask("reports.nightly", {"format": "pdf"}),
        catchup=Catchup("latest", window="6h"),
        jitter="30s",
    )
    heartbeat = Schedule("heartbeat", Every("1m"), action=RunTask("ping"))
    # --- docs/schedules.md:125
    clock = ManualClock(datetime(2026, 5, 4, 0, 0, tzinfo=UTC).timestamp())
    memory = memory_stream(clock=clock)
    synced = await sync(memory.stream, [nightly, heartbeat], clock=clock)
    print(synced.added)  # ('nightly-report', 'heartbeat')
    again = await sync(memory.stream, [nightly, heartbeat], clock=clock)
    print(again.unchanged)  # ('nightly-report', 'heartbeat'): nothing appended
    # --- docs/schedules.md:154
    engine = ProcessorEngine(
        SchedulesProcessor(clock=clock), stream=memory.stream, storage=memory_storage(), clock=clock
    )
    memory.engines.append(engine)
    await engine.catch_up_from_log()
    print(datetime.fromtimestamp(engine.statistics().claimed_at, UTC))  # 2026-05-04 00:01:00+00:00

    clock.advance(60)
    await engine.revive()
    await settle()
    print([e.payload["task_id"] for e in memory.events if e.type == TASK_REQUESTED])
    # ['sched/heartbeat/2026-05-04T00:01:00Z']
    # --- docs/schedules.md:194
    sync = Schedule("sync", Every("1m"), action=RunTask("ping"), catchup=Catchup("all", window="10m"))
    await memory.stream.append(defined_event(sync, at=clock()))
    await settle()
    clock.advance(5 * 60)  # five of its slots come due while nothing runs
    await engine.revive()
    await settle()
    decided = [e for e in memory.events if e.payload.get("name") == "sync"][1:]
    print([(e.type, e.payload.get("reason"), e.payload.get("count")) for e in decided])
    # [('schedule.fired', None, None), ('schedule.missed', 'overlap', 4)]
    assert [e.type for e in decided] == ["schedule.fired", "schedule.missed"]
    assert (decided[1].payload["reason"], decided[1].payload["count"]) == ("overlap", 4)
    # --- docs/schedules.md:211
    from streamkit.processors.schedules import due

    slept_from = datetime(2026, 5, 1, tzinfo=UTC)
    woke_at = datetime(2026, 5, 4, 12, tzinfo=UTC)
    decided = due(nightly.timing, Catchup("latest", window="3d"), slept_from, woke_at)
    print([slot.isoformat() for slot in decided.fire])  # ['2026-05-04T01:00:00+00:00']
    for missed in decided.missed:
        print(missed.reason, missed.count, missed.first.isoformat(), missed.last.isoformat())
    # window 1 2026-05-01T01:00:00+00:00 2026-05-01T01:00:00+00:00
    # coalesced 2 2026-05-02T01:00:00+00:00 2026-05-03T01:00:00+00:00
    # --- docs/schedules.md:248
    from itertools import islice
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")

    def walls(timing, start, count):
        slots = islice(timing.forward(start), count)
        return [s.astimezone(berlin).strftime("%m-%d %H:%M %Z") for s in slots]

    half_past_two = Cron("30 2 * * *", tz="Europe/Berlin")
    print(walls(half_past_two, datetime(2026, 3, 28, tzinfo=UTC), 3))
    # ['03-28 02:30 CET', '03-29 03:00 CEST', '03-30 02:30 CEST']
    print(walls(half_past_two, datetime(2026, 10, 24, tzinfo=UTC), 2))
    # ['10-24 02:30 CEST', '10-25 02:30 CEST']
    hourly = Cron("0 * * * *", tz="Europe/Berlin")
    print(walls(hourly, datetime(2026, 10, 24, 23, 10, tzinfo=UTC), 3))
    # ['10-25 02:00 CEST', '10-25 03:00 CET', '10-25 04:00 CET']
    skipping = Cron("30 2 * * *", tz="Europe/Berlin", gap="skip")
    print(walls(skipping, datetime(2026, 3, 28, tzinfo=UTC), 2))
    # ['03-28 02:30 CET', '03-30 02:30 CEST']
    # --- docs/schedules.md:330
    from streamkit.processors.tasks import TASK_SUCCEEDED

    report = Schedule(
        "report",
        Every("1m"),
        action=RunTask("reports.slow"),
        overlap="buffer_one",
        catchup=Catchup("all", window="10m"),
    )
    await memory.stream.append(defined_event(report, at=clock()))
    clock.advance(60)
    await engine.revive()
    await settle()
    clock.advance(60)
    await engine.revive()
    await settle()
    kinds = [e.type for e in memory.events if e.payload.get("name") == "report"]
    print(kinds)  # ['schedule.defined', 'schedule.fired', 'schedule.buffered']
    first = next(
        e for e in memory.events if e.type == TASK_REQUESTED and "report" in e.payload["task_id"]
    )
    await memory.stream.append(
        {
            "type": TASK_SUCCEEDED,
            "payload": {
                "task_id": first.payload["task_id"],
                "request_offset": first.offset,
                "attempt": 1,
            },
        }
    )
    await settle()
    fired = [
        e.payload["slot"]
        for e in memory.events
        if e.type == "schedule.fired" and e.payload["name"] == "report"
    ]
    print(len(fired))  # 2: the waiting slot fired once the first task settled


if __name__ == "__main__":
    asyncio.run(main())

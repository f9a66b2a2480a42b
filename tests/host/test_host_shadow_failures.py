"""A new version that cannot fold what the serving one folded never cuts over unseen.

Host ``a`` serves version 1 of a processor over 1,000 items. Host ``b``
runs version 2, whose reduce raises from the 300th item on (the attack of
issue 54). By default (``on_reduce_error = "stall"``) the shadow build
stalls there: no cutover, version 1 serves on, ``b`` stays healthy. Over
every backend.
"""

from __future__ import annotations

import asyncio
import io
import sqlite3
import time
from contextlib import closing
from typing import Any

from support.backends import Target
from support.host import Effector, EffectorV2, Sums

from streamkit import StreamEvent, define_processor_contract, open_log
from streamkit.backends import host_store
from streamkit.cli import main
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
from streamkit.protocols import RetentionAsk
from streamkit.web._health import assess, readiness

ITEMS = 1000
FAILS_FROM = 300


def config(target: Target) -> HostConfig:
    return HostConfig.model_validate(
        {
            "db": target.target,
            "lease": {"ttl": 1.0, "heartbeat": 0.1},
            "retry": {"initial_delay": 0.01, "max_delay": 0.05},
            "shutdown_grace": 1.0,
        }
    )


def broken_v2(on_reduce_error: Any) -> Effector:
    """Version 2, whose reduce raises on every item from the 300th on."""

    class Broken(Effector):
        factor = 10
        contract = define_processor_contract(
            slug="effector",
            version="2",
            state_schema=Sums,
            consumes=["item"],
            emits=["effect"],
            on_reduce_error=on_reduce_error,
        )

        def reduce(self, event: StreamEvent, state: Sums) -> Sums | None:
            if state.items + 1 >= FAILS_FROM:
                raise KeyError("customer")
            return super().reduce(event, state)

    return Broken()


async def until(check: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def serve_items(target: Target) -> tuple[ProcessorHost, int]:
    old = ProcessorHost(config(target), processors=[Effector()], serve_control=False, owner="a")
    await old.start()
    async with open_log(target.target) as log:
        placed = await log.stream("/").append(
            *({"type": "item", "payload": {"n": 1, "quiet": True}} for _ in range(ITEMS))
        )
    await old.wait_until_processed("effector", placed[-1].offset, timeout=30)
    return old, placed[-1].offset


async def test_by_default_a_shadow_whose_reduce_raises_stalls_and_never_cuts_over(
    target: Target,
) -> None:
    """The build stalls at the 300th item; version 1 serves on; /healthz stays green."""
    old, last = await serve_items(target)
    new = ProcessorHost(
        config(target), processors=[broken_v2(None)], serve_control=False, owner="b"
    )
    try:
        await new.start()

        async def stalled() -> bool:
            (row,) = (await new.status())["processors"]
            return bool(row["stalled"])

        await until(stalled)
        status = await new.status()
        (row,) = status["processors"]
        assert row["stalled_at"] == FAILS_FROM
        assert row["last_error"]["code"] == "REDUCE_FAILED"
        assert "KeyError" in row["last_error"]["traceback"]
        assert row["shadow"] is True
        assert assess(status, None, stuck_after=60.0, follow_stale_after=30.0).healthy
        assert not readiness(status)[0]
        await asyncio.sleep(0.3)
        (served,) = (await old.status())["processors"]
        assert (served["version"], served["serving_version"], served["cursor"]) == ("1", "1", last)
        assert old.runner("effector").engine is not None  # never fenced: no cutover
    finally:
        await new.stop()
        await old.stop()


async def test_a_shadow_that_chose_skip_holds_its_cutover_when_it_skipped_more_than_the_serving_one(
    target: Target,
) -> None:
    """Skipping is chosen, so it builds; it skipped 701 events version 1 read, so it waits.

    The reason is in its status row; version 1 serves on; the kept tallies
    of both versions sit side by side in ``versions``; an operator can still
    cut over by hand, and version 2's counts stay on its row after it serves
    (a host started again reads them back).
    """
    old, last = await serve_items(target)
    skipped = ITEMS - FAILS_FROM + 1
    first = last - (ITEMS - FAILS_FROM)
    new = ProcessorHost(
        config(target), processors=[broken_v2("skip")], serve_control=False, owner="b"
    )
    try:
        await new.start()

        async def held() -> bool:
            (row,) = (await new.status())["processors"]
            return row["phase"] == "awaiting-cutover"

        await until(held)
        (row,) = (await new.status())["processors"]
        reason = row["progress"]["cutover_held"]
        assert f"version 2 skipped {skipped} event(s)" in reason
        assert f"from offset {first}" in reason
        assert "where version 1 skipped 0" in reason
        assert row["reduce_failures"] == skipped
        await asyncio.sleep(0.3)
        (served,) = (await old.status())["processors"]
        assert (served["serving_version"], served["cursor"]) == ("1", last)
        assert old.runner("effector").engine is not None  # not fenced: no cutover

        compared = await new.versions("effector")
        kept = {row["version"]: row["skipped"] for row in compared["versions"]}
        assert kept["1"]["reduce_failures"] == 0
        assert kept["2"]["reduce_failures"] == skipped
        assert kept["2"]["reduce_failures_by_type"] == [
            {"type": "item", "count": skipped, "first_offsets": list(range(first, first + 5))}
        ]

        # The CLI shows the same kept counts, from the database.
        out = io.StringIO()
        versions = ["processor", "versions", "effector", "--db", target.target]
        assert await asyncio.to_thread(main, versions, out=out) == 0
        shown = out.getvalue()
        assert f"reduce_failures={skipped}" in shown
        assert f"    reduce raised on item: {skipped} (first at {first}, " in shown

        done = await new.cut_over("effector", timeout=30)
        assert (done["version"], done["from_version"]) == ("2", "1")
    finally:
        await new.stop()
        await old.stop()

    again = ProcessorHost(
        config(target), processors=[broken_v2("skip")], serve_control=False, owner="c"
    )
    try:
        await again.start()
        await again.wait_until_processed("effector", last, timeout=30)
        (row,) = (await again.status())["processors"]
        assert (row["serving_version"], row["reduce_failures"]) == ("2", skipped)
        compared = await again.versions("effector")
        kept = {row["version"]: row["skipped"] for row in compared["versions"]}
        assert kept["2"]["reduce_failures"] == skipped
    finally:
        await again.stop()


async def test_a_shadow_build_over_a_tampered_archive_stalls_and_never_cuts_over(
    target: Target, tmp_path: Any
) -> None:
    """Issue 55: a segment changed after it was written was folded by a rebuild, which cut
    over with a wrong sum and retired the right version. The read is refused (LOG_TAMPERED):
    the build stalls there, version 1 serves on."""
    old, last = await serve_items(target)
    archive = tmp_path / "archive"
    async with open_log(target.target) as log:
        run = await host_store(log).retention.run(
            RetentionAsk("/", through=400, archive=str(archive))
        )
        assert run.events == 400
    (segment, *_) = sorted(archive.glob("*.segment"))
    with closing(sqlite3.connect(segment)) as conn, conn:
        conn.execute("""UPDATE events SET payload = '{"n":2,"quiet":true}' WHERE "offset" = 7""")
    new = ProcessorHost(config(target), processors=[EffectorV2()], serve_control=False, owner="b")
    try:
        await new.start()

        async def stalled() -> bool:
            (row,) = (await new.status())["processors"]
            return bool(row["stalled"])

        await until(stalled)
        (row,) = (await new.status())["processors"]
        assert row["last_error"]["code"] == "LOG_TAMPERED"
        assert str(segment) in row["last_error"]["error"]
        assert row["shadow"] is True
        await asyncio.sleep(0.3)
        (served,) = (await old.status())["processors"]
        assert served["serving_version"] == "1"
        assert served["cursor"] >= last  # (past the retention run's own record)
        assert old.runner("effector").engine is not None  # not fenced: no cutover
    finally:
        await new.stop()
        await old.stop()

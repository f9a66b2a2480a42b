"""A new version that cannot fold what the serving one folded never cuts over unseen.

Host ``a`` serves version 1 of a processor over 1,000 items. Host ``b``
runs version 2, whose reduce raises from the 300th item on (the attack of
issue 54). By default (``on_reduce_error = "stall"``) the shadow build
stalls there: no cutover, version 1 serves on, ``b`` stays healthy. Over
every backend.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from support.backends import Target
from support.host import Effector, Sums

from streamkit import StreamEvent, define_processor_contract, open_log
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
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

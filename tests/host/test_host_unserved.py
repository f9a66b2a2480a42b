"""A processor no live host serves is seen: status, /readyz and the metric say so.

(Also: the lease the old version loses at the cutover is logged at info, not as a fault.)

Host ``a`` runs version 1 of a processor, host ``b`` version 2; ``b``
builds in the shadow and cuts over, so ``a`` stands aside (retired). When
``b`` stops, nothing processes the path: ``a`` must not answer ready with
``processors: []``. Within two heartbeats its status says "serving v2 runs
on no live host", ``/readyz``'s verdict is not ready with that reason, and
``streamkit_processor_unserved`` is 1; a host that serves version 2 again
clears all three. Over every backend.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from structlog.testing import capture_logs
from support.backends import Target
from support.host import Effector, EffectorV2

from streamkit import open_log
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
from streamkit.web._health import readiness
from streamkit.web._metrics import exposition

HEARTBEAT = 0.1


def config(target: Target) -> HostConfig:
    return HostConfig.model_validate(
        {"db": target.target, "lease": {"ttl": 1.0, "heartbeat": HEARTBEAT}, "shutdown_grace": 1.0}
    )


async def until(check: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def scraped(status: dict[str, Any], log_stats: Any) -> str:
    return exposition(
        status, follow_age=None, log_stats=log_stats, lag_seconds={}, histograms={}
    ).decode()


async def test_a_host_left_with_a_retired_version_says_nothing_serves_the_processor(
    target: Target,
) -> None:
    """After the new version's host cut over and stopped, the old one is not ready within
    two heartbeats, names the unserved version, and recovers when a host serves it again."""
    old = ProcessorHost(config(target), processors=[Effector()], serve_control=False, owner="a")
    new = ProcessorHost(config(target), processors=[EffectorV2()], serve_control=False, owner="b")
    again: ProcessorHost | None = None
    try:
        await old.start()
        async with open_log(target.target) as log:
            await log.stream("/").append(*({"type": "item", "payload": {"n": 1}} for _ in range(5)))
        await old.wait_until_processed("effector", 5, timeout=30)
        with capture_logs() as logs:
            await new.start()
            await new.wait_until_processed("effector", 5, timeout=30)

            async def retired() -> bool:
                return old.runner("effector").state == "retired"

            await until(retired)
        # The fence a rolling deploy expects is said at info, naming the version that took over.
        (lost,) = [e for e in logs if e["event"] == "lease.lost"]
        assert (lost["log_level"], lost["cut_over_to"]) == ("info", "2")
        row = (await old.status())["processors"][0]
        assert row["unserved"] is None  # b serves version 2
        assert readiness(await old.status())[0]
        await new.stop()
        stopped_at = time.monotonic()

        async def unserved() -> bool:
            return bool((await old.status())["processors"][0]["unserved"])

        await until(unserved, within=10)
        # Two beats in a row (plus one for the beat in flight when b stopped).
        assert time.monotonic() - stopped_at < 6 * HEARTBEAT + 0.5
        status = await old.status()
        (row,) = status["processors"]
        assert row["unserved"]["text"] == "serving v2 runs on no live host"
        ready, body = readiness(status)
        assert not ready
        assert body["processors"] == [
            {
                "slug": "effector",
                "path": "/",
                "phase": "unserved",
                "ready": False,
                "why": "serving v2 runs on no live host",
            }
        ]
        assert 'streamkit_processor_unserved{path="/",slug="effector"} 1.0' in scraped(
            status, old.log.stats
        )

        again = ProcessorHost(
            config(target), processors=[EffectorV2()], serve_control=False, owner="c"
        )
        await again.start()

        async def served() -> bool:
            return not (await old.status())["processors"][0]["unserved"]

        await until(served)
        status = await old.status()
        assert readiness(status)[0]
        assert 'streamkit_processor_unserved{path="/",slug="effector"} 0.0' in scraped(
            status, old.log.stats
        )
    finally:
        for host in (again, new, old):
            if host is not None:
                await host.stop()

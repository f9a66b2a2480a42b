"""A new version whose shadow build meets deleted history stops, once, and says how to go on.

Host ``a`` serves version 1 of a processor; retention deletes the path's
oldest events (no archive). Host ``b`` starts with version 2, which must
build from offset 1: the history it needs is gone. The build is not retried
forever: ``b`` marks it ``cannot-build: history before N was deleted`` with
advice, gives its shadow lease up, answers ``/readyz`` not ready with that
reason, keeps ``/healthz`` green (its own serving work is fine), and the
path's horizon never stands below its start. Version 1 serves on. Over every
backend.
"""

from __future__ import annotations

import asyncio
import time

from structlog.testing import capture_logs
from support.backends import Target
from support.host import Effector, EffectorV2

from streamkit import open_log
from streamkit.backends import host_store
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost
from streamkit.protocols import RetentionAsk
from streamkit.web._health import assess, readiness
from streamkit.web._metrics import exposition


def config(target: Target) -> HostConfig:
    return HostConfig.model_validate(
        {
            "db": target.target,
            "lease": {"ttl": 1.0, "heartbeat": 0.1},
            "retry": {"initial_delay": 0.01, "max_delay": 0.05},
            "shutdown_grace": 1.0,
        }
    )


async def test_a_shadow_build_over_deleted_history_stops_with_cannot_build(
    target: Target,
) -> None:
    """cannot-build once, no retries, the shadow lease given up, not ready but healthy."""
    old = ProcessorHost(config(target), processors=[Effector()], serve_control=False, owner="a")
    new = ProcessorHost(config(target), processors=[EffectorV2()], serve_control=False, owner="b")
    try:
        await old.start()
        async with open_log(target.target) as log:
            placed = await log.stream("/").append(
                *({"type": "item", "payload": {"n": 1, "quiet": True}} for _ in range(30))
            )
            await old.wait_until_processed("effector", placed[-1].offset, timeout=30)
            run = await host_store(log).retention.run(RetentionAsk("/", through=20, chunk=8))
        assert (run.mode, run.start_after) == ("delete", 21)
        with capture_logs() as logs:
            await new.start()
            runner = new.runner("effector")
            deadline = time.monotonic() + 20
            while runner.failures.cannot_build is None or runner.held is not None:
                assert time.monotonic() < deadline, "the build never stopped"
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)  # five heartbeats: time enough to see any retry
        stopped = runner.failures.cannot_build
        assert stopped["reason"] == "history before 21 was deleted"
        assert "streamkit processor forget effector --version 2" in stopped["advice"]
        assert [e["event"] for e in logs].count("processor.cannot_build") == 1
        assert [e["event"] for e in logs].count("batch.failed") == 1  # never retried
        assert runner.engine is None  # the shadow lease was given up, and not taken again
        status = await new.status()
        (row,) = status["processors"]
        assert row["cannot_build"] == stopped
        ready, body = readiness(status)
        assert not ready
        assert body["processors"][0]["why"] == "cannot-build: history before 21 was deleted"
        health = assess(status, None, stuck_after=60.0, follow_stale_after=30.0)
        assert health.healthy, health.reasons
        assert new.log is not None
        scraped = exposition(
            status, follow_age=None, log_stats=new.log.stats, lag_seconds={}, histograms={}
        ).decode()
        assert 'streamkit_processor_cannot_build{path="/",slug="effector"} 1.0' in scraped
        # Version 1 serves on, and the path's horizon never stands below its start.
        more = await old.append("/", [{"type": "item", "payload": {"n": 2, "quiet": True}}])
        await old.wait_until_processed("effector", more[-1].offset, timeout=30)
        (horizon,) = (await old.status())["retention"]
        assert horizon["start"] == 21
        assert horizon["horizon"] >= 21
    finally:
        for host in (new, old):
            await host.stop()

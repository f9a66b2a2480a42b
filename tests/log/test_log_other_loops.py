"""The log on an event loop that is not asyncio's own (uvloop): same outcomes, thread commits.

The inline-commit decision reads asyncio's private ready queue in one place
(``streamkit.log._grouping.CommitGrouping.commits_now``); a loop without it must take the
writer thread every time and keep every rule of the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop
from support.log import offsets, order

from streamkit import OffsetConflict, open_log

T = TypeVar("T")


def run_on_uvloop(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``coro_fn()`` to completion on a fresh uvloop event loop."""
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    try:
        return runner.run(coro_fn())
    finally:
        runner.close()


def test_uvloop_has_no_ready_queue_so_nothing_commits_on_the_loop(tmp_path: Path) -> None:
    """On uvloop the inline decision says no, and every kind of append still commits in order."""

    async def scenario() -> tuple[bool, list[int], int, int]:
        loop = asyncio.get_running_loop()
        async with open_log(tmp_path / "u.db") as log:
            inline = log._grouping.commits_now(loop)
            stream = log.stream("/")
            await stream.append(order(1))  # a lone plain append
            await asyncio.gather(*(stream.append(order(n)) for n in range(2, 12)))  # a group
            (keyed,) = await stream.append(order(12, idempotency_key="k"))
            (again,) = await stream.append(order(12, idempotency_key="k"))
            assert again == keyed
            with pytest.raises(OffsetConflict):
                await stream.append(order(13), expect_head=5)
            (ephemeral,) = await stream.append({**order(0), "ephemeral": True})
            assert ephemeral.ephemeral
            done = await log.write_transaction(lambda conn: "ok", inline=True)
            assert done == "ok"
            return inline, await offsets(log), log.stats.transactions, ephemeral.offset

    inline, seen, transactions, ephemeral_at = run_on_uvloop(scenario)
    assert inline is False
    assert seen == list(range(1, 13))
    assert ephemeral_at == 13
    assert transactions >= 3  # the lone append, at least one group, the keyed one


@pytest.mark.speed_trick
def test_asyncios_own_loop_answers_from_its_ready_queue() -> None:
    """On asyncio's loop the decision is yes while nothing else is ready, no once something is."""

    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        async with open_log(":memory:") as log:
            idle = log._grouping.commits_now(loop)
            loop.call_soon(lambda: None)
            busy = log._grouping.commits_now(loop)
            await asyncio.sleep(0)
        return idle, busy

    assert asyncio.run(scenario()) == (True, False)

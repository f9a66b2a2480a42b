"""Waiting on a condition instead of sleeping a fixed time: one helper for every test.

A test that sleeps "long enough" passes on an idle machine and fails on a busy one
(the suite runs in several processes at once). :func:`until` polls the condition
instead and returns as soon as it holds; its deadline only bounds a failing test.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

__all__ = ["until"]


async def until(
    check: Callable[[], bool | Awaitable[bool]], within: float = 30.0, every: float = 0.005
) -> None:
    """Poll ``check()`` (plain or async) every ``every`` s until it holds; fail after ``within``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        held = check()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached in {within} s")
        await asyncio.sleep(every)

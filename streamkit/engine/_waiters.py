"""Callers waiting for an engine's cursor to reach an offset.

A :class:`CursorWaiters` holds one future per waiting caller with the offset
it waits for. The engine tells it each time the cursor moves (every waiter at
or below the cursor is released) and when it latches an error (every waiter
gets it). A waiter that times out or is cancelled leaves the list at once, so
later batches never scan it. Waiting starts the engine's catch-up, or, for an
engine that its host pushes every commit to, gives the push
:data:`PUSH_GRACE` seconds to arrive first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from streamkit.errors import ProcessorTimeout

__all__ = ["PUSH_GRACE", "CursorWaiters"]

PUSH_GRACE = 0.05
"""Seconds a waiter on an engine fed by pushes gives the push before reading the log itself."""

_Waiter = tuple[int, asyncio.Future[None]]


class CursorWaiters:
    """The waiters of one engine (see the module docstring)."""

    def __init__(self, slug: str, cursor: Callable[[], int]) -> None:
        self._slug = slug
        self._cursor = cursor
        self._waiters: list[_Waiter] = []
        self._arrival: asyncio.Future[None] | None = None  # see wait_arrival

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait_arrival(self, timeout: float) -> None:  # noqa: ASYNC109 (a bounded pause)
        """Return once a caller starts to wait, or after ``timeout`` seconds, whichever is first.

        What a host's pause between ranges waits on: a client that begins to
        wait for this processor ends the pause at once.
        """
        if self._waiters:
            return
        if self._arrival is None or self._arrival.done():
            self._arrival = asyncio.get_running_loop().create_future()
        await asyncio.wait([self._arrival], timeout=timeout)  # (never cancels the future)

    def advanced(self, cursor: int) -> None:
        """The cursor moved to ``cursor``: release every waiter it reached."""
        if not self._waiters:
            return
        keep: list[_Waiter] = []
        for waiter in self._waiters:
            offset, future = waiter
            if future.done():
                continue
            if cursor >= offset:
                future.set_result(None)
            else:
                keep.append(waiter)
        self._waiters = keep

    def fail(self, error: BaseException) -> None:
        """The engine latched ``error``: every waiter raises it."""
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(error)

    async def wait(
        self,
        offset: int,
        timeout: float | None,  # noqa: ASYNC109 (the engine verb's timeout, SPEC 4)
        catch_up: Callable[[], asyncio.Task[None]],
        *,
        push_first: bool,
    ) -> None:
        """Return once the cursor reaches ``offset``; a failed catch-up raises its error.

        ``catch_up`` starts the engine's catch-up; with ``push_first`` it is
        started only if no push brought the cursor there within
        :data:`PUSH_GRACE`. Raises :class:`~streamkit.errors.ProcessorTimeout`
        after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = (offset, future)
        self._waiters.append(waiter)
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)

        def catch_up_done(task: asyncio.Task[None]) -> None:
            error = None if task.cancelled() else task.exception()
            if error is not None and not future.done():
                future.set_exception(error)

        def start_catch_up() -> None:
            if not future.done():
                catch_up().add_done_callback(catch_up_done)

        fallback: asyncio.TimerHandle | None = None
        if push_first:
            fallback = loop.call_later(PUSH_GRACE, start_catch_up)
        else:
            start_catch_up()
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            cursor = self._cursor()
            raise ProcessorTimeout(
                f'processor "{self._slug}" did not reach offset {offset} within {timeout} s '
                f"(it is at {cursor}); nothing was changed; wait longer, or check that "
                "the offset exists and the processor is being pushed",
                details={"slug": self._slug, "offset": offset, "cursor": cursor},
            ) from None
        finally:
            if fallback is not None:
                fallback.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

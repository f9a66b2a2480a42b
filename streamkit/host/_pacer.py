"""Clients first: while clients append, a host's processors take at most a share of its time.

A producer appending through the host (the control socket, HTTP, a caller
in the same process) shares the host's event loop with the work its own
events cause, and that work runs whenever it is ready: measured with one
producer of durable tasks, the producer enqueued at 21-34% of the rate it
reached with no processor running, and at 13-16% with sixteen producers.

So, while clients append (:meth:`~streamkit.log.Log.clients_active`), the
runners of a host take turns through one :class:`Pacer`: after a range that
took ``B`` seconds to run, the next range of any runner starts only once
``B * (1 - share) / share`` seconds have passed. Ranges then take at most
``share`` of the time (``HostConfig.processor_share``). The events that
arrive meanwhile wait in the follower and are taken as one range, so the
batch, its checkpoint and its commit are shared by more events: the
processors lag while clients append, and catch up by the batch.

Nothing is paused while no client appends, a range already taken always
runs to its end, and one pause lasts at most :data:`MAX_PAUSE_SECONDS`, so a
processor never waits long on what a short burst of clients left behind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["MAX_PAUSE_SECONDS", "Pacer"]

MAX_PAUSE_SECONDS = 0.1
"""The longest pause one range earns (a range of seconds earns no minute of idling)."""


class Pacer:
    """The turns of one host's runners (see the module docstring).

    ``share`` is in (0, 1]; at 1 nothing ever waits. ``clients_active``
    says whether clients append now; ``clock`` and ``sleep`` are
    injectable for tests.
    """

    __slots__ = ("_clients_active", "_clock", "_factor", "_ready_at", "_sleep")

    def __init__(
        self,
        share: float,
        clients_active: Callable[[], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self._factor = (1 - share) / share
        self._clients_active = clients_active
        self._clock = clock
        self._sleep = sleep
        self._ready_at = 0.0

    def pacing(self) -> bool:
        """Whether ranges are paced now: clients append and the share is below 1."""
        return self._factor > 0 and self._clients_active()

    async def turn(self) -> None:
        """Wait, while clients append, until the ranges run so far have had their pause."""
        wait = self._ready_at - self._clock()
        if wait > 0 and self._clients_active():
            await self._sleep(wait)

    def ran(self, seconds: float) -> None:
        """A range took ``seconds``: the next one waits its pause after it (or after the last)."""
        if self._factor:
            start = max(self._ready_at, self._clock())
            self._ready_at = start + min(seconds * self._factor, MAX_PAUSE_SECONDS)

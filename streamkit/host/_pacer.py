"""Clients first: while clients contend for the loop, a host's processors take at most a share of it.

A producer appending through the host (the control socket, HTTP, a caller
in the same process) shares the host's event loop with the work its own
events cause, and that work runs whenever it is ready: measured with one
producer of durable tasks, the producer enqueued at 21-34% of the rate it
reached with no processor running, and at 13-16% with sixteen producers.

So the runners of a host take turns through one :class:`Pacer`, and only
while clients contend (:meth:`~streamkit.log.Log.clients_contend`: one of
their appends waits for its commit). A range that took ``B`` seconds earns
a pause of ``B * (1 - share) / share`` seconds (``HostConfig.processor_share``,
at most :data:`MAX_PAUSE_SECONDS`) before the next range of any runner. When
a range is ready, the runner gives the loop one turn (requests and timers
that came due while the last range ran are seen then); if clients contend,
it pauses until the pause is over, or until a look every
:data:`PAUSE_CHECK_SECONDS` finds them quiet. The events that arrive
meanwhile wait in the follower and are taken as one range, so the batch,
its checkpoint and its commit are shared by more events.

A client waiting *for* a processor is served first: a range that a caller
waits for is never paused, and a pause ends when a caller starts to wait. A
client that appends and then waits for its event to be processed (every
request/response flow) has no append in flight while it waits, so nothing
is held back on its own behalf. A range already taken always runs to its
end. What is paused is counted (:class:`PacerStats`) and shown by
``status`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["MAX_PAUSE_SECONDS", "PAUSE_CHECK_SECONDS", "Clients", "Pacer", "PacerStats"]

MAX_PAUSE_SECONDS = 0.1
"""The longest pause one range earns (a range of seconds earns no minute of idling)."""


@dataclass(frozen=True, slots=True)
class PacerStats:
    """What one host's pacer did since it started."""

    pauses: int
    """Ranges that waited for clients' work before they ran."""
    paused_seconds: float
    """The time those ranges waited, in total."""


class Clients(Protocol):
    """What the pacer asks of the log about its clients (:class:`~streamkit.log.Log` is one)."""

    def clients_contend(self) -> bool:
        """Whether one of the clients' appends waits for its commit now."""
        ...

    @property
    def client_handovers(self) -> int:
        """How many clients' appends so far could not commit at once."""
        ...


PAUSE_CHECK_SECONDS = 0.002
"""How often a pause looks whether clients still contend (it ends when they stopped)."""


class Pacer:
    """The turns of one host's runners (see the module docstring).

    ``share`` is in (0, 1]; at 1 nothing ever waits. ``clients`` says
    whether clients contend for the loop; ``clock`` and ``sleep`` are
    injectable for tests.
    """

    __slots__ = ("_clients", "_clock", "_factor", "_paused", "_pauses", "_ready_at", "_sleep")

    def __init__(
        self,
        share: float,
        clients: Clients,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self._factor = (1 - share) / share
        self._clients = clients
        self._clock = clock
        self._sleep = sleep
        self._ready_at = 0.0
        self._pauses = 0
        self._paused = 0.0

    def pacing(self) -> bool:
        """Whether clients come first now: they contend and the share is below 1."""
        return self._factor > 0 and self._clients.clients_contend()

    def statistics(self) -> PacerStats:
        """How often, and for how long, ranges waited for clients."""
        return PacerStats(pauses=self._pauses, paused_seconds=self._paused)

    async def turn(
        self,
        *,
        awaited: Callable[[], bool],
        wait_awaited: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """Before a range that is ready to take: the pause it owes, while clients contend.

        ``awaited()`` says whether a caller waits for the runner's processor
        to progress: a client waiting *for* the processor is served first of
        all, so then nothing pauses, and a pause ends the moment one starts
        to wait (``wait_awaited(seconds)`` returns then, or when the seconds
        are up; without it the pause sleeps). Otherwise, when a pause is
        owed, gives the loop one turn (so that requests and timers that came
        due while the last range ran are seen); if clients contend then, the
        pause lasts until it is over, or until a look every
        :data:`PAUSE_CHECK_SECONDS` finds that no client's append is in flight
        and none was handed over since the last look. Cancelling cancels only
        the wait.
        """
        if self._clock() >= self._ready_at or awaited():
            return
        await asyncio.sleep(0)  # what arrived during the last range is ready now, if anything
        clients = self._clients
        if awaited() or not clients.clients_contend():
            return
        wait = self._sleep if wait_awaited is None else wait_awaited
        began = self._clock()
        counted = False
        seen = clients.client_handovers
        while (left := self._ready_at - self._clock()) > 0:
            if not counted:
                self._pauses += 1
                counted = True
            try:
                await wait(min(left, PAUSE_CHECK_SECONDS))
            finally:
                now = self._clock()
                self._paused += now - began
                began = now
            if awaited():
                return
            handed = clients.client_handovers
            if handed == seen and not clients.clients_contend():
                return  # the clients went quiet: the range is not held for nobody
            seen = handed

    def ran(self, seconds: float) -> None:
        """A range took ``seconds``: the next range of any runner owes its pause from now.

        Owed from now, not added to what was owed before: a pause that was not
        had (nobody contended, or a caller waited for the processor) is not
        owed later, so ranges run while the loop was free never build up a
        debt that a client's first append in flight would then pay.
        """
        if self._factor:
            pause = min(seconds * self._factor, MAX_PAUSE_SECONDS)
            self._ready_at = max(self._ready_at, self._clock() + pause)

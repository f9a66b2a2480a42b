"""How the daemon stops: on SIGTERM or SIGINT, cleanly, and past work that will not end.

The first signal asks for a clean stop (the batches in flight finish, the
leases are released, the log is closed). A signal within
:data:`REPEAT_SIGNAL_WINDOW` seconds of it is the same request; a later one
exits the process at once (the log keeps every committed write). Once the
stop is done, work that ignores its cancel (a handler that catches
``CancelledError``) does not hold the exit (:func:`exit_past_strays`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import structlog

from streamkit.engine import CANCEL_WAIT

__all__ = ["REPEAT_SIGNAL_WINDOW", "StopSignals", "exit_past_strays"]

_log = structlog.get_logger("streamkit.host")

REPEAT_SIGNAL_WINDOW = 0.5
"""Seconds after the first stop signal within which another is the same request.

``timeout`` sends its child SIGTERM twice (to the child, then to its process
group); a Ctrl-C reaches a wrapper and its child alike. Read as "exit at once",
such an echo would skip the lease release and leave the next host waiting a
full ttl, so only a signal after this window forces the exit.
"""

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """The stop signals of one running daemon, installed on its loop (see the module)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._requested = asyncio.Event()
        self._first_at: float | None = None
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)

    def request(self) -> None:
        """Ask for the clean stop (as the first signal does)."""
        self._requested.set()

    async def wait(self) -> None:
        """Return once a stop was asked for."""
        await self._requested.wait()

    def remove(self) -> None:
        """Give the signals back to their default handlers."""
        for sig in _SIGNALS:
            self._loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        now = time.monotonic()
        if self._first_at is None:
            self._first_at = now
            _log.info("host.signal", signal=sig.name)
            self.request()
        elif now - self._first_at < REPEAT_SIGNAL_WINDOW:
            _log.info(
                "host.signal_repeated",
                signal=sig.name,
                detail=f"within {REPEAT_SIGNAL_WINDOW} s of the first: the same stop, still clean",
            )
        else:
            _log.warning("host.exit_now", signal=sig.name)
            os._exit(128 + int(sig))


async def exit_past_strays() -> None:
    """Cancel what still runs after a stop; exit the process now if some of it will not end.

    ``asyncio.run`` waits for every task it cancels at the end, so one that
    catches ``CancelledError`` would keep a stopped host's process alive for
    ever. The stop released the leases and closed the log first, so exiting
    past it loses nothing.
    """
    current = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not current]
    for task in left:
        task.cancel()
    if not left:
        return
    _, still = await asyncio.wait(left, timeout=CANCEL_WAIT)
    if not still:
        return
    _log.warning(
        "host.exit_forced",
        running=sorted(task.get_name() for task in still),
        detail=f"still running {CANCEL_WAIT} s after their cancel (they catch CancelledError); "
        "the host stopped cleanly (leases released, log closed) and exits without them",
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

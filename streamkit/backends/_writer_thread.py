"""A backend's writer thread and its request queue: taking jobs, closing.

Every backend runs its writes on one thread of its own, in submission
order; :class:`WriterThread` is the part of a writer that owns that thread
and its queue:

- :meth:`~WriterThread.submit` queues a job until the log starts closing,
  then refuses with :class:`~streamkit.errors.LogClosed`;
- :meth:`~WriterThread.request_close` lets the queued jobs finish first;
  whatever is still queued when the thread ends is settled with
  ``LogClosed`` (nothing written) by :meth:`~WriterThread.finish`, and every
  close waiter is resolved.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
from collections.abc import Callable
from typing import Any

from streamkit._requests import CloseJob, FollowJob, Job, resolve_close
from streamkit.backends._settling import Settling
from streamkit.errors import InvalidRequest, LogClosed

__all__ = ["WriterThread", "check_busy_timeout"]


def check_busy_timeout(busy_timeout: object) -> None:
    """How long a write may wait for another's lock: a non-negative number of seconds."""
    if (
        isinstance(busy_timeout, bool)
        or not isinstance(busy_timeout, int | float)
        or not math.isfinite(busy_timeout)
        or busy_timeout < 0
    ):
        raise InvalidRequest(
            f"busy_timeout must be a non-negative number of seconds, got {busy_timeout!r}; "
            "nothing was opened",
            details={"busy_timeout": repr(busy_timeout)},
        )


class WriterThread:
    """The queue, the close and the thread of one writer (see the module docstring).

    ``run`` is the writer's loop: it takes jobs with :meth:`get` and
    :meth:`take` and calls :meth:`finish` when it ends. The thread starts
    with :meth:`start`, once the writer's own state is ready.
    """

    def __init__(self, run: Callable[[], None], name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.queue_empty = self._queue.empty
        """Whether no job waits in the queue (the queue's own method: no frame of ours)."""
        self._submit_lock = threading.Lock()
        self.accepting = True
        """Whether jobs are still taken (no close was requested); changed under the submit lock."""
        self._finished = threading.Event()
        self._close_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread = threading.Thread(target=run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread (once)."""
        self._thread.start()

    def submit(self, job: Job | FollowJob) -> None:
        """Queue a job; raise :class:`LogClosed` once the log is closing."""
        with self._submit_lock:
            if not self.accepting:
                raise LogClosed(
                    "the log is closed; nothing was read or written (open it again to use it)"
                )
            self._queue.put(job)

    def request_close(
        self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
    ) -> None:
        """Stop accepting jobs; the thread finishes the queued ones, then closes the connection."""
        with self._submit_lock:
            if waiter is not None:
                if self._finished.is_set():
                    waiter[1].set_result(None)
                else:
                    self._close_waiters.append(waiter)
            if self.accepting:
                self.accepting = False
                self._queue.put(CloseJob())

    def join(self) -> None:
        """Wait until the writer thread has finished (not from the thread itself)."""
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def get(self, timeout: float | None = None) -> Any:
        """The next job, waiting up to ``timeout`` seconds (forever if None); queue.Empty if none."""
        return self._queue.get(timeout=timeout)

    def take(self, first: Any, limit: int) -> list[Any]:
        """``first`` and whatever else is queued now, up to ``limit`` jobs."""
        jobs = [first]
        while len(jobs) < limit:
            try:
                jobs.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return jobs

    def finish(self, settling: Settling) -> None:
        """The loop ended: fail what is still queued (nothing written), wake every close waiter."""
        leftovers: list[Job] = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, Job):
                job.error = LogClosed("the log closed before this call ran; nothing was written")
                leftovers.append(job)
        settling.add_all(leftovers)
        settling.flush()
        with self._submit_lock:
            self.accepting = False
            self._finished.set()
            waiters, self._close_waiters = self._close_waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve_close, future)

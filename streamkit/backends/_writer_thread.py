"""The request queue of a backend's writer thread: taking jobs, closing, settling.

Every backend runs its writes on one thread of its own, in submission
order; :class:`WriterThread` is what they share around it:

- :meth:`~WriterThread.submit` queues a job until the log starts closing,
  then refuses with :class:`~streamkit.errors.LogClosed`;
- :meth:`~WriterThread.request_close` lets the queued jobs finish first;
  whatever is still queued when the thread ends is settled with
  ``LogClosed`` (nothing written), and every close waiter is resolved;
- finished jobs and woken followers are settled with one hand-off per event
  loop (:func:`~streamkit._requests.deliver`);
- a bug in a step fails the jobs it touched, never the thread (which would
  hang every caller behind it).

A subclass starts the thread with :meth:`_start_thread` once its own state
is ready, runs its loop, and calls :meth:`_finish` when the loop ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from streamkit._requests import (
    AppendCall,
    CloseJob,
    FollowJob,
    Job,
    WriteCall,
    deliver,
    resolve_close,
)
from streamkit.errors import InvalidRequest, LogClosed
from streamkit.events import StreamEvent
from streamkit.log._follow import WakeList

__all__ = ["WriterThread", "check_busy_timeout", "fresh_by_path"]


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
    """The queue, the close and the settling of one writer thread (see the module docstring)."""

    def _init_queue(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._submit_lock = threading.Lock()
        self._accepting = True
        self._finished = threading.Event()
        self._close_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._settle: list[Job] = []
        self._wakes: WakeList = {}

    def _start_thread(self, run: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job | FollowJob) -> None:
        """Queue a job; raise :class:`LogClosed` once the log is closing."""
        with self._submit_lock:
            if not self._accepting:
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
            if self._accepting:
                self._accepting = False
                self._queue.put(CloseJob())

    def join(self) -> None:
        """Wait until the writer thread has finished (not from the thread itself)."""
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _take(self, first: Any, limit: int) -> list[Any]:
        """``first`` and whatever else is queued now, up to ``limit`` jobs."""
        jobs = [first]
        while len(jobs) < limit:
            try:
                jobs.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return jobs

    def _guarded(self, step: Callable[[Any], None], arg: Any) -> None:
        try:
            step(arg)
        except Exception as exc:
            self._fail(arg if isinstance(arg, list) else [arg], exc)
        self._flush()

    def _fail(self, jobs: list[Any], exc: Exception) -> None:
        """A bug fails the calls it touched; it never kills the thread and hangs every caller."""
        for job in jobs:
            if isinstance(job, Job) and job not in self._settle:
                job.error = exc
                self._settle.append(job)
        self._forget()

    def _forget(self) -> None:
        """After a failure nothing cached about the storage can be trusted (a subclass drops it)."""

    def _flush(self, direct: asyncio.AbstractEventLoop | None = None) -> None:
        """Settle finished jobs and wake followers; ``direct`` is the loop running this call."""
        jobs, wakes = self._settle, self._wakes
        self._settle = []
        if wakes:
            self._wakes = {}
        deliver(jobs, wakes, direct)

    def _finish(self) -> None:
        leftovers: list[Job] = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, Job):
                job.error = LogClosed("the log closed before this call ran; nothing was written")
                leftovers.append(job)
        self._settle.extend(leftovers)
        self._flush()
        with self._submit_lock:
            self._accepting = False
            self._finished.set()
            waiters, self._close_waiters = self._close_waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve_close, future)


def fresh_by_path(calls: Sequence[WriteCall]) -> dict[str, tuple[list[StreamEvent], int]]:
    """What a committed group added, per path: its new events in order, and their stored size.

    The size is the payload and metadata JSON, what a push costs a follower to
    hold. Refused calls and idempotent hits add nothing.
    """
    fresh: dict[str, tuple[list[StreamEvent], int]] = {}
    for call in calls:
        if call.error is None and isinstance(call, AppendCall) and call.fresh:
            events, size = fresh.get(call.path, ([], 0))
            events.extend(call.fresh)
            size += sum(len(e.payload_json) + len(e.metadata_json) for e in call.events)
            fresh[call.path] = (events, size)
    return fresh

"""The outcomes a writer thread owes its callers: finished jobs and followers to wake.

A writer collects what each step finished (jobs whose futures to settle,
followers' events to set) in one :class:`Settling` and flushes it once per
step: one hand-off per event loop (:func:`~streamkit._requests.deliver`),
none at all for a commit made inline on the caller's own loop. A bug in a
step fails the jobs it touched (:meth:`Settling.guarded`), never the thread,
which would hang every caller behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from streamkit._requests import Job, deliver
from streamkit.log import WakeList

__all__ = ["Settling"]

A = TypeVar("A")


class Settling:
    """The jobs finished and followers woken since the last flush (see the module)."""

    __slots__ = ("add", "add_all", "jobs", "wakes")

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        """The jobs finished since the last flush (always this one list object)."""
        self.wakes: WakeList = {}
        """Followers to wake, by loop: handed to ``Feed.publish`` to fill."""
        # The list's own methods, called once or twice per commit: no frame of ours.
        self.add: Callable[[Job], None] = self.jobs.append
        """``job`` finished (its result or error is set)."""
        self.add_all: Callable[[Iterable[Job]], None] = self.jobs.extend
        """Each of ``jobs`` finished."""

    def pending(self) -> bool:
        """Whether anything waits to be flushed."""
        return bool(self.jobs) or bool(self.wakes)

    def flush(self, direct: asyncio.AbstractEventLoop | None = None) -> None:
        """Settle the finished jobs and wake followers; ``direct`` is the loop running this call."""
        jobs, wakes = self.jobs.copy(), self.wakes
        self.jobs.clear()
        if wakes:
            self.wakes = {}
        deliver(jobs, wakes, direct)

    def guarded(self, step: Callable[[A], None], arg: A, forget: Callable[[], None]) -> None:
        """Run ``step(arg)`` and flush; a bug in it fails the jobs of ``arg`` and ``forget``s.

        After such a failure nothing cached about the storage can be trusted,
        so the writer's ``forget`` drops it.
        """
        try:
            step(arg)
        except Exception as exc:
            self.fail(arg if isinstance(arg, list) else [arg], exc)
            forget()
        self.flush()

    def fail(self, jobs: Iterable[Any], exc: Exception) -> None:
        """Fail each job of ``jobs`` not already finished with ``exc``."""
        for job in jobs:
            if isinstance(job, Job) and job not in self.jobs:
                job.error = exc
                self.jobs.append(job)

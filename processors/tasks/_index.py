"""What an at-head pass of the tasks processor looks at, kept from the events rather than rescanned.

An at-head pass decides which waiting tasks start (earliest due first, then
oldest request), which wakeup to ask for, and which tasks need a cancel or
were interrupted. Scanning every live task for that on every pass costs what
the backlog holds, not what changed. :class:`TaskIndex` instead keeps a heap
of ``(due, request_offset, task_id)`` for tasks that wait, and the ids that
need a look, updated from each event the processor sees (one task each).

It never decides on its own: every entry is checked against the state when
used, and an entry that no longer matches is dropped (a task that started,
settled or got a new due time is pushed again by the event that changed it).
The index follows one chain of states: when an event arrives whose previous
state is not the one it followed (a new engine, a restored checkpoint, a fold
the processor did not see), it stops following, and the next pass rebuilds
it from the state in one scan.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from streamkit.processors.tasks._events import LiveTask, TasksState

__all__ = ["TaskIndex"]

Entry = tuple[float, int, str]


class TaskIndex:
    """Waiting tasks by due time, and the ids an at-head pass must look at."""

    def __init__(self) -> None:
        self.state: TasksState | None = None
        """The state the index matches, or None when it must be rebuilt."""
        self._waiting: list[Entry] = []
        self._flagged: set[str] = set()

    def follow(
        self,
        previous: TasksState,
        state: TasksState,
        task_id: str | None,
        owns: Callable[[LiveTask, int], bool],
    ) -> None:
        """The event about ``task_id`` turned ``previous`` into ``state``."""
        if previous is not self.state:
            self.state = None  # lost the chain: rebuilt at the next pass
            return
        self.state = state
        if task_id is None or state is previous:
            return
        task = state.tasks.get(task_id)
        if task is not None and task is not previous.tasks.get(task_id):
            self._note(task, owns)

    def rebuild(self, state: TasksState, owns: Callable[[LiveTask, int], bool]) -> None:
        """Index every live task of ``state`` (one scan)."""
        self._waiting = []
        self._flagged = set()
        for task in state.tasks.values():
            self._note(task, owns, heap=False)
        heapq.heapify(self._waiting)
        self.state = state

    def flagged(self) -> list[str]:
        """Take the ids that need a look (a cancel, or an attempt this incarnation did not start)."""
        ids, self._flagged = sorted(self._flagged), set()
        return ids

    def waiting(self, state: TasksState) -> LiveTask | None:
        """The waiting task due first in ``state`` (stale entries dropped on the way), or None."""
        heap = self._waiting
        while heap:
            due, offset, task_id = heap[0]
            task = state.tasks.get(task_id)
            if (
                task is not None
                and task.request_offset == offset
                and task.due == due
                and not task.running
                and not task.cancel_requested
            ):
                return task
            heapq.heappop(heap)
        return None

    def taken(self) -> None:
        """The task :meth:`waiting` returned was dealt with: drop its entry."""
        heapq.heappop(self._waiting)

    def _note(
        self, task: LiveTask, owns: Callable[[LiveTask, int], bool], heap: bool = True
    ) -> None:
        if task.cancel_requested or (task.running and not owns(task, task.attempt)):
            self._flagged.add(task.task_id)
        if not task.running and not task.cancel_requested:
            entry = (task.due, task.request_offset, task.task_id)
            if heap:
                heapq.heappush(self._waiting, entry)
            else:
                self._waiting.append(entry)

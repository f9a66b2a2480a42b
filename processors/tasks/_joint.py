"""Outcomes appended in one loop turn go to the log in one append call.

The attempts a pass started often end together (quick handlers end in the
same loop turn), and each appends its outcome. One append call per outcome
pays a call's own work per outcome (the stamping, the lease, the log's
bookkeeping, a task); one call for all of them pays it once. A joint append
is all or nothing, so when the log refuses it (one outcome meets another
already written under its key, say), each outcome is appended alone and
gets the answer it would have had on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from streamkit.processors.tasks._events import TasksState

from streamkit import SPEED_TRICKS, ProcessEventArgs, StreamEvent, StreamkitError

__all__ = ["JointAppends"]

Events = Sequence[Mapping[str, Any]]
Written = list[StreamEvent] | None
Alone = Callable[[ProcessEventArgs[TasksState], Events], Awaitable[Written]]


class JointAppends:
    """Appends made in one loop turn under the same pass, joined into one call.

    ``alone`` appends one caller's events by themselves (what a caller gets
    when the joint append is refused).
    """

    __slots__ = ("_alone", "_flushing", "_turn")

    def __init__(self, alone: Alone) -> None:
        self._alone = alone
        # This loop turn's callers, by the pass whose args they append with.
        self._turn: dict[int, tuple[ProcessEventArgs[TasksState], list[_Entry]]] = {}
        self._flushing: set[asyncio.Task[None]] = set()

    async def append(self, args: ProcessEventArgs[TasksState], events: Events) -> Written:
        """Append ``events`` with the others of this loop turn; what ``alone`` would return.

        Joining is a speed trick: under ``STREAMKIT_PLAIN=1`` each caller appends alone.
        """
        if not SPEED_TRICKS:
            return await self._alone(args, events)
        loop = asyncio.get_running_loop()
        joined = self._turn.get(id(args))
        if joined is None:
            joined = self._turn[id(args)] = (args, [])
            loop.call_soon(self._flush_turn, id(args))
        future: asyncio.Future[Written] = loop.create_future()
        joined[1].append((events, future))
        return await future

    def _flush_turn(self, key: int) -> None:
        args, entries = self._turn.pop(key)
        task = asyncio.get_running_loop().create_task(self._flush(args, entries))
        self._flushing.add(task)  # a reference, so the task is not collected mid-way
        task.add_done_callback(self._flushing.discard)

    async def _flush(self, args: ProcessEventArgs[TasksState], entries: list[_Entry]) -> None:
        try:
            if len(entries) > 1 and await self._joint(args, entries):
                return
            for events, future in entries:
                try:
                    written = await self._alone(args, events)
                except Exception as exc:
                    _settle(future, exc)
                else:
                    _settle(future, written)
        except asyncio.CancelledError:
            for _, future in entries:
                future.cancel()
            raise

    @staticmethod
    async def _joint(args: ProcessEventArgs[TasksState], entries: list[_Entry]) -> bool:
        """One call for every entry; False if the log refused it (each then goes alone)."""
        try:
            written = await args.append(*(event for events, _ in entries for event in events))
        except StreamkitError:
            return False
        at = 0
        for events, future in entries:
            _settle(future, written[at : at + len(events)])
            at += len(events)
        return True


_Entry = tuple[Events, "asyncio.Future[Written]"]


def _settle(future: asyncio.Future[Written], outcome: Written | Exception) -> None:
    if future.done():  # its caller was cancelled (a stop): nobody waits for it
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)

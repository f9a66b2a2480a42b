"""The one claim a processor engine holds: "revive me by T", from background work and wakeups.

A claim is the earliest of two deadlines:

- the background deadline, while any ``run_in_background`` attempt is in
  flight: ``REVIVE_AFTER`` seconds after an attempt started that no standing
  deadline covered (or, after a revive that found work still running, the
  doubled delay). An attempt that starts while the deadline is still ahead
  is covered by it (a revive by then is as soon as it needs, or sooner) and
  moves nothing;
- the wakeup: the earliest ``schedule_wakeup(at)`` asked since the latest
  at-head pass began (each at-head pass starts again from none).

A claim is written when that earliest deadline moves, with one exception
that saves a write per attempt: when the last attempt settles and nothing
else is owed, the background claim is left standing instead of released.
Its revive finds nothing owed and releases it then (a wakeup asked before
that replaces it at once). So a stream of short attempts costs one claim
and one idle revive per ``REVIVE_AFTER`` seconds, not a claim and a
release each. Claims reach the stream one at a time, in order, so a
release never overtakes the claim before it. A failing claim is reported
and forgotten, so the next change sends it again.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

from streamkit.engine._strays import Strays
from streamkit.errors import InvalidRequest
from streamkit.events import StreamEvent
from streamkit.processor import USER_EXITS, Work, exit_refused
from streamkit.protocols import Clock, ProcessorStream

__all__ = ["REVIVE_AFTER", "REVIVE_AFTER_MAX", "ClaimKeeper"]

REVIVE_AFTER = 20.0
"""Seconds after a background attempt starts by which a dead host's processor is revived."""

REVIVE_AFTER_MAX = 30 * 60.0
"""The ceiling of the doubling delay claimed by a revive that finds work still in flight."""

_UNKNOWN = object()  # what the stream holds is not known: nothing sent yet, or a claim failed

Report = Callable[[str, BaseException, "StreamEvent | None"], None]


class ClaimKeeper:
    """Background attempts, wakeups, and the claim they add up to, for one engine."""

    def __init__(
        self, stream: ProcessorStream, clock: Clock, report: Report, strays: Strays
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._report = report
        self._strays = strays
        self._in_flight = 0
        self._revives_while_busy = 0
        self._background_deadline: float | None = None
        self._attempts: dict[asyncio.Task[None], str] = {}
        """Each attempt in flight, with what it is (for a stray's name)."""
        self._wakeup_at: float | None = None
        self._claimed: object = _UNKNOWN
        self._last_sent: asyncio.Task[None] | None = None
        self._stopped = False
        self._closing = False

    @property
    def in_flight(self) -> int:
        """Background attempts started and not yet settled."""
        return self._in_flight

    @property
    def wanted(self) -> float | None:
        """The claim this engine wants: the earliest deadline of what is owed, or None."""
        background = self._background_deadline if self._in_flight else None
        return _earliest(background, self._wakeup_at)

    @property
    def held(self) -> float | None:
        """The claim last sent (standing or not), or None: what the stream holds once it landed."""
        claimed = self._claimed
        return claimed if isinstance(claimed, float) else None

    @property
    def last_sent(self) -> asyncio.Task[None] | None:
        """The latest claim sent to the stream (a task that never raises)."""
        return self._last_sent

    # -- background work -------------------------------------------------------------

    def start(self, during: StreamEvent | None, work: Work) -> None:
        """Start one attempt; unless a standing deadline covers it, claim ``now + REVIVE_AFTER``.

        Refused once the engine is closing: an attempt started then would
        outlive the engine, neither awaited nor cancelled by the close.
        """
        if self._closing:
            raise InvalidRequest(
                "run_in_background was called while the engine is closing; nothing was "
                "started (whatever the state says is owed is started by the next at-head pass "
                "of whoever runs the processor next)",
                details={"offset": None if during is None else during.offset},
            )
        self._in_flight += 1
        now = self._clock()
        latest = now + REVIVE_AFTER
        deadline = self._background_deadline
        # Covered: a deadline still ahead, and no later than this attempt needs.
        if deadline is None or deadline <= now or deadline > latest:
            self._background_deadline = latest
        # Writes nothing when the stored claim stands already; resends one that failed.
        self.sync()
        label = _label(work, during)
        task = asyncio.get_running_loop().create_task(self._attempt(during, work), name=label)
        self._attempts[task] = label
        task.add_done_callback(self._forget)

    async def _attempt(self, during: StreamEvent | None, work: Work) -> None:
        try:
            result = work()
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            # Abandoned (the host is stopping): the claim stays, so the next
            # host revives the processor and restarts what state says is owed.
            self._in_flight -= 1
            raise
        except Exception as exc:
            self._report("processor.background_failed", exc, during)
        except USER_EXITS as exc:
            failure = exit_refused(exc, "run_in_background work")
            self._report("processor.background_failed", failure, during)
        self._in_flight -= 1
        if self._in_flight == 0:
            self._revives_while_busy = 0
            # Claims what the wakeups want now, if they moved while this ran; a
            # release alone waits for the revive (see _standing).
            self.sync()

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._attempts.pop(task, None)

    def revived(self) -> None:
        """A revive ran: work still in flight claims again, the delay doubled (capped).

        With nothing in flight the background deadline is spent; the caller
        then sends the claim the wakeups alone want (a release, if none).
        """
        if self._in_flight:
            self._revives_while_busy += 1
            delay = min(REVIVE_AFTER * 2**self._revives_while_busy, REVIVE_AFTER_MAX)
            self._background_deadline = self._clock() + delay
        else:
            self._background_deadline = None

    async def abandon(self, grace: float) -> None:
        """Give attempts ``grace`` seconds, cancel the rest, and wait for queued claims.

        From here on no attempt starts (see :meth:`start`).
        """
        self._closing = True
        if self._attempts:
            attempts = dict(self._attempts)
            pending: set[asyncio.Task[None]] = set(attempts)
            if grace > 0:
                _, pending = await asyncio.wait(pending, timeout=grace)
            for task in pending:
                task.cancel()
            # An attempt that ignores its cancel is a stray: counted, not awaited.
            await self._strays.wait_out((task, attempts[task]) for task in pending)
        if self._last_sent is not None:
            await asyncio.wait((self._last_sent,))

    def cancel_all(self) -> None:
        """The engine was aborted: cancel every attempt and send no claim from now on.

        The claim stored stays as it is, so whichever host runs the processor
        next is revived by it; this engine no longer speaks for the processor.
        """
        self._stopped = True
        for task, label in list(self._attempts.items()):
            task.cancel()
            self._strays.watch(task, label)

    # -- wakeups ---------------------------------------------------------------------

    def forget_wakeups(self) -> None:
        """An at-head pass begins: wakeups are derived again from none."""
        self._wakeup_at = None

    def wake_at(self, at: float) -> None:
        """Record a wakeup request (``args.schedule_wakeup``)."""
        if isinstance(at, bool) or not isinstance(at, int | float) or at != at:
            raise InvalidRequest(
                f"schedule_wakeup needs epoch seconds as a number, got {at!r}; no wakeup was "
                "scheduled",
                details={"at": repr(at)[:200]},
            )
        at = float(at)
        if self._wakeup_at is None or at < self._wakeup_at:
            self._wakeup_at = at
            self.sync()

    # -- the claim -------------------------------------------------------------------

    def sync(self, *, force: bool = False) -> asyncio.Task[None] | None:
        """Send the wanted claim if it changed (or ``force``); return the task sending it."""
        wanted = self.wanted
        if self._stopped or (not force and (wanted == self._claimed or self._standing(wanted))):
            return None
        self._claimed = wanted
        task = asyncio.get_running_loop().create_task(self._send(self._last_sent, wanted))
        self._last_sent = task
        return task

    def _standing(self, wanted: float | None) -> bool:
        """Whether a release may wait: nothing is owed and the claim stored is a background one still ahead.

        Its revive releases it, so the attempt that settled writes nothing.
        """
        deadline = self._background_deadline
        return (
            wanted is None
            and deadline is not None
            and self._claimed == deadline
            and deadline > self._clock()
        )

    async def _send(self, previous: asyncio.Task[None] | None, at: float | None) -> None:
        if previous is not None and not previous.done():
            await asyncio.wait((previous,))
        try:
            await self._stream.claim(at)
        except Exception as exc:
            self._claimed = _UNKNOWN
            self._report("processor.claim_failed", exc, None)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a < b else b


def _label(work: Work, during: StreamEvent | None) -> str:
    """What a background attempt is, for people: its function and the event that started it."""
    name = getattr(work, "__qualname__", None) or type(work).__name__
    where = "the at-head pass" if during is None else f"offset {during.offset}"
    return f"run_in_background {name} (from {where})"

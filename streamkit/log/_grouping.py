"""How a log gathers writes into group commits, and lets processors' writes ride clients'.

Appends that become ready in one event-loop turn are handed to the backend
together, at the end of the turn, and commit as one group; when nothing else
is ready to run on the loop, a lone append commits at once, inline
(:meth:`CommitGrouping.commits_now`). While clients contend with processors
for the loop (:meth:`CommitGrouping.clients_contend`, the one rule by which a
host favours its clients), a processor's write waits up to
:data:`HOLD_SECONDS` for a client's append and commits with it. A job
registered here is never lost: a close hands every pending job to the
backend first.

This module is the one reader of asyncio's ready queue in streamkit
(:func:`_ready_work`).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from streamkit._requests import AppendCall, TransactionJob
from streamkit.errors import LogClosed
from streamkit.protocols import LogBackend

__all__ = ["HOLD_SECONDS", "CommitGrouping"]

HOLD_SECONDS = 0.001
"""How long a processor's write waits, while clients contend, for a client's commit to ride."""


def fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail ``future`` with ``exc`` unless it is done (for ``call_soon_threadsafe``)."""
    if not future.done():
        future.set_exception(exc)


def _ready_work(loop: asyncio.AbstractEventLoop) -> bool | None:
    """Whether other work waits to run on ``loop``: a ready callback, or a timer come due.

    None where the loop keeps no such queue (uvloop, say): then nobody can
    tell, and each caller picks its safe answer. A timer that came due is
    work too: a caller that never gives the loop a turn (appends that all
    commit inline) would otherwise keep every timer from firing.
    """
    ready = getattr(loop, "_ready", None)
    if type(ready) is not collections.deque:
        return None
    if ready:
        return True
    scheduled = getattr(loop, "_scheduled", None)
    if not scheduled:
        return False
    when = getattr(scheduled[0], "_when", None)
    return when is not None and when <= loop.time()


class CommitGrouping:
    """The appends a :class:`~streamkit.log.Log` hands to its backend, grouped (see the module).

    ``inline_commits`` says whether groups may commit on the loop (the
    backend still declines when it cannot); without it every job goes
    straight to the backend's thread.
    """

    def __init__(self, backend: LogBackend, inline_commits: bool) -> None:
        self._backend = backend
        self._inline_commits = inline_commits
        self._pending: list[AppendCall | TransactionJob] = []
        # When _pending is handed over: at the end of this loop turn, or (while it
        # holds processors' writes only) after HOLD_SECONDS, unless a client comes first.
        self._handover: asyncio.Handle | None = None
        self._handover_soon = False
        # Clients' appends handed over and not yet settled, each with its call.
        self._client_commits: dict[asyncio.Future[Any], AppendCall] = {}
        self.client_handovers = 0
        """Clients' appends that could not commit at once (each was in flight for a while)."""
        self.held_writes = 0
        """Processors' writes that waited for a client's commit (see :meth:`enqueue`)."""

    def client_waits(self, future: asyncio.Future[Any], call: AppendCall) -> None:
        """A client's append did not commit at once: it is in flight until ``future`` settles
        (or until ``call`` holds its committed events)."""
        self.client_handovers += 1
        self._client_commits[future] = call
        future.add_done_callback(self._client_settled)

    def _client_settled(self, future: asyncio.Future[Any]) -> None:
        """A client's append settled: writes held for a client's commit go now if none is left.

        A processor may read a client's event (a catch-up reads the log) and
        write its checkpoint before the client's future is settled; that write
        is held for a commit to share, and the client may well wait for it
        (its event processed). Once no client commit is in flight there is
        none to share: holding longer would only delay everyone.
        """
        self._client_commits.pop(future, None)
        if self._pending and self._handover is not None and not self._commit_to_share():
            self._hand_over_soon(future.get_loop())

    def clients_contend(self) -> bool:
        """Whether clients compete with processors for this log now: the one rule.

        True while a client's append waits for its commit: handed to the
        writer (queued, grouped or committing) and not yet settled. A client
        is any caller appending without a lease's fence: not a processor of
        a host. An append that commits at once, on an idle loop, never counts.

        Only then does a processor's write wait briefly to share a client's
        commit, and only then does a host pause its processors between
        ranges (``HostConfig.processor_share``), so that a producer on the same
        loop is not starved by the work its own events cause. A client that
        appends and then waits for its event to be processed has no append in
        flight while it waits, so nothing is ever held back on its behalf
        that it then waits for. Measured: with one producer flooding durable
        tasks through a host, it keeps 55-65% of its idle enqueue rate; at a
        steady 200 tasks/s a task starts about 1 ms after its request.
        """
        # A settled future stays in the map until its done-callback runs, a turn later;
        # a processor woken by that same commit may ask in between.
        return any(not future.done() for future in self._client_commits)

    def _commit_to_share(self) -> bool:
        """Whether a client's commit is still to be made, for a held write to ride.

        Narrower than :meth:`clients_contend`: a commit the writer made is done
        with, whether or not its future is settled yet. A processor may have read
        its events already (a catch-up reads the log), and its checkpoint must not
        wait for a commit that will not come; the client may be waiting for it.
        """
        return any(
            not future.done() and not call.fresh for future, call in self._client_commits.items()
        )

    def holds(self) -> bool:
        """Whether a processor's write made now waits for a client's commit (see :meth:`enqueue`).

        Only where this log groups commits on the loop (a backend that groups
        them on its own thread, PostgreSQL, holds nothing), and only while a
        client's commit is still to be made (:meth:`_commit_to_share`).
        """
        return self._inline_commits and self._commit_to_share()

    def commits_now(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The one decision to commit on the loop, now, rather than hand over to the backend.

        Only when inline commits are on, no appends of this turn are waiting
        to be grouped, and nothing else is ready to run on ``loop``: then no
        peer can join the group before the turn ends, and holding the loop
        for the commit delays nobody. The backend still declines (its
        ``try_inline``) when it is busy or another process holds the lock.

        "Nothing else is ready" is read from the ready queue of asyncio's own
        loops (:func:`_ready_work`; measured: committing on an idle loop saves
        the two thread hand-offs, more than the commit itself on a fast disk).
        A loop without one (uvloop, say) is answered no: every commit then
        takes the writer thread, with the same outcomes.
        """
        if not self._inline_commits or self._pending:
            return False
        return _ready_work(loop) is False

    def pending_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether appends of this turn of ``loop`` wait to be handed over (a job may join them)."""
        return bool(self._pending) and self._pending[0].loop is loop

    def hand(
        self, job: AppendCall | TransactionJob, *, processor: bool
    ) -> asyncio.Future[Any] | None:
        """The one decision of where a write goes; None if it committed on the loop, now.

        Then its outcome is on ``job`` (no future is made). Else it is handed
        on and the future that settles with its outcome comes back. It goes:

        - held for a client's commit to ride, if it is a ``processor``'s write
          (a fenced append, a checkpoint) made while a client's commit is still
          to be made (:meth:`holds`, :meth:`enqueue`);
        - into this turn's group, handed over at the end of the turn: an
          append always (it opens the group if none is forming: its peers of
          this turn share one commit, run inline if the writer is idle and the
          loop has nothing else to run, else on the writer thread, whose fsync
          then overlaps the loop's other work); a short transaction only to
          join appends already forming one;
        - else straight to the writer thread: a transaction that is not short
          (the caller's function may take long), a short one with no group to
          join, and every write where inline commits are off.

        It commits now, inline, only when :meth:`commits_now` says so and the
        backend does not decline: nothing else is ready on the loop, so no
        peer could join before the turn ends and its caller never gives up
        the loop. A job is registered before this returns, so a close that
        follows still commits it.
        """
        loop = job.loop
        short = not isinstance(job, TransactionJob) or job.short
        hold = short and processor and self.holds()
        if short and not hold and self.commits_now(loop):
            if self._backend.try_inline([job]):
                return None
        elif hold or (
            short
            and self._inline_commits
            and (isinstance(job, AppendCall) or self.pending_on(loop))
        ):
            future = job.future = loop.create_future() if job.future is None else job.future
            self.enqueue(job, hold=hold)
            return future
        future = job.future = loop.create_future() if job.future is None else job.future
        self._backend.submit(job)
        return future

    def enqueue(self, job: AppendCall | TransactionJob, *, hold: bool) -> None:
        """Add ``job`` to this turn's group; ``hold``: a processor's write, which may wait.

        A processor's write made while clients append waits up to
        :data:`HOLD_SECONDS` for a client's append, whose hand-over takes it
        along: one commit for both, where there would be two, each the other's
        wait (measured: 1.3 to 1.6 commits per durable task, 1.0 with it).
        Nothing waits on the loop meanwhile; the writer is merely not asked yet.
        """
        if self._pending and self._pending[0].loop is not job.loop:
            self._backend.submit(job)
            return
        self._pending.append(job)
        if not hold:
            self._hand_over_soon(job.loop)
            return
        self.held_writes += 1
        if self._handover is None:
            self._handover = job.loop.call_later(HOLD_SECONDS, self._hand_over)

    def _hand_over_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._handover_soon:
            return
        if self._handover is not None:
            self._handover.cancel()  # the timer of held writes: they go now, with this one
        self._handover = loop.call_soon(self._hand_over)
        self._handover_soon = True

    def queue_pending(self) -> None:
        """Appends registered but not yet handed over go to the writer's queue (before a close)."""
        if self._handover is not None:
            self._handover.cancel()
            self._handover = None
            self._handover_soon = False
        jobs, self._pending = self._pending, []
        for job in jobs:
            try:
                self._backend.submit(job)
            except LogClosed as exc:  # closed already: it fails like any late call
                if job.future is not None and not job.future.done():
                    job.loop.call_soon_threadsafe(fail, job.future, exc)

    def _hand_over(self) -> None:
        self._handover = None
        self._handover_soon = False
        jobs, self._pending = self._pending, []
        if not jobs:  # a close queued them already
            return
        try:
            # Inline only when the loop has nothing else to run: otherwise the thread's
            # fsync overlaps that work instead of holding it up.
            if self.commits_now(jobs[0].loop) and self._backend.try_inline(jobs):
                return
            for job in jobs:
                self._backend.submit(job)
        except LogClosed as exc:
            for job in jobs:
                if job.future is not None and not job.future.done():
                    job.future.set_exception(exc)

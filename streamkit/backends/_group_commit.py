"""The group commit every backend's writer runs: attempts, undo, counters, settling, pushes.

A writer takes the write calls queued together and hands them to one
:class:`GroupCommit`, which runs them as ONE group through the backend's
:class:`GroupStatements` (the SQL of one backend: how a group is placed and
committed). What is the same for every backend lives here, once:

- an attempt that raises wrote nothing: the cached path states and the
  counters are put back, every call's outcome is cleared, and the backend
  says whether to run the group again (another process's lock waited out,
  a serialization failure the server asks to retry) or fail it;
- a failed group gives every call its error (and every short transaction
  riding it); a call refused in its own savepoint (:func:`refuse`) keeps
  the error as its outcome and adds no event; a refusal counts once per call;
- the finished calls are settled together (one hand-off per event loop);
- the new events of a committed group are pushed to the followers, one push
  per path, proving the range from the position the group started after.

State that lives one group long (whether anyone follows, where each path's
push starts, the stamp, whether the commit is in flight) is a
:class:`Group` value passed down, never a field of the long-lived writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from streamkit._requests import AppendCall, TransactionJob, WriteCall
from streamkit.backends._settling import Settling
from streamkit.errors import StorageError, StreamkitError
from streamkit.events import StreamEvent
from streamkit.log import Feed, Push
from streamkit.protocols import LogStats

__all__ = ["Group", "GroupCommit", "GroupStatements", "WriteCounters", "fresh_by_path", "refuse"]


@dataclass(slots=True)
class WriteCounters:
    """What one writer has done (its share of ``LogStats``); a failed group puts them back."""

    transactions: int = 0
    appended: int = 0
    ephemeral: int = 0
    ephemeral_reservations: int = 0
    refused: int = 0

    def placed(self, call: AppendCall, rows: int, reserved: int) -> None:
        """``call`` was placed: ``rows`` durable rows, its ephemerals with ``reserved`` blocks."""
        self.appended += rows
        if call.ephemerals:
            self.ephemeral += call.ephemerals
            self.ephemeral_reservations += reserved

    def stats(self) -> LogStats:
        """The counters now, as the log reports them."""
        return LogStats(
            transactions=self.transactions,
            appended=self.appended,
            ephemeral=self.ephemeral,
            ephemeral_reservations=self.ephemeral_reservations,
            refused=self.refused,
        )

    def saved(self) -> tuple[int, int, int, int, int]:
        """The counters now, for :meth:`restore` if what follows fails."""
        return (
            self.transactions,
            self.appended,
            self.ephemeral,
            self.ephemeral_reservations,
            self.refused,
        )

    def restore(self, saved: tuple[int, int, int, int, int]) -> None:
        """Put the counters back as :meth:`saved` read them."""
        (
            self.transactions,
            self.appended,
            self.ephemeral,
            self.ephemeral_reservations,
            self.refused,
        ) = saved


class Group:
    """One group commit in progress (see the module docstring); fresh for each attempt's use.

    ``following``: whether anyone followed when the group began (a follower
    that subscribes meanwhile starts from the head after it). ``starts``:
    per path, the position its push starts after (the head before the group;
    absent, the position before its first new event). ``inline``: the group
    runs on a caller's event loop and must never wait for a lock.
    ``committing``: the commit was sent, so a broken connection leaves its
    outcome unknown. ``first_failed_at``: when (monotonic) an attempt first
    failed, for a backend that waits for a lock only so long.
    """

    __slots__ = (
        "calls",
        "committing",
        "first_failed_at",
        "following",
        "inline",
        "now",
        "starts",
        "transactions",
    )

    def __init__(
        self,
        calls: Sequence[WriteCall],
        transactions: Sequence[TransactionJob],
        following: bool,
        inline: bool = False,
    ) -> None:
        # A plain class, not a dataclass: one is made per commit, and a dataclass
        # with a default factory costs a call more to build.
        self.calls = calls
        self.transactions = transactions
        self.following = following
        self.inline = inline
        self.starts: dict[str, int] = {}
        self.now = ""
        self.committing = False
        self.first_failed_at: float | None = None


class GroupStatements(Protocol):
    """What one backend does inside the shared group commit (its SQL and its caches)."""

    def saved(self, calls: Sequence[WriteCall]) -> object:
        """What of the cached path state a failed attempt of ``calls`` must put back."""
        ...

    def attempt(self, group: Group) -> None:
        """Place and commit the group once; raise (having written nothing) if it cannot."""
        ...

    def undo(self, saved: object) -> None:
        """After a failed attempt: put the cached path state back (:meth:`saved`)."""
        ...

    def again(self, exc: Exception, attempt: int, group: Group) -> bool:
        """Whether to run the group again after its ``attempt``-th failure (it may wait first)."""
        ...

    def call_error(self, exc: Exception, call: WriteCall, group: Group) -> BaseException:
        """The error a call of a failed group gets."""
        ...

    def transaction_error(self, exc: BaseException) -> BaseException:
        """The error a caller's transaction function (or a group it rode) gets."""
        ...

    def forget(self) -> None:
        """Trust nothing cached about the storage (a caller's function may have touched it)."""
        ...

    def pushed(self, path: str, durable_through: int | None) -> None:
        """A push of ``path`` was published, through ``durable_through`` if it held a durable."""
        ...

    def unfollowed(self) -> None:
        """A group committed while nobody followed: no path is published through its head now."""
        ...


class GroupCommit:
    """Runs the groups of one writer through its backend's statements (see the module)."""

    def __init__(
        self,
        statements: GroupStatements,
        feed: Feed,
        counters: WriteCounters,
        settling: Settling,
    ) -> None:
        self._statements = statements
        self._feed = feed
        self._counters = counters
        self._settling = settling

    def run(
        self,
        calls: Sequence[WriteCall],
        transactions: Sequence[TransactionJob] = (),
        *,
        inline: bool = False,
    ) -> None:
        """Commit ``calls`` and ``transactions`` as one group (each refusable one alone).

        A short transaction's function runs after the calls, in a savepoint
        of its own: one that raises rolls back alone and gets its error, the
        rest commit. A failure of the whole group fails every job in it.
        """
        statements = self._statements
        counters = self._counters
        before = counters.saved()
        saved = statements.saved(calls)
        # One look at the followers per group: a follower that subscribes while the
        # group runs starts from the head after it, so it misses nothing.
        group = Group(calls, transactions, self._feed.has_subscribers(), inline)
        attempt = 0
        while True:
            try:
                statements.attempt(group)
                break
            except Exception as exc:
                statements.undo(saved)
                counters.restore(before)
                for call in calls:
                    call.error = call.result = None
                    if isinstance(call, AppendCall):
                        call.fresh = ()
                for job in transactions:
                    job.error = job.result = None
                attempt += 1
                if statements.again(exc, attempt, group):
                    group.starts = {}
                    group.committing = False
                    continue  # nothing was written: the same group, from the start
                for call in calls:
                    call.error = statements.call_error(exc, call, group)
                if isinstance(exc, StreamkitError) and not isinstance(exc, StorageError):
                    counters.refused += len(calls)
                for job in transactions:
                    job.error = statements.transaction_error(exc)
                break
        settling = self._settling
        if calls and (calls[0].future is not None or len(calls) > 1):
            settling.add_all(calls)  # (a lone call without a future is read off by its caller)
        if transactions:
            settling.add_all(transactions)
            statements.forget()  # their functions may have touched any table
        if group.following:
            self._push(group)
        else:
            statements.unfollowed()

    def _push(self, group: Group) -> None:
        """Publish a group's new events: one push per path, from where the group started."""
        published: list[tuple[str, Push]] = []
        starts = group.starts
        for path, (events, size) in fresh_by_path(group.calls).items():
            start = starts.get(path)
            if start is None:
                # The group held the path (or drew from its own block), so nothing of
                # anyone else's lies between its first offset and its last.
                start = events[0].offset - 1
            published.append((path, Push(start, events[-1].offset, events, size)))
            durable = [event.offset for event in events if not event.ephemeral]
            self._statements.pushed(path, durable[-1] if durable else None)
        if published:
            self._feed.publish(published, self._settling.wakes)


def refuse(call: WriteCall, exc: StreamkitError, counters: WriteCounters) -> bool:
    """``call`` was refused and its savepoint rolled back: ``exc`` is its outcome; False.

    A storage failure is not the call's fault and is not counted as a refusal.
    The caller has put back what the call changed in its cached path state.
    """
    call.error = exc
    call.result = None
    if isinstance(call, AppendCall):
        call.fresh = ()
    if not isinstance(exc, StorageError):
        counters.refused += 1
    return False


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

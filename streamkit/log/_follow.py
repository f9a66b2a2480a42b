"""Live delivery of a log's events to followers: pushes, subscriptions and the follow iterator.

The writer thread publishes a :class:`Push` per stream path for every group it
commits (this process's appends, ephemerals included) and for every batch of
rows other processes committed (found by polling ``PRAGMA data_version``). A
push carries a proof like a read does: the log holds exactly its durable
events in ``(after, through]``. Pushes of one path need not be contiguous with
each other; the iterator makes what it yields contiguous:

- a push that ends at or below the iterator's position is skipped, one that
  overlaps it is trimmed;
- a push that starts above the position is preceded by a *gap repair*, a read
  of the log bounded by the push's start;
- pushes that wait end to end are yielded as one, up to a page of events, so
  a consumer behind by many small commits takes them in one batch;
- the first catch-up (and the catch-up after an overflow) reads the log without
  a bound but is cut at the start of the earliest push it could overtake, or of
  the commit in flight (see :meth:`Feed.set_inflight`), so that a push holding
  an ephemeral is never skipped because a read already went past its offset.

A subscription's buffer is bounded in events, pushes and bytes (the events'
stored JSON; one push always fits): on overflow the buffered pushes are dropped
and the iterator re-reads the log, so durable events are never lost and memory
stays bounded; only ephemerals in the dropped pushes are gone, by design.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamkit._requests import PageRead
from streamkit.errors import LogClosed
from streamkit.events import ReadPage, ScannedRange, StreamEvent

__all__ = ["MAX_BUFFERED_BYTES", "Feed", "Follow", "Push", "PushMailbox", "WakeList"]

WakeList = dict[asyncio.AbstractEventLoop, list[asyncio.Event]]

PAGE_LIMIT = 500
MAX_BUFFERED_EVENTS = 10_000
MAX_BUFFERED_PUSHES = 1_000
MAX_BUFFERED_BYTES = 4 * 1024 * 1024
"""The stored JSON one follower may hold unread (by default) before it re-reads the log."""


@dataclass(frozen=True, slots=True)
class Push:
    """Events of one path with the proof that the log holds exactly its durables in ``(after, through]``."""

    after: int
    through: int
    events: Sequence[StreamEvent]
    size: int = 0
    """The payload and metadata JSON its events were stored or appended with, in bytes."""


class PushMailbox:
    """One follower's mailbox; every field is guarded by the feed's lock."""

    __slots__ = (
        "buffer",
        "buffered_bytes",
        "buffered_events",
        "closed",
        "overflows",
        "path",
        "resync",
        "waiter",
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self.buffer: deque[Push] = deque()
        self.buffered_events = 0
        self.buffered_bytes = 0
        self.resync = False
        self.closed = False
        self.overflows = 0
        self.waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None


class Feed:
    """The subscriptions of one log, shared by the writer thread and the event loops."""

    def __init__(self, max_bytes: int = MAX_BUFFERED_BYTES) -> None:
        self.lock = threading.Lock()
        self._subs: dict[str, list[PushMailbox]] = {}
        self._inflight: dict[str, int] = {}
        self._closed = False
        self._max_events = MAX_BUFFERED_EVENTS
        self._max_pushes = MAX_BUFFERED_PUSHES
        self._max_bytes = max_bytes

    def has_subscribers(self) -> bool:
        """Whether anyone follows (read without the lock: a stale answer costs one poll)."""
        return bool(self._subs)

    def followed_paths(self) -> list[str]:
        """The paths that have at least one follower."""
        with self.lock:
            return list(self._subs)

    def register(self, path: str) -> PushMailbox:
        """Add a follower of ``path``; it starts out needing a catch-up read."""
        sub = PushMailbox(path)
        with self.lock:
            if self._closed:
                raise LogClosed("the log is closed; open it again to follow a stream")
            self._subs.setdefault(path, []).append(sub)
        return sub

    def unregister(self, sub: PushMailbox) -> None:
        """Remove a follower (idempotent) and release its buffered pushes."""
        with self.lock:
            subs = self._subs.get(sub.path)
            if subs is not None and sub in subs:
                subs.remove(sub)
                if not subs:
                    del self._subs[sub.path]
            sub.buffer.clear()
            sub.buffered_events = 0
            sub.buffered_bytes = 0
            sub.waiter = None

    def set_inflight(self, positions: dict[str, int]) -> None:
        """Mark commits about to become visible: readers must not run past these positions.

        Called by the writer just before ``COMMIT``: a catch-up read that sees the
        commit's rows before its push is published stops at the commit's start.
        """
        if not self._subs:  # read without the lock: a follower subscribing now starts after this
            return
        with self.lock:
            for path, after in positions.items():
                if path in self._subs:
                    self._inflight[path] = after

    def clear_inflight(self, paths: Sequence[str] | set[str]) -> None:
        """Forget in-flight marks of a commit that failed."""
        with self.lock:
            for path in paths:
                self._inflight.pop(path, None)

    def publish(self, pushes: Sequence[tuple[str, Push]], wakes: WakeList) -> None:
        """Append each push to its path's subscribers; collect the waiters to wake in ``wakes``."""
        with self.lock:
            for path, push in pushes:
                self._inflight.pop(path, None)
                self._deliver(path, push, wakes)

    def publish_read(self, pushes: Sequence[tuple[str, Push]], wakes: WakeList) -> dict[str, int]:
        """Publish pushes made from reads of the log; return through where each path went out.

        For a backend whose reads of other processes' commits run beside its
        own commits (on another thread): a read may already see the rows of
        this process's commit in flight, whose push (with its ephemerals) is
        not published yet. Such a push is cut at the commit's start, as a
        follower's own catch-up read is, so it never overtakes that push; the
        caller reads the rest again later.
        """
        published: dict[str, int] = {}
        with self.lock:
            for path, push in pushes:
                bound = self._inflight.get(path)
                if bound is not None and push.through > bound:
                    through = max(push.after, bound)
                    if through <= push.after:
                        continue
                    events = [event for event in push.events if event.offset <= through]
                    push = Push(push.after, through, events, push.size)
                published[path] = push.through
                self._deliver(path, push, wakes)
        return published

    def _deliver(self, path: str, push: Push, wakes: WakeList) -> None:
        """Offer ``push`` to each subscriber of ``path`` (under the lock); collect who to wake."""
        for sub in self._subs.get(path, ()):
            self._offer(sub, push)
            if sub.waiter is not None:
                loop, event = sub.waiter
                sub.waiter = None
                wakes.setdefault(loop, []).append(event)

    def _offer(self, sub: PushMailbox, push: Push) -> None:
        if (
            sub.buffered_events + len(push.events) > self._max_events
            or len(sub.buffer) >= self._max_pushes
            or (sub.buffer and sub.buffered_bytes + push.size > self._max_bytes)
        ):
            # A slow consumer: drop what it has not taken and let it re-read the log.
            sub.buffer.clear()
            sub.buffered_events = 0
            sub.buffered_bytes = 0
            sub.resync = True
            sub.overflows += 1
        sub.buffer.append(push)
        sub.buffered_events += len(push.events)
        sub.buffered_bytes += push.size

    def close_all(self) -> WakeList:
        """End every follower; return the waiters to wake (each iterator then stops)."""
        wakes: WakeList = {}
        with self.lock:
            self._closed = True
            for subs in self._subs.values():
                for sub in subs:
                    sub.closed = True
                    sub.buffer.clear()
                    if sub.waiter is not None:
                        loop, event = sub.waiter
                        sub.waiter = None
                        wakes.setdefault(loop, []).append(event)
            self._subs.clear()
            self._inflight.clear()
        return wakes

    def take(self, sub: PushMailbox, local: deque[Push]) -> tuple[bool, bool, int | None]:
        """Move ``sub``'s pushes into the empty ``local`` queue.

        Returns ``(closed, resync, bound)``: whether the log closed, whether the
        iterator must re-read the log, and the lowest position a push or an
        in-flight commit starts at (a catch-up read must not pass it).
        """
        with self.lock:
            resync = False
            if not local:
                if sub.resync:
                    resync = True
                    sub.resync = False
                local.extend(sub.buffer)
                sub.buffer.clear()
                sub.buffered_events = 0
                sub.buffered_bytes = 0
            bound = self._inflight.get(sub.path)
            for queued in (local, sub.buffer):
                if queued and (bound is None or queued[0].after < bound):
                    bound = queued[0].after
            return sub.closed, resync, bound

    def wait_on(
        self, sub: PushMailbox, loop: asyncio.AbstractEventLoop, event: asyncio.Event
    ) -> bool:
        """Register ``event`` to be set on the next push; False if there is something already."""
        with self.lock:
            if sub.closed or sub.buffer or sub.resync:
                return False
            event.clear()
            sub.waiter = (loop, event)
            return True


def wake(wakes: WakeList) -> None:
    """Set the collected events, one ``call_soon_threadsafe`` per loop."""
    for loop, events in wakes.items():
        # A closed loop raises: nobody is waiting on it any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_set_all, events)


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()


ReadFn = Callable[[PageRead], Awaitable[tuple[ReadPage, int]]]
"""Reads a page and says how many bytes of stored JSON it holds."""


class Follow:
    """The iterator :meth:`streamkit.log.Stream.follow` returns.

    Its subscription exists from the moment it is created, so nothing appended
    after ``follow()`` returns can be missed. Dropping the iterator (breaking
    out of ``async for``) or calling :meth:`aclose` unregisters it; closing the
    log ends it with ``StopAsyncIteration``. Cancelling a pending ``__anext__``
    loses nothing: the next call picks up where the last yield ended.
    """

    def __init__(
        self,
        feed: Feed,
        path: str,
        after_offset: int,
        read: ReadFn,
        request_init: Callable[[str], Any],
    ) -> None:
        self._feed = feed
        self._path = path
        self._read = read
        self._sub = feed.register(path)
        self._unregister = weakref.finalize(self, feed.unregister, self._sub)
        self._position = after_offset
        self._yielded = after_offset
        self._pushes: deque[Push] = deque()
        self._catching_up = True
        self._done = False
        self._woken = False
        self._at_head = False
        self._event = asyncio.Event()
        self._size = 0
        try:
            request_init(path)
        except BaseException:
            self._unregister()
            raise

    def __aiter__(self) -> Follow:
        return self

    @property
    def last_size(self) -> int:
        """The stored JSON (payload and metadata) of the events the latest yield came from.

        What holding them costs, for a consumer that queues what it is given
        and must bound that by bytes.
        """
        return self._size

    @property
    def at_head(self) -> bool:
        """Whether nothing more was known to follow the latest yield when it was made.

        True after a push with no other push buffered behind it, or after a
        read that reached the log's head; False after a read cut short (a
        page of a long catch-up, a gap repair). What a consumer that batches
        needs to know to tell the end of a backlog from a stretch of it.
        """
        return self._at_head

    @property
    def pending(self) -> int:
        """Pushes taken or buffered but not yet yielded (a gauge: read without the lock)."""
        return len(self._pushes) + len(self._sub.buffer)

    def skip_to(self, offset: int) -> None:
        """Treat everything through ``offset`` as yielded: the next yield starts there.

        For a consumer that read up to ``offset`` from the log itself (a
        catch-up of its own) while this follower kept its place: pushes at
        or below ``offset`` are dropped, the rest continue from it.
        """
        if offset > self._position:
            self._position = offset
            self._yielded = offset

    def wake(self) -> None:
        """Make a pending (or the next) :meth:`next_or_woken` return ``None`` at once."""
        self._woken = True
        self._event.set()

    async def ready_or_woken(self) -> None:
        """Return once a yield is ready, :meth:`wake` was called or the follower ended; take nothing.

        For a consumer that decides, once there is something to take, whether
        to take it now or let more gather first (a host's pacer): what it
        then takes with :meth:`next_or_woken` includes all that came meanwhile.
        """
        loop = asyncio.get_running_loop()
        while not (self._done or self._woken or self._pushes or self._catching_up):
            if not self._feed.wait_on(self._sub, loop, self._event):
                return  # something is buffered (or the log closed): the next call says which
            await self._event.wait()

    async def next_or_woken(self) -> tuple[list[StreamEvent], ScannedRange] | None:
        """The next yield, or ``None`` once :meth:`wake` was called; nothing is lost either way.

        Lets one task wait for events and for its own wake-ups (a revive to
        run, a stop) on the same await. Raises ``StopAsyncIteration`` once
        the follower is closed.
        """
        return await self._next(wakeable=True)

    @property
    def overflows(self) -> int:
        """Times this follower fell so far behind that its buffer was dropped for a re-read.

        Durable events are re-read from the log, so none is lost; ephemerals in
        the dropped pushes are. A consumer that must not miss one (a client
        relaying ephemerals) ends its stream when this moves and resumes.
        """
        return self._sub.overflows

    async def __anext__(self) -> tuple[list[StreamEvent], ScannedRange]:
        out = await self._next(wakeable=False)
        assert out is not None  # only a wakeable wait returns without a yield
        return out

    async def _next(self, *, wakeable: bool) -> tuple[list[StreamEvent], ScannedRange] | None:
        while True:
            if self._done:
                raise StopAsyncIteration
            if wakeable and self._woken:
                self._woken = False
                return None
            closed, resync, bound = self._feed.take(self._sub, self._pushes)
            if closed:
                await self.aclose()
                raise StopAsyncIteration
            self._catching_up = self._catching_up or resync
            try:
                if self._catching_up:
                    out = await self._catch_up(bound)
                elif self._pushes:
                    out = await self._next_push()
                else:
                    if self._feed.wait_on(self._sub, asyncio.get_running_loop(), self._event):
                        await self._event.wait()
                    continue
            except LogClosed:
                await self.aclose()
                raise StopAsyncIteration from None
            if out is not None:
                return out

    async def aclose(self) -> None:
        """Stop following; later ``__anext__`` calls raise ``StopAsyncIteration``."""
        self.close()

    def close(self) -> None:
        """:meth:`aclose` without the await; a wait in progress ends at once."""
        self._done = True
        self._pushes.clear()
        self._unregister()
        self._event.set()

    async def _catch_up(self, bound: int | None) -> tuple[list[StreamEvent], ScannedRange] | None:
        page, self._size = await self._read(PageRead(self._path, self._position, PAGE_LIMIT))
        events = list(page.events)
        through = page.scanned_through_offset
        done = page.at_head
        # Pushes may have arrived while the page was read: never overtake one.
        _closed, _resync, later_bound = self._feed.take(self._sub, self._pushes)
        if later_bound is not None and (bound is None or later_bound < bound):
            bound = later_bound
        head = page.at_head
        if bound is not None and bound < through:
            through = max(self._position, bound)
            events = [event for event in events if event.offset <= through]
            done = True
            head = False  # a push starts at the cut: it follows
        if done:
            self._catching_up = False
        self._at_head = head and not self._more_after(through)
        return self._advance(events, through)

    async def _next_push(self) -> tuple[list[StreamEvent], ScannedRange] | None:
        push = self._pushes[0]
        if push.through <= self._position:
            self._pushes.popleft()
            return None
        if push.after > self._position:
            # Gap repair: what lies between here and the push's start comes from the log.
            page, self._size = await self._read(
                PageRead(self._path, self._position, PAGE_LIMIT, push.after)
            )
            self._at_head = False
            return self._advance(list(page.events), page.scanned_through_offset)
        self._pushes.popleft()
        if push.after == self._position:
            events = list(push.events)
        else:
            events = [event for event in push.events if event.offset > self._position]
        through, size = push.through, push.size
        # Pushes that queued up end to end while the consumer was busy are one yield (up
        # to a page): one batch, so its fixed costs (a checkpoint) are paid once, and a
        # consumer slower per batch than the commits arrive does not fall behind for good.
        pushes = self._pushes
        while (
            pushes
            and pushes[0].after == through
            and len(events) + len(pushes[0].events) <= PAGE_LIMIT
        ):
            joined = pushes.popleft()
            events.extend(joined.events)
            through = joined.through
            size += joined.size
        self._at_head = not self._more_after(through)
        self._size = size
        return self._advance(events, through)

    def _more_after(self, through: int) -> bool:
        """Whether a push taken already reaches past ``through`` (pushes of a path ascend)."""
        return bool(self._pushes) and self._pushes[-1].through > through

    def _advance(
        self, events: list[StreamEvent], through: int
    ) -> tuple[list[StreamEvent], ScannedRange] | None:
        if through <= self._position:
            return None
        self._position = through
        if not events:
            # An empty stretch is folded into the next yield's range, which stays contiguous.
            return None
        out = (events, ScannedRange(self._yielded, through))
        self._yielded = through
        return out

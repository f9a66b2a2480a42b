"""The feeds of a host's watchers: the host follows a path only while someone watches it.

A watcher (:class:`~._live_watch.Subscription`) takes one processor's live-state
deltas, which are ephemerals: only a follower's pushes carry them, never a
read of the log. So the first watcher of a path starts a follower of it,
moved to the head as it is then, and the last one to leave stops it; a path
nobody watches costs the host nothing per commit. Each range the follower
yields is offered to the path's watchers of that moment, each of which keeps
only its own processor's deltas within its own byte budget. A failed read is
logged and followed again from the last position after a second (a watcher
whose chain breaks meanwhile re-seeds, as for any gap).

This follower is on the way of no event to a checkpoint: each processor
follows its path itself (:mod:`._runner`). :class:`WatchFeeds` is the part
of the host that holds the feed of every watched path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from streamkit.host._live_watch import Subscription
from streamkit.log import Follow, Log

__all__ = ["FOLLOW_RETRY_SECONDS", "PathFeed", "WatchFeeds"]

_log = structlog.get_logger("streamkit.host")

FOLLOW_RETRY_SECONDS = 1.0
"""How long the follower waits before following again after a failed read."""


class WatchFeeds:
    """The feed of every path a host's clients watch (see the module docstring).

    ``log()`` is the host's log, asked for when the first watcher of a path
    comes (it raises while the host is not started).
    """

    def __init__(self, log: Callable[[], Log], max_bytes: int) -> None:
        self._log = log
        self._max_bytes = max_bytes
        self._feeds: dict[str, PathFeed] = {}

    def subscribe(self, path: str, key: str) -> Subscription:
        """A mailbox of ``key``'s live-state deltas on ``path`` from now on."""
        subscription = Subscription(path, key, self._max_bytes)
        feed = self._feeds.get(path)
        if feed is None:
            feed = self._feeds[path] = PathFeed(self._log(), path)
        feed.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop delivering to ``subscription``."""
        feed = self._feeds.get(subscription.path)
        if feed is not None:
            feed.discard(subscription)

    def watching(self, path: str, key: str) -> bool:
        """Whether a client watches ``key``'s live state on ``path`` now."""
        feed = self._feeds.get(path)
        return feed is not None and feed.watches(key)

    def reseed(self, path: str, key: str) -> None:
        """Send each watcher of ``key``'s live state on ``path`` a fresh seed (a cutover's)."""
        feed = self._feeds.get(path)
        if feed is not None:
            feed.reseed(key)

    def feed(self, path: str) -> PathFeed | None:
        """The feed of ``path``, if it ever had a watcher."""
        return self._feeds.get(path)

    async def close(self) -> None:
        """Drop every watcher and stop every follower (the host is stopping)."""
        feeds, self._feeds = self._feeds, {}
        await asyncio.gather(*(feed.close() for feed in feeds.values()))


class PathFeed:
    """The watchers of ``path`` and, while there are any, the follower that feeds them."""

    def __init__(self, log: Log, path: str) -> None:
        self._log = log
        self._path = path
        self._subscribers: set[Subscription] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def following(self) -> bool:
        """Whether the path is followed now (it has a watcher)."""
        return self._task is not None

    def add(self, subscription: Subscription) -> None:
        """Feed ``subscription`` from now on; the first one starts the follower."""
        self._subscribers.add(subscription)
        if self._task is None:
            # Subscribed here, before this returns: nothing committed from now on is missed.
            follower = self._log.stream(self._path).follow()
            self._task = asyncio.get_running_loop().create_task(self._run(follower))

    def discard(self, subscription: Subscription) -> None:
        """Stop feeding ``subscription``; the last one to leave stops the follower."""
        self._subscribers.discard(subscription)
        if not self._subscribers:
            self._stop()

    def watches(self, key: str) -> bool:
        """Whether a watcher of ``key``'s live state is fed here."""
        return any(subscription.key == key for subscription in self._subscribers)

    def reseed(self, key: str) -> None:
        """Ask every watcher of ``key`` fed here for a fresh seed."""
        for subscription in self._subscribers:
            if subscription.key == key:
                subscription.reseed()

    async def close(self) -> None:
        """Drop every watcher and stop following (the host is stopping)."""
        self._subscribers.clear()
        task = self._stop()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _stop(self) -> asyncio.Task[None] | None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def _run(self, follower: Follow) -> None:
        stream = self._log.stream(self._path)
        position: int | None = None
        try:
            while True:
                try:
                    if position is None:
                        # Durable events mean nothing to a watcher: start at the head, not 0.
                        position = await stream.head()
                        follower.skip_to(position)
                    async for events, scanned in follower:
                        position = scanned.through
                        for subscriber in tuple(self._subscribers):
                            subscriber.offer(events, scanned)
                    return  # the log closed
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if self._log.closed:
                        return
                    _log.error(
                        "follow.failed",
                        path=self._path,
                        error=repr(exc),
                        retry_in=FOLLOW_RETRY_SECONDS,
                    )
                    follower.close()
                    await asyncio.sleep(FOLLOW_RETRY_SECONDS)
                    if self._log.closed:
                        return
                    follower = stream.follow(position or 0)
        finally:
            follower.close()

"""Other processes' commits to a SQLite log: noticed, and pushed to this process's followers.

The writer connection's ``PRAGMA data_version`` changes exactly when another
connection committed, so :meth:`ForeignCommits.sync` (run at the start of
every group, and by the writer thread's poll while anyone follows) drops the
cached heads and reads the new rows of every followed path from the position
it was last published through, and pushes them. A path newly followed
starts from the durable head it has then (:meth:`ForeignCommits.start_following`).

It also keeps the two times the writer's poll is paced by: when the log was
last looked at, and when events were last seen (committed here or
elsewhere).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from streamkit._requests import PageRead
from streamkit.backends._settling import Settling
from streamkit.backends._stamps import Stamps
from streamkit.backends.sqlite._read import durable_head, read_page_sized
from streamkit.log import Feed, Push

__all__ = ["FOREIGN_PAGE", "ForeignCommits"]

monotonic = time.monotonic  # bound once: every transaction reads it

FOREIGN_PAGE = 1000
"""Rows of other processes' commits read per path per poll (bounds one push's size)."""

# The newest created_at of the log: the head row of each path, found by walking the
# primary key from one distinct path to the next (no scan of the rows between).
_LATEST_STAMP = """
WITH RECURSIVE p(x) AS (
    SELECT min(path) FROM streamkit_events
    UNION ALL
    SELECT (SELECT min(path) FROM streamkit_events WHERE path > x) FROM p WHERE x IS NOT NULL
)
SELECT max((SELECT created_at FROM streamkit_events WHERE path = x ORDER BY "offset" DESC
            LIMIT 1))
FROM p WHERE x IS NOT NULL
"""


class ForeignCommits:
    """What one writer knows of other connections' commits (see the module docstring).

    ``forget`` drops the writer's cached heads (another connection wrote).
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        cur: sqlite3.Cursor,
        feed: Feed,
        stamps: Stamps,
        settling: Settling,
        forget: Callable[[], None],
    ) -> None:
        self._conn = conn
        self._cur = cur
        self._feed = feed
        self._stamps = stamps
        self._settling = settling
        self._forget = forget
        self._data_version: int | None = None
        # Per followed path, the offset through which it was published to the feed.
        self._fed: dict[str, int] = {}
        self._pending_follows: set[str] = set()
        self.synced_at = 0.0
        """Monotonic time of the latest look for other processes' commits."""
        self.active_at = 0.0
        """Monotonic time of the latest events, committed here or seen from elsewhere."""

    def sync(self) -> None:
        """Notice other connections' commits: drop cached heads and push their rows to followers."""
        self.synced_at = monotonic()
        version = self._cur.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._take(version)

    def poll(self) -> None:
        """The idle thread's look (a busy or failing read is tried again at the next one)."""
        try:
            self.sync()
            if self._pending_follows:
                self.start_following()
        except sqlite3.Error:
            self._data_version = None
        self._settling.flush()

    def follow(self, path: str) -> None:
        """``path`` gained a follower: start watching it at the next :meth:`start_following`."""
        self._pending_follows.add(path)

    def start_following(self, _: None = None) -> None:
        """Start watching newly followed paths (retried at the next poll if SQLite fails)."""
        self.sync()
        followed = set(self._feed.followed_paths())
        pushes: list[tuple[str, Push]] = []
        for path in sorted(self._pending_follows):
            if path in followed:
                fed = self._fed.get(path)
                if fed is None:
                    fed = self._fed[path] = durable_head(self._conn, path)
                # Everything at or below ``fed`` is committed; everything above will be pushed.
                pushes.append((path, Push(fed, fed, ())))
        self._feed.publish(pushes, self._settling.wakes)
        self._pending_follows.clear()

    def pushed(self, path: str, durable_through: int | None) -> None:
        """This writer published a push of ``path`` (through ``durable_through``, if durable)."""
        self.active_at = self.synced_at  # events: the log is busy (see the writer's loop)
        if durable_through is not None:
            fed = self._fed.get(path)
            if fed is not None and durable_through > fed:
                self._fed[path] = durable_through

    def unfollowed(self) -> None:
        """A commit was pushed to nobody: a path followed again starts from its head then."""
        if self._fed:
            self._fed.clear()

    def _take(self, version: int) -> None:
        """Other connections committed (``data_version`` is now ``version``): see to it."""
        self._data_version = version
        self.active_at = self.synced_at
        self._forget()
        latest = self._conn.execute(_LATEST_STAMP).fetchone()[0]
        if latest is not None:
            self._stamps.saw(str(latest))
        followed = set(self._feed.followed_paths())
        for path in list(self._fed):
            if path not in followed:
                del self._fed[path]
        pushes: list[tuple[str, Push]] = []
        for path, fed in self._fed.items():
            page, size = read_page_sized(self._conn, PageRead(path, fed, FOREIGN_PAGE))
            if page.events:
                pushes.append((path, Push(fed, page.scanned_through_offset, page.events, size)))
                self._fed[path] = page.scanned_through_offset
            if not page.at_head:
                self._data_version = None  # more rows wait: read on at the next look
        if pushes:
            self._feed.publish(pushes, self._settling.wakes)

"""Following a PostgreSQL log across processes: LISTEN as the hint, reads as the truth.

Every commit that adds durable events notifies the log's channel with the
paths it touched (:mod:`._writer`; the server delivers a notification only
if its transaction commits). One listener thread per open log, started by
the first follower, keeps a dedicated connection that ``LISTEN``\\ s and,
for each followed path, publishes to the feed what the log holds past the
position published last (:class:`~._writer.Fed`). A notification is only a
hint to read: the pushes come from reads, and every read carries its proof.
So nothing depends on a notification arriving:

- every followed path is read again at least once per
  :data:`POLL_SECONDS`, whatever was notified (a lost notification costs at
  most that delay);
- a connection that breaks (the server restarted, the network failed) is
  opened again with a growing back-off, and the first thing done on the new
  one is a read of every followed path: the listener never dies of an
  outage, and what was committed meanwhile is delivered then.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from typing import Any

import psycopg

from streamkit._requests import PageRead
from streamkit._targets import PostgresTarget
from streamkit.backends.postgres._connect import connect
from streamkit.backends.postgres._notify import Fed, notify_channel
from streamkit.backends.postgres._read import Reads
from streamkit.errors import StorageError
from streamkit.log import Feed, Push, WakeList, wake

__all__ = ["POLL_SECONDS", "Listener"]

POLL_SECONDS = 1.0
"""The longest a followed path goes without a read, notifications or not."""
PAGE = 1000
"""Rows read per path per look (bounds one push's size); more are read at once after."""
CUT_RETRY_SECONDS = 0.002
"""How soon a path cut at this process's commit in flight is read again."""
BACKOFF_MAX = 2.0
"""The longest wait between two attempts to reconnect."""

_ALL = ""
"""A notification without a path (a path too long to name): read every followed path."""


class Listener:
    """The listener thread of one log and what it shares with the callers."""

    def __init__(self, target: PostgresTarget, feed: Feed, fed: Fed) -> None:
        self._target = target
        self._feed = feed
        self._fed = fed
        self._reads = Reads(target.schema)
        self._channel = notify_channel(target.schema)
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._closing = False
        self._thread: threading.Thread | None = None
        # Wakes the thread out of its wait for the server (a new follower, a close).
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._dirty: set[str] = set()
        self._cut = False
        self.connected = False
        """Whether the listener's connection is up (False while the server is unreachable)."""
        self.reconnects = 0
        """Connections opened again after one broke."""
        self.looked_at: float | None = None
        """When (monotonic) the thread last read the followed paths; None before it started."""

    def follow(self, path: str) -> None:
        """Start publishing ``path``'s commits (the thread starts with the first follower)."""
        with self._lock:
            if self._closing:
                return
            self._pending.add(path)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="streamkit-pg-listener", daemon=True
                )
                self._thread.start()
        self._poke()

    def close(self) -> None:
        """Stop the thread and release its connection (blocking until it is done)."""
        with self._lock:
            self._closing = True
            thread = self._thread
        self._poke()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._wake_r.close()
        self._wake_w.close()

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        backoff = 0.05
        polled = 0.0
        try:
            while not self._closing:
                try:
                    if conn is None:
                        conn = self._connect()
                        backoff = 0.05
                        polled = 0.0  # everything is read again on a new connection
                    if time.monotonic() - polled >= POLL_SECONDS:
                        self._dirty.add(_ALL)
                        polled = time.monotonic()
                    self._start_following(conn)
                    self._cut = False
                    more = self._read_dirty(conn)
                    self.looked_at = time.monotonic()
                    timeout = (
                        0.0
                        if more
                        else CUT_RETRY_SECONDS
                        if self._cut
                        else max(0.0, polled + POLL_SECONDS - time.monotonic())
                    )
                    self._wait(conn, timeout)
                except (psycopg.Error, StorageError, OSError):
                    self.connected = False
                    if conn is not None:
                        with contextlib.suppress(psycopg.Error):
                            conn.close()
                        conn = None
                        self.reconnects += 1
                    self._sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
        finally:
            self.connected = False
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = connect(self._target.conninfo, self._target.shown, role="listener")
        try:
            conn.execute(f'LISTEN "{self._channel}"')
        except BaseException:
            conn.close()
            raise
        self.connected = True
        return conn

    def _wait(self, conn: psycopg.Connection[Any], timeout: float) -> None:
        """Wait up to ``timeout`` for a notification or a poke; take what arrived."""
        # Notifications that came in during the reads wait in psycopg's backlog.
        if self._take_notifications(conn):
            return
        ready, _, _ = select.select([conn.fileno(), self._wake_r.fileno()], [], [], timeout)
        if self._wake_r.fileno() in ready:
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass
        if conn.fileno() in ready:
            self._take_notifications(conn)

    def _take_notifications(self, conn: psycopg.Connection[Any]) -> bool:
        """Mark the paths notified so far for a read (an EOF here: the server went away)."""
        taken = False
        for note in conn.notifies(timeout=0):
            self._dirty.add(note.payload)
            taken = True
        return taken

    def _sleep(self, seconds: float) -> None:
        """A back-off a poke (a close) cuts short."""
        with contextlib.suppress(OSError, ValueError):
            select.select([self._wake_r], [], [], seconds)

    def _start_following(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            pending, self._pending = self._pending, set()
        if not pending:
            return
        followed = set(self._feed.followed_paths())
        pushes: list[tuple[str, Push]] = []
        try:
            for path in sorted(pending & followed):
                with self._fed.lock:
                    fed = self._fed.positions.get(path)
                if fed is None:
                    fed = self._reads.head(conn, path)
                    with self._fed.lock:
                        fed = self._fed.positions.setdefault(path, fed)
                # Everything at or below ``fed`` is committed; everything above will be pushed.
                pushes.append((path, Push(fed, fed, ())))
        except BaseException:
            with self._lock:
                self._pending |= pending  # tried again on the next connection
            raise
        self._publish(pushes)

    def _read_dirty(self, conn: psycopg.Connection[Any]) -> bool:
        """Read the notified (or all) followed paths past their positions; True if more wait."""
        dirty, self._dirty = self._dirty, set()
        followed = set(self._feed.followed_paths())
        with self._fed.lock:
            for path in list(self._fed.positions):
                if path not in followed:
                    del self._fed.positions[path]  # followed again, it starts from its head then
            positions = dict(self._fed.positions)
        wanted = sorted(positions) if _ALL in dirty else sorted(dirty & set(positions))
        pushes: list[tuple[str, Push]] = []
        more = False
        try:
            for path in wanted:
                after = positions[path]
                page, size = self._reads.page_sized(conn, PageRead(path, after, PAGE))
                if page.scanned_through_offset > after:
                    pushes.append(
                        (path, Push(after, page.scanned_through_offset, page.events, size))
                    )
                if not page.at_head:
                    self._dirty.add(path)
                    more = True
        except BaseException:
            self._dirty |= dirty
            raise
        wakes: WakeList = {}
        published = self._feed.publish_read(pushes, wakes)
        wake(wakes)
        for path, push in pushes:
            through = published.get(path)
            if through is not None:
                self._fed.advance(path, through)
            if through != push.through:
                # Cut at this process's commit in flight: read the rest once its push is out.
                self._dirty.add(path)
                self._cut = True
        return more

    def _publish(self, pushes: list[tuple[str, Push]]) -> None:
        if not pushes:
            return
        wakes: WakeList = {}
        # (never the feed's publish: that one clears the marks of this process's commits)
        self._feed.publish_read(pushes, wakes)
        wake(wakes)

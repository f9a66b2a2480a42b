"""Storage backends, one package each, and :func:`open_log`, which picks one from a target.

A backend implements :class:`~streamkit.protocols.LogBackend` (and what a
host keeps beside the log); the layers above it never import a storage
driver. What a target names is the rule of :mod:`streamkit._targets`.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Literal

from streamkit._targets import is_postgres_target, postgres_target, sqlite_target
from streamkit.backends.sqlite._backend import SqliteLogBackend
from streamkit.backends.sqlite.host_store import SqliteHostStore
from streamkit.backends.sqlite.registry import registered_sockets as _sqlite_sockets
from streamkit.errors import InvalidRequest, LogOpenError
from streamkit.log import MAX_BUFFERED_BYTES, Log
from streamkit.protocols import Clock, HostStore

__all__ = ["host_store", "open_log", "registered_sockets"]


def open_log(
    target: str | os.PathLike[str],
    *,
    synchronous: Literal["FULL", "NORMAL"] = "FULL",
    clock: Clock = time.time,
    busy_timeout: float = 5.0,
    inline_commits: bool = True,
    follower_bytes: int = MAX_BUFFERED_BYTES,
    read_only: bool = False,
) -> Log:
    """Open (or create) the log ``target`` names; ``":memory:"`` gives a private in-memory log.

    Use it as ``async with open_log(...) as log:`` or close it with
    :meth:`Log.aclose`. A file that is not a streamkit log is refused with
    :class:`~streamkit.errors.LogOpenError` and left untouched; so is a target
    no installed backend serves.

    ``inline_commits``: appends that become ready in the same event-loop turn
    share one group commit; when the writer is idle and the loop has nothing
    else to run, that commit runs on the caller's thread (the event loop),
    skipping the hand-off to the writer thread and back. It never waits for
    another process's write lock (the writer thread takes the group then).
    Pass False to keep every commit, and its fsync, off the event loop.

    ``follower_bytes``: how much of the events' stored JSON one follower
    (``Stream.follow``) may leave unread before its buffer is dropped and it
    re-reads the log (its missed ephemerals are then gone).

    ``read_only=True`` opens an existing log for reading only (a file, a
    directory or a file system this process may not write): ``read``,
    ``head``, ``follow`` and queries work; every write is refused with
    :class:`~streamkit.errors.InvalidRequest` and nothing is written.

    ``synchronous`` and ``busy_timeout`` are SQLite's: ``PRAGMA synchronous``
    and how long a write waits for another process's write lock. On
    PostgreSQL (``postgresql://...``, the ``postgres`` extra) ``busy_timeout``
    is how long a write waits for a row lock another transaction holds, and
    only ``synchronous="FULL"`` is accepted (the server decides durability).
    """
    if is_postgres_target(target):
        return _open_postgres(
            str(target),
            synchronous=synchronous,
            clock=clock,
            busy_timeout=busy_timeout,
            follower_bytes=follower_bytes,
            read_only=read_only,
        )
    path = sqlite_target(target)
    backend = functools.partial(
        SqliteLogBackend,
        path,
        synchronous=synchronous,
        clock=clock,
        busy_timeout=busy_timeout,
        read_only=read_only,
    )
    return Log(
        path,
        backend,
        inline_commits=inline_commits,
        follower_bytes=follower_bytes,
        read_only=read_only,
    )


def _open_postgres(
    target: str,
    *,
    synchronous: Literal["FULL", "NORMAL"],
    clock: Clock,
    busy_timeout: float,
    follower_bytes: int,
    read_only: bool,
) -> Log:
    parsed = postgres_target(target)
    try:
        # The optional extra: imported only when a PostgreSQL log is opened.
        from streamkit.backends.postgres._backend import PostgresLogBackend
    except ImportError as exc:
        raise LogOpenError(
            f"the target {parsed.shown!r} needs the PostgreSQL driver, which is not installed "
            f"({exc}); nothing was opened (pip install 'streamkit-events[postgres]')",
            details={"target": parsed.shown},
        ) from None
    backend = functools.partial(
        PostgresLogBackend,
        parsed,
        synchronous=synchronous,
        clock=clock,
        busy_timeout=busy_timeout,
        read_only=read_only,
    )
    return Log(
        parsed.shown,
        backend,
        inline_commits=False,
        follower_bytes=follower_bytes,
        read_only=read_only,
    )


def host_store(log: Log) -> HostStore:
    """What a host keeps beside ``log``, in the log's own backend."""
    if isinstance(log.backend, SqliteLogBackend):
        return SqliteHostStore(log)
    if type(log.backend).__name__ == "PostgresLogBackend":
        # (imported here: the PostgreSQL driver is an optional extra)
        from streamkit.backends.postgres.host_store import PostgresHostStore

        return PostgresHostStore(log)
    raise InvalidRequest(
        f"the log {log.path!r} has no host store (its backend, {type(log.backend).__name__}, "
        "keeps no leases or checkpoints); nothing was done; run hosts on a SQLite file or a "
        "PostgreSQL log",
        details={"path": log.path},
    )


def registered_sockets(target: str, slug: str | None = None) -> list[str]:
    """The control sockets of the hosts registered on ``target``, the holder of ``slug`` first.

    Reads without opening a log (a client asking where to send a request);
    empty when nothing is registered yet.
    """
    if is_postgres_target(target):
        try:
            from streamkit.backends.postgres.host_store import registered_sockets as _pg_sockets
        except ImportError:
            return []
        return _pg_sockets(postgres_target(target), slug)
    return _sqlite_sockets(sqlite_target(target), slug)

"""Storage backends, one package each, and :func:`open_log`, which picks one from a target.

A backend implements :class:`~streamkit.protocols.LogBackend` (and what a
host keeps beside the log); the layers above it never import a storage
driver. What a target names is the rule of :mod:`streamkit._targets`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any, Literal

from streamkit._targets import is_postgres_target, postgres_target
from streamkit.backends._storage import LogOptions, Storage
from streamkit.backends.sqlite import SQLITE
from streamkit.catalog import EventCatalog
from streamkit.contract import ProcessorContract
from streamkit.errors import LogOpenError
from streamkit.log import MAX_BUFFERED_BYTES, Log
from streamkit.protocols import Clock, HostStore

__all__ = ["host_store", "open_log", "registered_sockets"]


def storage_for(target: str | os.PathLike[str]) -> Storage:
    """The one storage that serves ``target``: PostgreSQL for its URLs, SQLite for the rest.

    A PostgreSQL target without the ``postgres`` extra installed is refused
    with :class:`~streamkit.errors.LogOpenError`.
    """
    if not is_postgres_target(target):
        return SQLITE
    try:
        # The optional extra: imported only when a PostgreSQL target is named.
        from streamkit.backends.postgres import POSTGRES
    except ImportError as exc:
        shown = postgres_target(str(target)).shown
        raise LogOpenError(
            f"the target {shown!r} needs the PostgreSQL driver, which is not installed "
            f"({exc}); nothing was opened (pip install 'streamkit-events[postgres]')",
            details={"target": shown},
        ) from None
    return POSTGRES


def open_log(
    target: str | os.PathLike[str],
    *,
    synchronous: Literal["FULL", "NORMAL"] = "FULL",
    clock: Clock = time.time,
    busy_timeout: float = 5.0,
    inline_commits: bool = True,
    follower_bytes: int = MAX_BUFFERED_BYTES,
    read_only: bool = False,
    contracts: Iterable[ProcessorContract[Any]] = (),
    unversioned: int | None = None,
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

    ``contracts``: processor contracts whose event definitions every append
    must fit. An appended event of a type they define is checked against
    the current definition (stamped with its version when it names none,
    lifted when it names an older one) and refused with
    :class:`~streamkit.errors.InvalidEvent` when it does not validate,
    nothing of the call written; an idempotent retry in another version is
    compared after lifting (see :mod:`streamkit.catalog`). Where two
    contracts define one type, an event must fit both. ``unversioned=N``
    reads an event of such a type that names no version as version N (or
    the type's current version, where older): old producers of a rolling
    deploy send the old shape unnamed.

    ``synchronous`` and ``busy_timeout`` are SQLite's: ``PRAGMA synchronous``
    and how long a write waits for another process's write lock. On
    PostgreSQL (``postgresql://...``, the ``postgres`` extra) ``busy_timeout``
    is how long a write waits for a row lock another transaction holds, and
    only ``synchronous="FULL"`` is accepted (the server decides durability).
    """
    options = LogOptions(
        synchronous=synchronous,
        clock=clock,
        busy_timeout=busy_timeout,
        inline_commits=inline_commits,
        follower_bytes=follower_bytes,
        read_only=read_only,
        catalog=EventCatalog(contracts, unversioned=unversioned),
    )
    return storage_for(target).open(target, options)


def host_store(log: Log) -> HostStore:
    """What a host keeps beside ``log``, by the storage that serves the log's target."""
    return storage_for(log.path).host_store(log)


def registered_sockets(target: str, slug: str | None = None) -> list[str]:
    """The control sockets of the hosts registered on ``target``, the holder of ``slug`` first.

    Reads without opening a log (a client asking where to send a request);
    empty when nothing is registered yet, or no installed backend serves it.
    """
    try:
        storage = storage_for(target)
    except LogOpenError:
        return []
    return storage.registered_sockets(target, slug)

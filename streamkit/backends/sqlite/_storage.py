"""The SQLite storage: a log in one file (or ``:memory:``), a host's tables beside it."""

from __future__ import annotations

import functools
import os

from streamkit._targets import sqlite_target
from streamkit.backends._storage import LogOptions
from streamkit.backends.sqlite._backend import SqliteLogBackend
from streamkit.backends.sqlite.host_store import sqlite_host_store
from streamkit.backends.sqlite.registry import registered_sockets
from streamkit.errors import InvalidRequest
from streamkit.log import Log
from streamkit.protocols import HostStore

__all__ = ["SQLITE", "SqliteStorage"]


class SqliteStorage:
    """Opens SQLite logs (see :class:`~streamkit.backends._storage.Storage`)."""

    def open(self, target: str | os.PathLike[str], options: LogOptions) -> Log:
        path = sqlite_target(target)
        backend = functools.partial(SqliteLogBackend, path, options=options)
        return Log(
            path,
            backend,
            inline_commits=options.inline_commits,
            follower_bytes=options.follower_bytes,
            read_only=options.read_only,
            catalog=options.catalog,
        )

    def host_store(self, log: Log) -> HostStore:
        if not isinstance(log.backend, SqliteLogBackend):
            raise InvalidRequest(
                f"the log {log.path!r} has no host store (its backend, "
                f"{type(log.backend).__name__}, keeps no leases or checkpoints); nothing was "
                "done; run hosts on a SQLite file or a PostgreSQL log",
                details={"path": log.path},
            )
        return sqlite_host_store(log)

    def registered_sockets(self, target: str, slug: str | None) -> list[str]:
        return registered_sockets(sqlite_target(target), slug)


SQLITE = SqliteStorage()
"""The one SQLite storage."""

"""The PostgreSQL storage: a log in a schema of a server, a host's tables in the same schema."""

from __future__ import annotations

import functools
import os

from streamkit._targets import postgres_target
from streamkit.backends._storage import LogOptions
from streamkit.backends.postgres._backend import PostgresLogBackend
from streamkit.backends.postgres.host_store import postgres_host_store, registered_sockets
from streamkit.errors import InvalidRequest
from streamkit.log import Log
from streamkit.protocols import HostStore

__all__ = ["POSTGRES", "PostgresStorage"]


class PostgresStorage:
    """Opens PostgreSQL logs (see :class:`~streamkit.backends._storage.Storage`).

    Commits never run inline on an event loop here (a commit is a round
    trip to the server), whatever ``inline_commits`` says.
    """

    def open(self, target: str | os.PathLike[str], options: LogOptions) -> Log:
        parsed = postgres_target(str(target))
        backend = functools.partial(PostgresLogBackend, parsed, options=options)
        return Log(
            parsed.shown,
            backend,
            inline_commits=False,
            follower_bytes=options.follower_bytes,
            read_only=options.read_only,
            catalog=options.catalog,
        )

    def host_store(self, log: Log) -> HostStore:
        if not isinstance(log.backend, PostgresLogBackend):
            raise InvalidRequest(
                f"the log {log.path!r} has no host store (its backend, "
                f"{type(log.backend).__name__}, is not this PostgreSQL log's); nothing was done",
                details={"path": log.path},
            )
        return postgres_host_store(log)

    def registered_sockets(self, target: str, slug: str | None) -> list[str]:
        return registered_sockets(postgres_target(target), slug)


POSTGRES = PostgresStorage()
"""The one PostgreSQL storage."""

"""What each backend package gives :func:`~streamkit.backends.open_log`: one :class:`Storage`.

A backend package exports one storage object, chosen once by the target (a
``postgresql://`` URL or a SQLite file): it opens a log there, builds the
host store a host keeps beside that log, and finds the control sockets of
the hosts registered on a target without opening a log. Nothing above the
backends tells one backend from another by its classes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Protocol

from streamkit.catalog import EventCatalog
from streamkit.log import Log
from streamkit.protocols import Clock, HostStore

__all__ = ["LogOptions", "Storage"]


@dataclass(frozen=True, slots=True)
class LogOptions:
    """The options of :func:`~streamkit.backends.open_log`, handed to the storage whole."""

    synchronous: Literal["FULL", "NORMAL"]
    clock: Clock
    busy_timeout: float
    inline_commits: bool
    follower_bytes: int
    read_only: bool
    catalog: EventCatalog | None = None


class Storage(Protocol):
    """One backend package's way to open logs and keep a host's state beside them."""

    def open(self, target: str | os.PathLike[str], options: LogOptions) -> Log:
        """Open (or create) the log at ``target``."""
        ...

    def host_store(self, log: Log) -> HostStore:
        """What a host keeps beside ``log`` (a log this storage opened)."""
        ...

    def registered_sockets(self, target: str, slug: str | None) -> list[str]:
        """The control sockets of the hosts registered on ``target``, the holder of ``slug`` first."""
        ...

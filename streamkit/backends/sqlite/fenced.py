"""A host's checkpoints on a SQLite log: in the log's own file, every write fenced by a lease.

:class:`FencedCheckpointStorage` is the backend-neutral
:class:`~streamkit.backends._fenced_checkpoints.FencedCheckpoints` (fence and
upsert in one ``log.write_transaction``; a host that lost its lease writes
nothing) over the checkpoint table in the log's SQLite file, the one
:class:`~streamkit.ReduceCheckpointTable` keeps.
"""

from __future__ import annotations

import sqlite3

from streamkit.backends._fenced_checkpoints import FencedCheckpoints
from streamkit.backends.sqlite import leases
from streamkit.backends.sqlite.checkpoints import ReduceCheckpointTable
from streamkit.checkpoint import CheckpointRow, ReduceCheckpoint
from streamkit.log import Log
from streamkit.protocols import Lease, LeaseExchange, LeaseGuard

__all__ = ["FencedCheckpointStorage"]


class _TableRows:
    """The checkpoint table of the log's file, over the connection a transaction runs on."""

    @staticmethod
    def read_checkpoint(
        conn: sqlite3.Connection, slug: str, version: str | None
    ) -> ReduceCheckpoint | None:
        return ReduceCheckpointTable(conn, create_table=False).read(slug, version)

    @staticmethod
    def upsert_checkpoint(conn: sqlite3.Connection, row: CheckpointRow) -> None:
        ReduceCheckpointTable(conn, create_table=False).upsert(row)

    @staticmethod
    def serve_checkpoint(
        conn: sqlite3.Connection, row: CheckpointRow, replacing: str | None
    ) -> None:
        ReduceCheckpointTable(conn, create_table=False).serve_row(row, replacing)

    @staticmethod
    def take_over_lease(
        conn: sqlite3.Connection, path: str, slug: str, owner: str, now: float, ttl: float
    ) -> Lease:
        return leases.take_over(conn, path, slug, owner, now, ttl)

    @staticmethod
    def release_lease(conn: sqlite3.Connection, lease: Lease) -> bool:
        return leases.release(conn, lease)

    @staticmethod
    def check_lease(conn: sqlite3.Connection, lease: Lease, now: float) -> None:
        leases.check_fence(conn, lease, now)


_ROWS = _TableRows()


class FencedCheckpointStorage(FencedCheckpoints):
    """Checkpoints in the log's SQLite file, written only while ``held`` is in force."""

    __slots__ = ()

    def __init__(
        self, log: Log, held: LeaseGuard, path: str = "/", exchange: LeaseExchange | None = None
    ) -> None:
        super().__init__(log, held, _ROWS, path, exchange)

"""The host half of the SQLite backend: :class:`SqliteHostRows`, a host's tables in the file.

Every table a host keeps (leases, checkpoints, skips, the host registry)
lives in the log's own file, next to the events, so a fenced write and the
rows it guards commit in one SQLite transaction on the log's writer
connection (the backend-neutral
:class:`~streamkit.backends._host_store.LogHostStore` decides which
connection each verb runs on; :func:`sqlite_host_store` builds it). The
tables are made by the first host (``prepare``); until then every read
finds them empty. The lease keeper gets a connection of its own
(:class:`SqliteLeaseRenewer`), so renewals run while the event loop is busy.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import time
from typing import Any

from streamkit.backends._host_store import LogHostStore
from streamkit.backends.sqlite import incidents, leases, registry, skips, status
from streamkit.backends.sqlite._backend import SqliteLogBackend
from streamkit.backends.sqlite._schema import MEMORY, connect_reader
from streamkit.backends.sqlite.checkpoints import ReduceCheckpointTable
from streamkit.backends.sqlite.retention import ROWS as _RETENTION_ROWS
from streamkit.checkpoint import CheckpointRow, ReduceCheckpoint
from streamkit.log import Log
from streamkit.protocols import Lease

__all__ = ["SqliteHostRows", "SqliteLeaseRenewer", "sqlite_host_store"]


def _create_tables(conn: sqlite3.Connection) -> None:
    ReduceCheckpointTable(conn)
    leases.ensure_lease_table(conn)
    skips.ensure_skip_table(conn)
    incidents.ensure_incident_table(conn)
    registry.ensure_hosts_table(conn)


class SqliteLeaseRenewer:
    """Renews leases over a connection of its own to the log's file, opened on first use."""

    def __init__(self, db: str, timeout: float) -> None:
        self._db = db
        self._timeout = timeout
        self._conn: sqlite3.Connection | None = None

    def renew(self, lease: Lease, now: float, ttl: float) -> Lease:
        """Renew ``lease`` in one ``BEGIN IMMEDIATE`` transaction (LeaseLost if taken)."""
        conn = self._conn
        if conn is None:
            conn = self._conn = sqlite3.connect(
                self._db, isolation_level=None, timeout=self._timeout
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                renewed = leases.renew(conn, lease, now, ttl)
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error:
            self.close()  # reconnect at the next renewal
            raise
        return renewed

    def close(self) -> None:
        """Close the connection; the next renewal opens a new one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()


class SqliteHostRows:
    """The host's tables in the log's SQLite file (see :class:`~streamkit.backends._host_store.HostRows`)."""

    __slots__ = ("make_tables",)

    def __init__(self) -> None:
        self.make_tables = _create_tables

    # -- leases (the rules: :mod:`.leases`) ---------------------------------------------------

    lease_rows = leases.LEASES

    @staticmethod
    def leases(conn: sqlite3.Connection) -> list[Lease]:
        return leases.leases(conn)

    # -- checkpoints (:class:`.checkpoints.ReduceCheckpointTable`) ----------------------------

    @staticmethod
    def read_checkpoint(
        conn: sqlite3.Connection, slug: str, version: str | None
    ) -> ReduceCheckpoint | None:
        if not status.has_checkpoints(conn):
            return None  # no host ever ran on this file
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
    def checkpoint_versions(conn: sqlite3.Connection, slug: str) -> list[ReduceCheckpoint]:
        if not status.has_checkpoints(conn):
            return []
        return ReduceCheckpointTable(conn, create_table=False).versions(slug)

    @staticmethod
    def reinstate(conn: sqlite3.Connection, slug: str, version: str) -> bool:
        return ReduceCheckpointTable(conn, create_table=False).reinstate(slug, version)

    @staticmethod
    def write_incidents(conn: sqlite3.Connection, slug: str, version: str, record: str) -> None:
        incidents.write_incidents(conn, slug, version, record)

    @staticmethod
    def incidents(conn: sqlite3.Connection, slug: str) -> dict[str, str]:
        return incidents.read_incidents(conn, slug)

    # -- skips (:mod:`.skips`) -----------------------------------------------------------------

    @staticmethod
    def skips(conn: sqlite3.Connection) -> dict[tuple[str, str], dict[int, int]]:
        return skips.recorded_skips(conn)

    @staticmethod
    def recorded_at(conn: sqlite3.Connection, path: str, slug: str, offset: int) -> int | None:
        return skips.recorded_at(conn, path, slug, offset)

    @staticmethod
    def processor_facts(conn: sqlite3.Connection, path: str, slug: str) -> tuple[bool, int | None]:
        return skips.processor_facts(conn, path, slug)

    @staticmethod
    def insert(conn: sqlite3.Connection, path: str, slug: str, offset: int, at: int) -> None:
        skips.insert(conn, path, slug, offset, at)

    # -- the registry (:mod:`.registry`; one machine, one clock) -----------------------------

    @staticmethod
    def register(conn: sqlite3.Connection, owner: str, socket: str, pid: int, now: float) -> None:
        registry.register(conn, owner, socket, pid, now)

    @staticmethod
    def deregister(conn: sqlite3.Connection, owner: str) -> None:
        registry.deregister(conn, owner)

    @staticmethod
    def beat(
        conn: sqlite3.Connection, owner: str, pid: int, processors: list[str], now: float
    ) -> None:
        registry.beat(conn, owner, pid, processors, now)

    @staticmethod
    def live_hosts(conn: sqlite3.Connection, now: float, ttl: float) -> dict[str, list[str]]:
        return registry.live_hosts(conn, now, ttl)

    # -- the durable status (:mod:`.status`) --------------------------------------------------

    @staticmethod
    def status(conn: sqlite3.Connection, now: float | None) -> list[dict[str, Any]]:
        return status.read_status(conn, time.time() if now is None else now)

    @staticmethod
    def stream_heads(conn: sqlite3.Connection) -> list[tuple[str, int]]:
        return status.stream_heads(conn)

    @staticmethod
    def durable_lag(conn: sqlite3.Connection, path: str, cursor: int) -> int:
        return status.durable_lag(conn, path, cursor)


_ROWS = SqliteHostRows()


def sqlite_host_store(log: Log) -> LogHostStore:
    """What a host keeps in the SQLite file of ``log`` (or its ``:memory:`` database)."""
    backend = log.backend
    opener = (
        functools.partial(connect_reader, backend.path, busy_timeout=backend.busy_timeout)
        if isinstance(backend, SqliteLogBackend) and backend.path != MEMORY
        else None
    )
    return LogHostStore(
        log,
        _ROWS,
        renewer=functools.partial(SqliteLeaseRenewer, log.path),
        retention_rows=_RETENTION_ROWS,
        chunk_opener=opener,
    )

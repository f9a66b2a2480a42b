"""The host half of the SQLite backend: :class:`SqliteHostStore` implements HostStore.

Every table a host keeps (leases, checkpoints, skips, the host registry)
lives in the log's own file, next to the events, so a fenced write and the
rows it guards commit in one SQLite transaction on the log's writer
connection. Reads go through the log's reader connection. The lease keeper
gets a connection of its own (:class:`SqliteLeaseRenewer`), so renewals run
while the event loop is busy.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import time
from typing import Any

from streamkit.backends._retention import Retention
from streamkit.backends.sqlite import leases, registry, skips, status
from streamkit.backends.sqlite._backend import SqliteLogBackend
from streamkit.backends.sqlite._schema import MEMORY, connect_reader
from streamkit.backends.sqlite.checkpoints import ReduceCheckpointTable
from streamkit.backends.sqlite.fenced import FencedCheckpointStorage
from streamkit.backends.sqlite.retention import ROWS as _RETENTION_ROWS
from streamkit.checkpoint import ReduceCheckpoint
from streamkit.events import StreamEvent
from streamkit.log import Log
from streamkit.protocols import CheckpointStorage, Lease, LeaseExchange, LeaseGuard

__all__ = ["SqliteHostStore", "SqliteLeaseRenewer"]


def _create_tables(conn: sqlite3.Connection) -> None:
    ReduceCheckpointTable(conn)
    leases.ensure_lease_table(conn)
    skips.ensure_skip_table(conn)
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


class SqliteHostStore:
    """A host's tables in the SQLite file of ``log``."""

    def __init__(self, log: Log) -> None:
        self._log = log
        backend = log.backend
        opener = (
            functools.partial(connect_reader, backend.path, busy_timeout=backend.busy_timeout)
            if isinstance(backend, SqliteLogBackend) and backend.path != MEMORY
            else None
        )
        self.retention = Retention(log, _RETENTION_ROWS, self.live_hosts, opener)

    async def prepare(self) -> None:
        """Create the checkpoint, lease, skip and host tables if missing, in one transaction."""
        await self._log.write_transaction(_create_tables)

    async def read_lease(self, path: str, slug: str) -> Lease | None:
        """The stored lease row of ``(path, slug)``."""
        return await self._log.query(functools.partial(leases.read_lease, path=path, slug=slug))

    async def try_acquire(
        self,
        path: str,
        slug: str,
        owner: str,
        now: float,
        ttl: float,
        *,
        stale: Lease | None = None,
    ) -> Lease | None:
        """One conditional statement on the writer connection (see ``leases.try_acquire``)."""
        return await self._log.write_transaction(
            functools.partial(
                leases.try_acquire, path=path, slug=slug, owner=owner, now=now, ttl=ttl, stale=stale
            )
        )

    async def release(self, lease: Lease) -> bool:
        """Release ``lease`` (its row and generation stay)."""
        return await self._log.write_transaction(functools.partial(leases.release, lease=lease))

    def check_fence(self, conn: sqlite3.Connection, lease: Lease, now: float) -> None:
        """The stored half of a fence, inside the caller's write transaction."""
        leases.check_fence(conn, lease, now)

    def lease_renewer(self, timeout: float) -> SqliteLeaseRenewer:
        """A renewer over its own connection to this file."""
        return SqliteLeaseRenewer(self._log.path, timeout)

    def checkpoints(
        self, guard: LeaseGuard, path: str = "/", exchange: LeaseExchange | None = None
    ) -> CheckpointStorage:
        """Checkpoints in this file, each save fenced by ``guard`` in its transaction."""
        return FencedCheckpointStorage(self._log, guard, path, exchange)

    async def begin_processor(
        self,
        guard: LeaseGuard,
        path: str,
        slug: str,
        *,
        version: str,
        state_json: str,
        start: str,
        after: int,
        by: str,
    ) -> StreamEvent:
        """A new processor's first checkpoint where it declared it starts, with its record."""
        return await FencedCheckpointStorage(self._log, guard, path).begin(
            slug, reducer_version=version, state_json=state_json, start=start, after=after, by=by
        )

    async def version_rows(
        self, slug: str, version: str
    ) -> tuple[ReduceCheckpoint | None, ReduceCheckpoint | None]:
        """``(serving, own)``: the slug's serving checkpoint and ``version``'s, each None if none."""

        def read(
            conn: sqlite3.Connection,
        ) -> tuple[ReduceCheckpoint | None, ReduceCheckpoint | None]:
            if not status.has_checkpoints(conn):
                return None, None  # no host ever ran on this file
            table = ReduceCheckpointTable(conn, create_table=False)
            return table.read(slug), table.read(slug, version)

        return await self._log.query(read)

    async def checkpoint_versions(self, slug: str) -> list[ReduceCheckpoint]:
        """Every version's checkpoint of ``slug``: the serving one first, then by version."""

        def read(conn: sqlite3.Connection) -> list[ReduceCheckpoint]:
            if not status.has_checkpoints(conn):
                return []
            return ReduceCheckpointTable(conn, create_table=False).versions(slug)

        return await self._log.query(read)

    async def reinstate(self, slug: str, version: str) -> bool:
        """Lift the retirement of ``slug``'s ``version`` (a rollback); whether one was lifted."""
        return await self._log.write_transaction(
            lambda conn: ReduceCheckpointTable(conn, create_table=False).reinstate(slug, version)
        )

    async def stored_snapshot(self, slug: str) -> dict[str, Any]:
        """``slug``'s checkpoint as ``{offset, state, version, source}``."""
        return await status.checkpoint_snapshot(self._log, slug)

    async def load_skips(self) -> dict[tuple[str, str], dict[int, int]]:
        """Every recorded skip."""
        return await skips.load_skips(self._log)

    async def record_skip(
        self, path: str, slug: str, offset: int, *, by: str, reason: str
    ) -> StreamEvent:
        """Skip ``offset`` for ``slug`` on ``path`` (see ``skips.record_skip``)."""
        return await skips.record_skip(self._log, path, slug, offset, by=by, reason=reason)

    async def register(self, owner: str, socket: str, pid: int, now: float) -> None:
        """Enter a host in the registry."""
        await self._log.write_transaction(
            functools.partial(registry.register, owner=owner, socket=socket, pid=pid, now=now)
        )

    async def deregister(self, owner: str) -> None:
        """Remove a host from the registry."""
        await self._log.write_transaction(functools.partial(registry.deregister, owner=owner))

    async def host_beat(self, owner: str, processors: list[str], now: float) -> None:
        """Record that ``owner`` is alive and what it runs (its heartbeat)."""
        await self._log.write_transaction(
            functools.partial(
                registry.beat, owner=owner, pid=os.getpid(), processors=processors, now=now
            ),
            inline=True,
        )

    async def live_hosts(self, now: float, ttl: float) -> dict[str, list[str]]:
        """The hosts that beat within ``ttl`` of ``now`` (one machine: one clock)."""
        return await self._log.query(functools.partial(registry.live_hosts, now=now, ttl=ttl))

    async def leases(self) -> list[Lease]:
        """Every lease row (held, expired or released)."""
        return await self._log.query(leases.leases)

    async def durable_status(self, now: float | None = None) -> list[dict[str, Any]]:
        """What the file alone says about each processor."""
        return await status.durable_status(self._log, time.time() if now is None else now)

    async def stream_heads(self) -> list[tuple[str, int]]:
        """Every path with a durable event and its head (see ``status.stream_heads``)."""
        return await self._log.query(status.stream_heads)

    async def durable_lag(self, path: str, cursor: int) -> int:
        """Durable events of ``path`` past ``cursor``."""
        return await self._log.query(
            functools.partial(status.durable_lag, path=path, cursor=cursor)
        )

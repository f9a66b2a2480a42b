"""The host half of the PostgreSQL backend: :class:`PostgresHostStore` implements HostStore.

Every table a host keeps lives in the log's schema, next to the events
(:mod:`._schema` creates them when the log is opened), so a fenced write and
the rows it guards commit in one transaction on the log's writer
connection; reads go through the log's reader threads. The lease keeper
gets a connection of its own (:class:`PostgresLeaseRenewer`), so renewals
run while the event loop is busy.

- Checkpoints: one row per slug; a save is ONE upsert behind the lease fence
  (:mod:`.leases`) in the same transaction, so a host that lost its lease
  writes nothing.
- Skips: the shared rules of :mod:`streamkit.backends._skip_rules`, the
  record sealed into the skip event's transaction.
- The registry: each host's control socket, with the machine it runs on
  (``socket.gethostname()``): a Unix socket only answers on its own machine,
  so a client asks only the hosts of the machine it runs on.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket as _socket
from typing import Any

import psycopg

from streamkit._targets import PostgresTarget
from streamkit.backends._fenced_checkpoints import FencedCheckpoints
from streamkit.backends._retention import Retention
from streamkit.backends._skip_rules import record_skip
from streamkit.backends._status_rows import checkpoint_snapshot_of, status_rows
from streamkit.backends.postgres._backend import PostgresLogBackend, second_log
from streamkit.backends.postgres._connect import connect, session_options, storage_error
from streamkit.backends.postgres.leases import CLOCK as _CLOCK
from streamkit.backends.postgres.leases import Leases
from streamkit.backends.postgres.retention import PostgresRetentionRows
from streamkit.checkpoint import CheckpointRow, ReduceCheckpoint, check_cutover, checkpoint_of
from streamkit.errors import StorageError
from streamkit.events import StreamEvent
from streamkit.log import Log
from streamkit.protocols import CheckpointStorage, Lease, LeaseExchange, LeaseGuard

__all__ = ["PostgresHostStore", "PostgresLeaseRenewer", "registered_sockets"]


class _Tables:
    """The host's statements over the tables of one schema."""

    def __init__(self, schema: str) -> None:
        s = f'"{schema}"'
        self.leases = Leases(schema)
        columns = (
            "reducer_version, reduced_through_offset, state, state_offset, serving, cutover_offset, "
            "retired_at, retain_from "
        )
        self.serving_row = (
            f"SELECT {columns}FROM {s}.streamkit_checkpoints WHERE slug = %s AND serving"
        )
        self.locked_serving_row = f"{self.serving_row} FOR UPDATE"
        self.version_row = (
            f"SELECT {columns}FROM {s}.streamkit_checkpoints "
            "WHERE slug = %s AND reducer_version = %s"
        )
        self.all_checkpoints = (
            f"SELECT slug, {columns}FROM {s}.streamkit_checkpoints "
            'WHERE serving ORDER BY slug COLLATE "C"'
        )
        # The first version written for a slug serves; any other waits for its cutover.
        self.write_checkpoint = (
            f"INSERT INTO {s}.streamkit_checkpoints AS c "
            "(slug, reducer_version, reduced_through_offset, state, state_offset, path, "
            "retain_from, serving) "
            "VALUES (%(slug)s, %(version)s, %(cursor)s, %(state)s, %(state_offset)s, %(path)s, "
            "%(retain_from)s, NOT EXISTS "
            f"(SELECT 1 FROM {s}.streamkit_checkpoints WHERE slug = %(slug)s AND serving)) "
            "ON CONFLICT (slug, reducer_version) DO UPDATE SET "
            "reduced_through_offset = excluded.reduced_through_offset, "
            "state = COALESCE(excluded.state, c.state), state_offset = excluded.state_offset, "
            "path = COALESCE(excluded.path, c.path), retain_from = excluded.retain_from"
        )
        self.versions = (
            f"SELECT {columns}FROM {s}.streamkit_checkpoints WHERE slug = %s "
            'ORDER BY serving DESC, reducer_version COLLATE "C"'
        )
        self.reinstate_row = (
            f"UPDATE {s}.streamkit_checkpoints SET retired_at = NULL WHERE slug = %s "
            "AND reducer_version = %s AND retired_at IS NOT NULL AND NOT serving"
        )
        self.unserve = (
            f"UPDATE {s}.streamkit_checkpoints SET serving = false, retired_at = %s "
            "WHERE slug = %s AND serving"
        )
        self.serve_checkpoint_row = (
            f"INSERT INTO {s}.streamkit_checkpoints AS c "
            "(slug, reducer_version, reduced_through_offset, state, state_offset, path, "
            "retain_from, serving, cutover_offset, retired_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, true, %s, NULL) "
            "ON CONFLICT (slug, reducer_version) DO UPDATE SET "
            "reduced_through_offset = excluded.reduced_through_offset, "
            "state = COALESCE(excluded.state, c.state), state_offset = excluded.state_offset, "
            "path = COALESCE(excluded.path, c.path), retain_from = excluded.retain_from, "
            "serving = true, cutover_offset = excluded.cutover_offset, retired_at = NULL"
        )
        self.stream_heads = (
            f'SELECT path, head FROM {s}.streamkit_heads WHERE head > 0 ORDER BY path COLLATE "C"'
        )
        self.skips = f'SELECT path, slug, "offset", skip_event_offset FROM {s}.streamkit_skips'
        self.skip_at = (
            f"SELECT skip_event_offset FROM {s}.streamkit_skips "
            'WHERE path = %s AND slug = %s AND "offset" = %s'
        )
        self.insert_skip = (
            f'INSERT INTO {s}.streamkit_skips (path, slug, "offset", skip_event_offset) '
            "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
        )
        self.lease_exists = f"SELECT 1 FROM {s}.streamkit_leases WHERE path = %s AND slug = %s"
        self.claims = f"SELECT path, slug, due_at FROM {s}.streamkit_claims"
        self.head = (
            f"SELECT coalesce(greatest((SELECT head FROM {s}.streamkit_heads WHERE path = %(path)s), "
            f'(SELECT max("offset") FROM {s}.streamkit_events WHERE path = %(path)s)), 0)'
        )
        self.lag = f'SELECT count(*) FROM {s}.streamkit_events WHERE path = %s AND "offset" > %s'
        self.unregister_socket = (
            f"DELETE FROM {s}.streamkit_hosts WHERE machine = %s AND socket = %s AND owner != %s"
        )
        self.register = (
            f"INSERT INTO {s}.streamkit_hosts (owner, machine, socket, pid, started_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (owner) DO UPDATE SET "
            "machine = excluded.machine, socket = excluded.socket, pid = excluded.pid"
        )
        self.deregister = f"DELETE FROM {s}.streamkit_hosts WHERE owner = %s"
        self.hosts = (
            f"SELECT owner, socket FROM {s}.streamkit_hosts "
            "WHERE machine = %s AND socket != '' ORDER BY started_at"
        )
        # Beats are stamped and judged by the server's clock: hosts on other machines
        # agree on who is alive whatever their own clocks say.
        self.beat = (
            f"INSERT INTO {s}.streamkit_hosts "
            "(owner, machine, socket, pid, started_at, beat_at, processors) "
            f"VALUES (%s, %s, '', %s, %s, {_CLOCK}, %s) ON CONFLICT (owner) DO UPDATE SET "
            "beat_at = excluded.beat_at, processors = excluded.processors"
        )
        self.live = (
            f"SELECT owner, processors FROM {s}.streamkit_hosts WHERE beat_at > {_CLOCK} - %s"
        )
        self.held_by = (
            f"SELECT owner, count(*) FROM {s}.streamkit_leases "
            "WHERE expires_at > '-Infinity' AND (%s::text IS NULL OR slug = %s) GROUP BY owner"
        )

    # -- checkpoints ------------------------------------------------------------------------

    def read_checkpoint(
        self, conn: psycopg.Connection[Any], slug: str, version: str | None = None
    ) -> ReduceCheckpoint | None:
        if version is None:
            row = conn.execute(self.serving_row, (slug,)).fetchone()
        else:
            row = conn.execute(self.version_row, (slug, version)).fetchone()
        return None if row is None else checkpoint_of(row)

    def upsert_checkpoint(self, conn: psycopg.Connection[Any], row: CheckpointRow) -> None:
        conn.execute(
            self.write_checkpoint,
            {
                "slug": row.slug,
                "version": row.reducer_version,
                "cursor": row.reduced_through_offset,
                "state": row.state_json,
                "state_offset": row.state_offset,
                "path": row.path,
                "retain_from": row.retain_from,
            },
        )

    def serve_checkpoint(
        self, conn: psycopg.Connection[Any], row: CheckpointRow, replacing: str | None
    ) -> None:
        slug, version, through = row.slug, row.reducer_version, row.reduced_through_offset
        # Locked: a writer of the serving row (its checkpoint, another cutover) waits for us.
        serving = conn.execute(self.locked_serving_row, (slug,)).fetchone()
        check_cutover(
            slug, version, through, None if serving is None else checkpoint_of(serving), replacing
        )
        conn.execute(self.unserve, (through, slug))
        conn.execute(self.serve_checkpoint_row, (*row, through))

    def take_over_lease(
        self,
        conn: psycopg.Connection[Any],
        path: str,
        slug: str,
        owner: str,
        now: float,
        ttl: float,
    ) -> Lease:
        return self.leases.take_over(conn, path, slug, owner, now, ttl)

    def release_lease(self, conn: psycopg.Connection[Any], lease: Lease) -> bool:
        return self.leases.release(conn, lease)

    def check_lease(self, conn: psycopg.Connection[Any], lease: Lease, now: float) -> None:
        self.leases.check_fence(conn, lease, now)

    def reinstate(self, conn: psycopg.Connection[Any], slug: str, version: str) -> bool:
        cursor = conn.execute(self.reinstate_row, (slug, version))
        return cursor.rowcount == 1

    # -- skips (the SkipStore of the shared rules) ----------------------------------------

    def recorded_at(
        self, conn: psycopg.Connection[Any], path: str, slug: str, offset: int
    ) -> int | None:
        row = conn.execute(self.skip_at, (path, slug, offset)).fetchone()
        return None if row is None else int(row[0])

    def processor_facts(
        self, conn: psycopg.Connection[Any], path: str, slug: str
    ) -> tuple[bool, int | None]:
        stored = self.read_checkpoint(conn, slug)
        cursor = None if stored is None else stored.reduced_through_offset
        leased = conn.execute(self.lease_exists, (path, slug)).fetchone() is not None
        return cursor is not None or leased, cursor

    def insert(
        self, conn: psycopg.Connection[Any], path: str, slug: str, offset: int, at: int
    ) -> None:
        conn.execute(self.insert_skip, (path, slug, offset, at))

    # -- the registry -----------------------------------------------------------------------

    def sockets_for(
        self, conn: psycopg.Connection[Any], machine: str, slug: str | None
    ) -> list[str]:
        rows = conn.execute(self.hosts, (machine,)).fetchall()
        held = {str(o): int(n) for o, n in conn.execute(self.held_by, (slug, slug))}
        ordered = sorted(rows, key=lambda row: -held.get(str(row[0]), 0))
        return [str(socket) for _, socket in ordered]

    # -- the durable status -----------------------------------------------------------------

    def status(self, conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
        checkpoints = [
            (str(row[0]), checkpoint_of(row[1:])) for row in conn.execute(self.all_checkpoints)
        ]

        def head_and_lag(path: str, cursor: int) -> tuple[int, int]:
            head = conn.execute(self.head, {"path": path}).fetchone()
            lag = conn.execute(self.lag, (path, cursor)).fetchone()
            return int(head[0]) if head else 0, int(lag[0]) if lag else 0

        claims = [(str(p), str(s), float(d)) for p, s, d in conn.execute(self.claims)]
        return status_rows(self.leases.leases(conn), claims, checkpoints, head_and_lag)


class PostgresLeaseRenewer:
    """Renews leases over a connection of its own, opened on first use (again after a failure)."""

    def __init__(self, target: PostgresTarget, tables: _Tables, timeout: float) -> None:
        self._target = target
        self._tables = tables
        self._options = session_options(timeout)
        self._conn: psycopg.Connection[Any] | None = None

    def renew(self, lease: Lease, now: float, ttl: float) -> Lease:
        """Renew ``lease`` in its own transaction (LeaseLost if taken)."""
        conn = self._conn
        if conn is None or conn.broken or conn.closed:
            conn = self._conn = connect(
                self._target.conninfo, self._target.shown, options=self._options, role="leases"
            )
        try:
            with conn.transaction():
                return self._tables.leases.renew(conn, lease, now, ttl)
        except psycopg.Error as exc:
            self.close()  # reconnect at the next renewal
            raise storage_error(
                exc, f"renewing the lease of {lease.slug!r}", outcome="the lease was not renewed"
            ) from exc

    def close(self) -> None:
        """Close the connection; the next renewal opens a new one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


class PostgresHostStore:
    """A host's tables in the PostgreSQL schema of ``log``."""

    def __init__(self, log: Log) -> None:
        backend = log.backend
        assert isinstance(backend, PostgresLogBackend)
        self._log = log
        self._target = backend.target
        self._tables = _Tables(backend.target.schema)
        self.retention = Retention(
            log,
            PostgresRetentionRows(backend.target.schema),
            self.live_hosts,
            functools.partial(
                connect, backend.target.conninfo, backend.target.shown, role="retention"
            ),
            functools.partial(second_log, backend),
        )

    async def prepare(self) -> None:
        """Nothing to do: opening the log created every table a host keeps."""

    async def read_lease(self, path: str, slug: str) -> Lease | None:
        """The stored lease row of ``(path, slug)``."""
        return await self._log.query(
            functools.partial(self._tables.leases.read_lease, path=path, slug=slug)
        )

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
        """One conditional upsert on the writer connection (see ``leases``)."""
        return await self._log.write_transaction(
            functools.partial(
                self._tables.leases.try_acquire,
                path=path,
                slug=slug,
                owner=owner,
                now=now,
                ttl=ttl,
                stale=stale,
            )
        )

    async def release(self, lease: Lease) -> bool:
        """Release ``lease`` (its row and generation stay)."""
        return await self._log.write_transaction(
            functools.partial(self._tables.leases.release, lease=lease)
        )

    def check_fence(self, conn: psycopg.Connection[Any], lease: Lease, now: float) -> None:
        """The stored half of a fence, inside the caller's write transaction."""
        self._tables.leases.check_fence(conn, lease, now)

    def lease_renewer(self, timeout: float) -> PostgresLeaseRenewer:
        """A renewer over its own connection to the server."""
        return PostgresLeaseRenewer(self._target, self._tables, timeout)

    def checkpoints(
        self, guard: LeaseGuard, path: str = "/", exchange: LeaseExchange | None = None
    ) -> CheckpointStorage:
        """Checkpoints in this schema, each save fenced by ``guard`` in its transaction."""
        return FencedCheckpoints(self._log, guard, self._tables, path, exchange)

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
        return await FencedCheckpoints(self._log, guard, self._tables, path).begin(
            slug, reducer_version=version, state_json=state_json, start=start, after=after, by=by
        )

    async def version_rows(
        self, slug: str, version: str
    ) -> tuple[ReduceCheckpoint | None, ReduceCheckpoint | None]:
        """``(serving, own)``: the slug's serving checkpoint and ``version``'s, each None if none."""
        read = self._tables.read_checkpoint
        return await self._log.query(lambda conn: (read(conn, slug), read(conn, slug, version)))

    async def checkpoint_versions(self, slug: str) -> list[ReduceCheckpoint]:
        """Every version's checkpoint of ``slug``: the serving one first, then by version."""
        query = self._tables.versions
        return await self._log.query(
            lambda conn: [checkpoint_of(row) for row in conn.execute(query, (slug,))]
        )

    async def reinstate(self, slug: str, version: str) -> bool:
        """Lift the retirement of ``slug``'s ``version`` (a rollback); whether one was lifted."""
        return await self._log.write_transaction(
            lambda conn: self._tables.reinstate(conn, slug, version)
        )

    async def stored_snapshot(self, slug: str) -> dict[str, Any]:
        """``slug``'s checkpoint as ``{offset, state, version, source}``."""
        stored = await self._log.query(lambda conn: self._tables.read_checkpoint(conn, slug))
        return checkpoint_snapshot_of(slug, stored)

    async def load_skips(self) -> dict[tuple[str, str], dict[int, int]]:
        """Every recorded skip."""
        rows = await self._log.query(lambda conn: conn.execute(self._tables.skips).fetchall())
        skips: dict[tuple[str, str], dict[int, int]] = {}
        for path, slug, offset, at in rows:
            skips.setdefault((str(path), str(slug)), {})[int(offset)] = int(at)
        return skips

    async def record_skip(
        self, path: str, slug: str, offset: int, *, by: str, reason: str
    ) -> StreamEvent:
        """Skip ``offset`` for ``slug`` on ``path`` (the shared rules, this schema's tables)."""
        return await record_skip(
            self._log, path, slug, offset, by=by, reason=reason, store=self._tables
        )

    async def register(self, owner: str, socket: str, pid: int, now: float) -> None:
        """Enter a host in the registry, on the machine it runs on."""
        tables, machine = self._tables, _socket.gethostname()

        def write(conn: psycopg.Connection[Any]) -> None:
            # A socket path belongs to one live host of its machine: a dead one's row goes.
            conn.execute(tables.unregister_socket, (machine, socket, owner))
            conn.execute(tables.register, (owner, machine, socket, pid, now))

        await self._log.write_transaction(write)

    async def deregister(self, owner: str) -> None:
        """Remove a host from the registry."""
        statement = self._tables.deregister
        await self._log.write_transaction(lambda conn: conn.execute(statement, (owner,)))

    async def host_beat(self, owner: str, processors: list[str], now: float) -> None:
        """Record that ``owner`` is alive (by the server's clock) and what it runs."""
        statement, machine = self._tables.beat, _socket.gethostname()
        args = (owner, machine, os.getpid(), now, json.dumps(processors))
        await self._log.write_transaction(lambda conn: conn.execute(statement, args))

    async def live_hosts(self, now: float, ttl: float) -> dict[str, list[str]]:
        """The hosts that beat within ``ttl`` by the server's clock (``now`` is not used)."""
        del now
        statement = self._tables.live
        rows = await self._log.query(lambda conn: conn.execute(statement, (ttl,)).fetchall())
        return {str(owner): [str(k) for k in json.loads(keys)] for owner, keys in rows}

    async def leases(self) -> list[Lease]:
        """Every lease row (held, expired or released)."""
        rows = await self._log.query(self._tables.leases.leases)
        return [lease for lease, _ in rows]

    async def stream_heads(self) -> list[tuple[str, int]]:
        """Every path with a durable event and its head (the heads table: one row a path)."""
        rows = await self._log.query(
            lambda conn: conn.execute(self._tables.stream_heads).fetchall()
        )
        return [(str(path), int(head)) for path, head in rows]

    async def durable_status(self, now: float | None = None) -> list[dict[str, Any]]:
        """What the database alone says about each processor (held: by the server's clock)."""
        del now  # a lease is in force by the server's clock here, not the caller's
        return await self._log.query(self._tables.status)

    async def durable_lag(self, path: str, cursor: int) -> int:
        """Durable events of ``path`` past ``cursor``."""
        statement = self._tables.lag
        row = await self._log.query(lambda conn: conn.execute(statement, (path, cursor)).fetchone())
        return int(row[0]) if row else 0


def registered_sockets(target: PostgresTarget, slug: str | None = None) -> list[str]:
    """The control sockets of this machine's hosts on the log, the holder of ``slug`` first.

    Its own short connection (a client asking where to send a request); empty
    when the server cannot be reached or no host registered yet.
    """
    tables = _Tables(target.schema)
    try:
        conn = connect(target.conninfo, target.shown)
    except StorageError:
        return []
    try:
        return tables.sockets_for(conn, _socket.gethostname(), slug)
    except psycopg.Error:
        return []  # no registry to read: the default socket is still tried
    finally:
        conn.close()

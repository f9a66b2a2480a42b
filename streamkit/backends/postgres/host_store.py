"""The host half of the PostgreSQL backend: :class:`PostgresHostRows`, a host's tables in a schema.

Every table a host keeps lives in the log's schema, next to the events
(:mod:`._schema` creates them when the log is opened), so a fenced write and
the rows it guards commit in one transaction on the log's writer
connection (the backend-neutral
:class:`~streamkit.backends._host_store.LogHostStore` decides which
connection each verb runs on; :func:`postgres_host_store` builds it). The
lease keeper gets a connection of its own (:class:`PostgresLeaseRenewer`),
so renewals run while the event loop is busy.

- Checkpoints: one row per slug and version; a save is ONE upsert behind
  the lease fence (:mod:`.leases`) in the same transaction, so a host that
  lost its lease writes nothing.
- The registry: each host's control socket, with the machine it runs on
  (``socket.gethostname()``): a Unix socket only answers on its own machine,
  so a client asks only the hosts of the machine it runs on. Beats are
  stamped and judged by the server's clock, so hosts on several machines
  agree on who is alive whatever their own clocks say.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket as _socket
from collections.abc import Callable
from typing import Any

import psycopg

from streamkit._targets import PostgresTarget
from streamkit.backends._host_store import LogHostStore
from streamkit.backends._status_rows import status_rows
from streamkit.backends.postgres._backend import PostgresLogBackend, second_log
from streamkit.backends.postgres._connect import connect, session_options, storage_error
from streamkit.backends.postgres.leases import CLOCK as _CLOCK
from streamkit.backends.postgres.leases import Leases
from streamkit.backends.postgres.retention import PostgresRetentionRows
from streamkit.checkpoint import CheckpointRow, ReduceCheckpoint, check_cutover, checkpoint_of
from streamkit.errors import StorageError
from streamkit.log import Log
from streamkit.protocols import Lease

__all__ = ["PostgresHostRows", "PostgresLeaseRenewer", "postgres_host_store", "registered_sockets"]


class PostgresHostRows:
    """A host's tables in one schema (see :class:`~streamkit.backends._host_store.HostRows`)."""

    def __init__(self, schema: str) -> None:
        self.make_tables: Callable[[psycopg.Connection[Any]], None] | None = None  # made at open
        s = f'"{schema}"'
        self.lease_rows = Leases(schema)
        columns = (
            "reducer_version, reduced_through_offset, state, state_offset, serving, cutover_offset, "
            "retired_at, retain_from "
        )
        self._serving_row = (
            f"SELECT {columns}FROM {s}.streamkit_checkpoints WHERE slug = %s AND serving"
        )
        self._locked_serving_row = f"{self._serving_row} FOR UPDATE"
        self._version_row = (
            f"SELECT {columns}FROM {s}.streamkit_checkpoints "
            "WHERE slug = %s AND reducer_version = %s"
        )
        self._all_checkpoints = (
            f"SELECT slug, {columns}FROM {s}.streamkit_checkpoints "
            'WHERE serving ORDER BY slug COLLATE "C"'
        )
        # The first version written for a slug serves; any other waits for its cutover.
        self._write_checkpoint = (
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
        self._versions = (
            f"SELECT {columns}FROM {s}.streamkit_checkpoints WHERE slug = %s "
            'ORDER BY serving DESC, reducer_version COLLATE "C"'
        )
        self._reinstate_row = (
            f"UPDATE {s}.streamkit_checkpoints SET retired_at = NULL WHERE slug = %s "
            "AND reducer_version = %s AND retired_at IS NOT NULL AND NOT serving"
        )
        self._unserve = (
            f"UPDATE {s}.streamkit_checkpoints SET serving = false, retired_at = %s "
            "WHERE slug = %s AND serving"
        )
        self._serve_checkpoint_row = (
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
        self._write_incidents = (
            f"INSERT INTO {s}.streamkit_version_incidents AS i (slug, reducer_version, record) "
            "VALUES (%s, %s, %s) ON CONFLICT (slug, reducer_version) DO UPDATE SET "
            "record = excluded.record"
        )
        self._incidents = (
            f"SELECT reducer_version, record FROM {s}.streamkit_version_incidents WHERE slug = %s"
        )
        self._heads = (
            f'SELECT path, head FROM {s}.streamkit_heads WHERE head > 0 ORDER BY path COLLATE "C"'
        )
        self._skips = f'SELECT path, slug, "offset", skip_event_offset FROM {s}.streamkit_skips'
        self._skip_at = (
            f"SELECT skip_event_offset FROM {s}.streamkit_skips "
            'WHERE path = %s AND slug = %s AND "offset" = %s'
        )
        self._insert_skip = (
            f'INSERT INTO {s}.streamkit_skips (path, slug, "offset", skip_event_offset) '
            "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
        )
        self._lease_exists = f"SELECT 1 FROM {s}.streamkit_leases WHERE path = %s AND slug = %s"
        self._claims = f"SELECT path, slug, due_at FROM {s}.streamkit_claims"
        self._head = (
            f"SELECT coalesce(greatest((SELECT head FROM {s}.streamkit_heads WHERE path = %(path)s), "
            f'(SELECT max("offset") FROM {s}.streamkit_events WHERE path = %(path)s)), 0)'
        )
        self._lag = f'SELECT count(*) FROM {s}.streamkit_events WHERE path = %s AND "offset" > %s'
        self._unregister_socket = (
            f"DELETE FROM {s}.streamkit_hosts WHERE machine = %s AND socket = %s AND owner != %s"
        )
        self._register = (
            f"INSERT INTO {s}.streamkit_hosts (owner, machine, socket, pid, started_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (owner) DO UPDATE SET "
            "machine = excluded.machine, socket = excluded.socket, pid = excluded.pid"
        )
        self._deregister = f"DELETE FROM {s}.streamkit_hosts WHERE owner = %s"
        self._hosts = (
            f"SELECT owner, socket FROM {s}.streamkit_hosts "
            "WHERE machine = %s AND socket != '' ORDER BY started_at"
        )
        # Beats are stamped and judged by the server's clock: hosts on other machines
        # agree on who is alive whatever their own clocks say.
        self._beat = (
            f"INSERT INTO {s}.streamkit_hosts "
            "(owner, machine, socket, pid, started_at, beat_at, processors) "
            f"VALUES (%s, %s, '', %s, %s, {_CLOCK}, %s) ON CONFLICT (owner) DO UPDATE SET "
            "beat_at = excluded.beat_at, processors = excluded.processors"
        )
        self._live = (
            f"SELECT owner, processors FROM {s}.streamkit_hosts WHERE beat_at > {_CLOCK} - %s"
        )
        self._held_by = (
            f"SELECT owner, count(*) FROM {s}.streamkit_leases "
            "WHERE expires_at > '-Infinity' AND (%s::text IS NULL OR slug = %s) GROUP BY owner"
        )

    # -- checkpoints ------------------------------------------------------------------------

    def read_checkpoint(
        self, conn: psycopg.Connection[Any], slug: str, version: str | None = None
    ) -> ReduceCheckpoint | None:
        if version is None:
            row = conn.execute(self._serving_row, (slug,)).fetchone()
        else:
            row = conn.execute(self._version_row, (slug, version)).fetchone()
        return None if row is None else checkpoint_of(row)

    def upsert_checkpoint(self, conn: psycopg.Connection[Any], row: CheckpointRow) -> None:
        conn.execute(
            self._write_checkpoint,
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
        serving = conn.execute(self._locked_serving_row, (slug,)).fetchone()
        check_cutover(
            slug, version, through, None if serving is None else checkpoint_of(serving), replacing
        )
        conn.execute(self._unserve, (through, slug))
        conn.execute(self._serve_checkpoint_row, (*row, through))

    def write_incidents(
        self, conn: psycopg.Connection[Any], slug: str, version: str, record: str
    ) -> None:
        conn.execute(self._write_incidents, (slug, version, record))

    def incidents(self, conn: psycopg.Connection[Any], slug: str) -> dict[str, str]:
        return {
            str(version): str(record)
            for version, record in conn.execute(self._incidents, (slug,)).fetchall()
        }

    def checkpoint_versions(
        self, conn: psycopg.Connection[Any], slug: str
    ) -> list[ReduceCheckpoint]:
        return [checkpoint_of(row) for row in conn.execute(self._versions, (slug,))]

    def reinstate(self, conn: psycopg.Connection[Any], slug: str, version: str) -> bool:
        cursor = conn.execute(self._reinstate_row, (slug, version))
        return cursor.rowcount == 1

    # -- leases (the rules: :mod:`.leases`) ---------------------------------------------------

    def leases(self, conn: psycopg.Connection[Any]) -> list[Lease]:
        return [lease for lease, _ in self.lease_rows.leases(conn)]

    # -- skips (the SkipStore of the shared rules) ----------------------------------------

    def skips(self, conn: psycopg.Connection[Any]) -> dict[tuple[str, str], dict[int, int]]:
        skips: dict[tuple[str, str], dict[int, int]] = {}
        for path, slug, offset, at in conn.execute(self._skips).fetchall():
            skips.setdefault((str(path), str(slug)), {})[int(offset)] = int(at)
        return skips

    def recorded_at(
        self, conn: psycopg.Connection[Any], path: str, slug: str, offset: int
    ) -> int | None:
        row = conn.execute(self._skip_at, (path, slug, offset)).fetchone()
        return None if row is None else int(row[0])

    def processor_facts(
        self, conn: psycopg.Connection[Any], path: str, slug: str
    ) -> tuple[bool, int | None]:
        stored = self.read_checkpoint(conn, slug)
        cursor = None if stored is None else stored.reduced_through_offset
        leased = conn.execute(self._lease_exists, (path, slug)).fetchone() is not None
        return cursor is not None or leased, cursor

    def insert(
        self, conn: psycopg.Connection[Any], path: str, slug: str, offset: int, at: int
    ) -> None:
        conn.execute(self._insert_skip, (path, slug, offset, at))

    # -- the registry: each host on the machine it runs on; beats by the server's clock -------

    def register(
        self, conn: psycopg.Connection[Any], owner: str, socket: str, pid: int, now: float
    ) -> None:
        machine = _socket.gethostname()
        # A socket path belongs to one live host of its machine: a dead one's row goes.
        conn.execute(self._unregister_socket, (machine, socket, owner))
        conn.execute(self._register, (owner, machine, socket, pid, now))

    def deregister(self, conn: psycopg.Connection[Any], owner: str) -> None:
        conn.execute(self._deregister, (owner,))

    def beat(
        self, conn: psycopg.Connection[Any], owner: str, pid: int, processors: list[str], now: float
    ) -> None:
        conn.execute(self._beat, (owner, _socket.gethostname(), pid, now, json.dumps(processors)))

    def live_hosts(
        self, conn: psycopg.Connection[Any], now: float, ttl: float
    ) -> dict[str, list[str]]:
        del now  # judged by the server's clock: hosts on other machines agree
        rows = conn.execute(self._live, (ttl,)).fetchall()
        return {str(owner): [str(k) for k in json.loads(keys)] for owner, keys in rows}

    def sockets_for(
        self, conn: psycopg.Connection[Any], machine: str, slug: str | None
    ) -> list[str]:
        rows = conn.execute(self._hosts, (machine,)).fetchall()
        held = {str(o): int(n) for o, n in conn.execute(self._held_by, (slug, slug))}
        ordered = sorted(rows, key=lambda row: -held.get(str(row[0]), 0))
        return [str(socket) for _, socket in ordered]

    # -- the durable status -----------------------------------------------------------------

    def status(self, conn: psycopg.Connection[Any], now: float | None) -> list[dict[str, Any]]:
        del now  # a lease is in force by the server's clock here, not the caller's
        checkpoints = [
            (str(row[0]), checkpoint_of(row[1:])) for row in conn.execute(self._all_checkpoints)
        ]

        def head_and_lag(path: str, cursor: int) -> tuple[int, int]:
            head = conn.execute(self._head, {"path": path}).fetchone()
            lag = conn.execute(self._lag, (path, cursor)).fetchone()
            return int(head[0]) if head else 0, int(lag[0]) if lag else 0

        claims = [(str(p), str(s), float(d)) for p, s, d in conn.execute(self._claims)]
        return status_rows(self.lease_rows.leases(conn), claims, checkpoints, head_and_lag)

    def stream_heads(self, conn: psycopg.Connection[Any]) -> list[tuple[str, int]]:
        return [(str(path), int(head)) for path, head in conn.execute(self._heads).fetchall()]

    def durable_lag(self, conn: psycopg.Connection[Any], path: str, cursor: int) -> int:
        row = conn.execute(self._lag, (path, cursor)).fetchone()
        return int(row[0]) if row else 0


class PostgresLeaseRenewer:
    """Renews leases over a connection of its own, opened on first use (again after a failure)."""

    def __init__(self, target: PostgresTarget, leases: Leases, timeout: float) -> None:
        self._target = target
        self._leases = leases
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
                return self._leases.renew(conn, lease, now, ttl)
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


def postgres_host_store(log: Log) -> LogHostStore:
    """What a host keeps in the PostgreSQL schema of ``log``."""
    backend = log.backend
    assert isinstance(backend, PostgresLogBackend)
    target = backend.target
    rows = PostgresHostRows(target.schema)
    return LogHostStore(
        log,
        rows,
        renewer=functools.partial(PostgresLeaseRenewer, target, rows.lease_rows),
        retention_rows=PostgresRetentionRows(target.schema),
        chunk_opener=functools.partial(connect, target.conninfo, target.shown, role="retention"),
        cut_log=functools.partial(second_log, backend),
    )


def registered_sockets(target: PostgresTarget, slug: str | None = None) -> list[str]:
    """The control sockets of this machine's hosts on the log, the holder of ``slug`` first.

    Its own short connection (a client asking where to send a request); empty
    when the server cannot be reached or no host registered yet.
    """
    tables = PostgresHostRows(target.schema)
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

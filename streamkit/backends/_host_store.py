"""What a host keeps beside its log, whatever the backend: one :class:`LogHostStore` over rows.

:class:`LogHostStore` implements :class:`~streamkit.protocols.HostStore`
once: it decides which of the log's connections each verb runs on (a read
on a reader, a write in a transaction of its own on the writer, in order
with appends) and hands the work to the backend's :class:`HostRows`, the
statements over its tables on the connection given. So a fenced write and
the rows it guards commit in one transaction on every backend, and a host
behaves the same on each: only the SQL differs. Checkpoints are
:class:`~streamkit.backends._fenced_checkpoints.FencedCheckpoints` over the
same rows, skips the shared rules of
:mod:`~streamkit.backends._skip_rules`, and retention one
:class:`~streamkit.backends._retention.verbs.Retention`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from streamkit._requests import Connection
from streamkit.backends._fenced_checkpoints import CheckpointRows, FencedCheckpoints
from streamkit.backends._retention.chunk_prep import Opener
from streamkit.backends._retention.cuts import TruncationRows
from streamkit.backends._retention.verbs import Retention
from streamkit.backends._skip_rules import SkipStore, record_skip
from streamkit.backends._status_rows import checkpoint_snapshot_of
from streamkit.checkpoint import ReduceCheckpoint
from streamkit.events import StreamEvent
from streamkit.log import Log
from streamkit.protocols import (
    CheckpointStorage,
    FirstCheckpoint,
    Lease,
    LeaseAsk,
    LeaseExchange,
    LeaseGuard,
    LeaseRenewer,
)

__all__ = ["HostRows", "LogHostStore"]


class HostRows(CheckpointRows, SkipStore, Protocol):
    """A backend's statements over a host's tables, each on the connection it is given.

    Reads run on a reader connection, writes inside the caller's write
    transaction; none begins or ends a transaction. A table a host has not
    made yet reads as empty.
    """

    @property
    def make_tables(self) -> Callable[[Connection], None] | None:
        """Create the host's tables if missing (None: opening the log made them)."""
        ...

    def leases(self, conn: Connection) -> list[Lease]:
        """Every lease row (held, expired or released), by path then slug."""
        ...

    def checkpoint_versions(self, conn: Connection, slug: str) -> list[ReduceCheckpoint]:
        """Every version's checkpoint of ``slug``: the serving one first, then by version."""
        ...

    def reinstate(self, conn: Connection, slug: str, version: str) -> bool:
        """Lift the retirement of ``slug``'s retired ``version``; whether a row changed."""
        ...

    def skips(self, conn: Connection) -> dict[tuple[str, str], dict[int, int]]:
        """Every recorded skip: ``(path, slug) -> {offset: offset of its skip event}``."""
        ...

    def register(self, conn: Connection, owner: str, socket: str, pid: int, now: float) -> None:
        """Enter ``owner`` with its control socket (a dead host's row naming it goes)."""
        ...

    def deregister(self, conn: Connection, owner: str) -> None:
        """Remove ``owner``'s row."""
        ...

    def beat(
        self, conn: Connection, owner: str, pid: int, processors: list[str], now: float
    ) -> None:
        """Record that ``owner`` is alive and which processors it runs."""
        ...

    def live_hosts(self, conn: Connection, now: float, ttl: float) -> dict[str, list[str]]:
        """The hosts that beat within ``ttl``: owner -> the processors it runs."""
        ...

    def status(self, conn: Connection, now: float | None) -> list[dict[str, Any]]:
        """The durable status rows (``_status_rows.status_rows``); ``now`` judges the leases."""
        ...

    def stream_heads(self, conn: Connection) -> list[tuple[str, int]]:
        """Every path with a durable event and its head, by path."""
        ...

    def durable_lag(self, conn: Connection, path: str, cursor: int) -> int:
        """Durable events of ``path`` past ``cursor`` (not ``head - cursor``: offsets have holes)."""
        ...


class LogHostStore:
    """A host's tables in the storage of ``log``, reached through the backend's ``rows``.

    ``renewer(timeout)`` opens the lease keeper's connection of its own;
    ``retention_rows``, ``chunk_opener`` and ``cut_log`` build the
    store's :class:`~streamkit.backends._retention.verbs.Retention`.
    """

    __slots__ = ("_log", "_renewer", "_rows", "retention")

    def __init__(
        self,
        log: Log,
        rows: HostRows,
        *,
        renewer: Callable[[float], LeaseRenewer],
        retention_rows: TruncationRows,
        chunk_opener: Opener | None = None,
        cut_log: Callable[[], Log] | None = None,
    ) -> None:
        self._log = log
        self._rows = rows
        self._renewer = renewer
        self.retention = Retention(log, retention_rows, self.live_hosts, chunk_opener, cut_log)

    async def prepare(self) -> None:
        """Create the host's tables if missing, in one transaction."""
        make = self._rows.make_tables
        if make is not None:
            await self._log.write_transaction(make)

    # -- leases -------------------------------------------------------------------------------

    async def read_lease(self, path: str, slug: str) -> Lease | None:
        """The stored lease row of ``(path, slug)``."""
        read = self._rows.lease_rows.read_lease
        return await self._log.query(lambda conn: read(conn, path, slug))

    async def try_acquire(self, ask: LeaseAsk) -> Lease | None:
        """One conditional statement on the writer connection."""
        return await self._log.write_transaction(
            partial(self._rows.lease_rows.try_acquire, ask=ask)
        )

    async def release(self, lease: Lease) -> bool:
        """Release ``lease`` (its row and generation stay)."""
        release = self._rows.lease_rows.release
        return await self._log.write_transaction(lambda conn: release(conn, lease))

    def check_fence(self, conn: Connection, lease: Lease, now: float) -> None:
        """The stored half of a fence, inside the caller's write transaction."""
        self._rows.lease_rows.check_fence(conn, lease, now)

    def lease_renewer(self, timeout: float) -> LeaseRenewer:
        """A renewer over a connection of its own."""
        return self._renewer(timeout)

    async def leases(self) -> list[Lease]:
        """Every lease row (held, expired or released)."""
        return await self._log.query(self._rows.leases)

    # -- checkpoints --------------------------------------------------------------------------

    def checkpoints(
        self, guard: LeaseGuard, path: str = "/", exchange: LeaseExchange | None = None
    ) -> CheckpointStorage:
        """Checkpoints beside the log, each save fenced by ``guard`` in its transaction."""
        return FencedCheckpoints(self._log, guard, self._rows, path, exchange)

    async def begin_processor(
        self, guard: LeaseGuard, path: str, first: FirstCheckpoint
    ) -> StreamEvent:
        """A new processor's first checkpoint where it declared it starts, with its record."""
        return await FencedCheckpoints(self._log, guard, self._rows, path).begin(first)

    async def version_rows(
        self, slug: str, version: str
    ) -> tuple[ReduceCheckpoint | None, ReduceCheckpoint | None]:
        """``(serving, own)``: the slug's serving checkpoint and ``version``'s, each None if none."""
        read = self._rows.read_checkpoint
        return await self._log.query(
            lambda conn: (read(conn, slug, None), read(conn, slug, version))
        )

    async def checkpoint_versions(self, slug: str) -> list[ReduceCheckpoint]:
        """Every version's checkpoint of ``slug``: the serving one first, then by version."""
        versions = self._rows.checkpoint_versions
        return await self._log.query(lambda conn: versions(conn, slug))

    async def version_incidents(self, slug: str) -> dict[str, dict[str, Any]]:
        """``{version: skip tally}`` of every version of ``slug`` that kept one."""
        read = self._rows.incidents
        stored = await self._log.query(lambda conn: read(conn, slug))
        return {version: json.loads(record) for version, record in stored.items()}

    async def reinstate(self, slug: str, version: str) -> bool:
        """Lift the retirement of ``slug``'s ``version`` (a rollback); whether one was lifted."""
        reinstate = self._rows.reinstate
        return await self._log.write_transaction(lambda conn: reinstate(conn, slug, version))

    async def stored_snapshot(self, slug: str) -> dict[str, Any]:
        """``slug``'s checkpoint as ``{offset, state, version, source}``."""
        read = self._rows.read_checkpoint
        return checkpoint_snapshot_of(
            slug, await self._log.query(lambda conn: read(conn, slug, None))
        )

    # -- skips --------------------------------------------------------------------------------

    async def load_skips(self) -> dict[tuple[str, str], dict[int, int]]:
        """Every recorded skip."""
        return await self._log.query(self._rows.skips)

    async def record_skip(
        self,
        path: str,
        slug: str,
        offset: int,
        *,
        by: str,
        reason: str,
        ahead: bool = False,
        stalled_at: int | None = None,
    ) -> StreamEvent:
        """Skip ``offset`` for ``slug`` on ``path`` (the shared rules, this backend's rows)."""
        return await record_skip(
            self._log,
            path,
            slug,
            offset,
            by=by,
            reason=reason,
            store=self._rows,
            ahead=ahead,
            stalled_at=stalled_at,
        )

    # -- the registry -------------------------------------------------------------------------

    async def register(self, owner: str, socket: str, pid: int, now: float) -> None:
        """Enter a host in the registry."""
        register = self._rows.register
        await self._log.write_transaction(lambda conn: register(conn, owner, socket, pid, now))

    async def deregister(self, owner: str) -> None:
        """Remove a host from the registry."""
        deregister = self._rows.deregister
        await self._log.write_transaction(lambda conn: deregister(conn, owner))

    async def host_beat(self, owner: str, processors: list[str], now: float) -> None:
        """Record that ``owner`` is alive and what it runs (its heartbeat)."""
        beat, pid = self._rows.beat, os.getpid()
        # Short: it may commit on the loop, or ride the appends' next group commit.
        await self._log.write_transaction(
            lambda conn: beat(conn, owner, pid, processors, now), inline=True
        )

    async def live_hosts(self, now: float, ttl: float) -> dict[str, list[str]]:
        """The hosts that beat within ``ttl`` (judged by the backend's clock: see its rows)."""
        live = self._rows.live_hosts
        return await self._log.query(lambda conn: live(conn, now, ttl))

    # -- the durable status -------------------------------------------------------------------

    async def durable_status(self, now: float | None = None) -> list[dict[str, Any]]:
        """What the storage alone says about each processor."""
        status = self._rows.status
        return await self._log.query(lambda conn: status(conn, now))

    async def stream_heads(self) -> list[tuple[str, int]]:
        """Every path with a durable event and its head."""
        return await self._log.query(self._rows.stream_heads)

    async def durable_lag(self, path: str, cursor: int) -> int:
        """Durable events of ``path`` past ``cursor``."""
        lag = self._rows.durable_lag
        return await self._log.query(lambda conn: lag(conn, path, cursor))

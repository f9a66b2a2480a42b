"""A host's checkpoints, whatever the backend: every save fenced by a lease, in one transaction.

:class:`FencedCheckpoints` implements the async
:class:`~streamkit.protocols.CheckpointStorage` over the checkpoint rows a
backend keeps beside its events. Each save is ONE ``log.write_transaction``:
the lease fence (the host's local trust in the lease, then the stored lease
row) and the checkpoint upsert commit together or not at all. A cutover is
ONE append of the control event :data:`~streamkit.checkpoint.CUTOVER_EVENT`
whose seal runs the fence and the serving mark. A version built under a
shadow lease of its own (a :class:`~streamkit.protocols.LeaseExchange`)
first takes the serving lease over (:meth:`FencedCheckpoints.fence_serving`:
the replaced version's holder is fenced from that commit on, so its cursor
is final), reduces up to that cursor, and its cutover is then fenced by the
serving lease and releases the shadow lease. A host whose
lease was taken over (or expired) therefore writes nothing: the save raises
:class:`~streamkit.errors.LeaseLost`, which is not retryable, so the engine
latches it and the host stops that engine. A checkpoint no store may take is
refused by :func:`~streamkit.checkpoint.check_checkpoint` before the
transaction is asked for. A skip tally the engine staged
(:class:`~streamkit.protocols.IncidentStorage`) is written in the
transaction of the next save or cutover of its version, so a checkpoint
never stands past a skip its version's tally does not count. A backend
supplies its row operations (:class:`CheckpointRows`).
"""

from __future__ import annotations

import time
from typing import Protocol

from streamkit._requests import Connection
from streamkit.backends._lease_rules import LeaseRows
from streamkit.checkpoint import (
    BEGAN_EVENT,
    CUTOVER_EVENT,
    CheckpointRow,
    ReduceCheckpoint,
    check_checkpoint,
)
from streamkit.errors import InvalidRequest, LeaseLost
from streamkit.events import StreamEvent
from streamkit.log import Log
from streamkit.protocols import FirstCheckpoint, Lease, LeaseExchange, LeaseGuard

__all__ = ["CheckpointRows", "FencedCheckpoints"]


class CheckpointRows(Protocol):
    """Where a backend keeps checkpoints: a row per slug and version, on a connection."""

    @property
    def lease_rows(self) -> LeaseRows:
        """The backend's lease statements (a cutover takes and releases leases)."""
        ...

    def read_checkpoint(
        self, conn: Connection, slug: str, version: str | None
    ) -> ReduceCheckpoint | None:
        """The stored checkpoint of ``slug`` at ``version`` (None: the serving one), or None."""
        ...

    def upsert_checkpoint(self, conn: Connection, row: CheckpointRow) -> None:
        """Write ``row`` in ONE statement (checked already); a None state keeps the stored one."""
        ...

    def serve_checkpoint(self, conn: Connection, row: CheckpointRow, replacing: str | None) -> None:
        """The cutover of ``row``'s version, inside the caller's transaction (see ``cut_over``)."""
        ...

    def write_incidents(self, conn: Connection, slug: str, version: str, record: str) -> None:
        """Store a version's skip tally (JSON), inside the caller's transaction."""
        ...

    def incidents(self, conn: Connection, slug: str) -> dict[str, str]:
        """``{version: tally JSON}`` of every version of ``slug`` that has one."""
        ...


class FencedCheckpoints:
    """Checkpoints in the log's storage, written only while ``held`` is in force.

    One instance serves one engine incarnation: a host that loses a lease
    builds a new engine (and a new storage) under the next lease it takes.
    """

    __slots__ = ("_exchange", "_log", "_path", "_rows", "_serving", "_staged", "held")

    def __init__(
        self,
        log: Log,
        held: LeaseGuard,
        rows: CheckpointRows,
        path: str = "/",
        exchange: LeaseExchange | None = None,
    ) -> None:
        self._log = log
        self._rows = rows
        self.held = held
        self._path = path
        self._exchange = exchange
        # The serving lease fence_serving took, and when its statement was sent.
        self._serving: tuple[Lease, float] | None = None
        # A skip tally the next checkpoint write carries: (slug, version, JSON).
        self._staged: tuple[str, str, str] | None = None

    def stage_incidents(self, slug: str, version: str, record_json: str) -> None:
        """Have the next write of this version's checkpoint carry its skip tally."""
        self._staged = (slug, version, record_json)

    async def load_incidents(self, slug: str, version: str) -> str | None:
        """The skip tally stored for ``slug`` at ``version``, or None."""
        read = self._rows.incidents
        found = await self._log.query(lambda conn: read(conn, slug))
        return found.get(version)

    def _staged_for(self, slug: str, version: str) -> tuple[str, str, str] | None:
        """The tally a write of ``slug`` at ``version`` carries, if one is staged for it."""
        staged = self._staged
        if staged is not None and staged[0] == slug and staged[1] == version:
            return staged
        return None

    def _written(self, staged: tuple[str, str, str] | None) -> None:
        # Only what this write carried is done: a tally staged meanwhile waits for the next.
        if staged is not None and self._staged is staged:
            self._staged = None

    async def load(self, slug: str, version: str | None = None) -> ReduceCheckpoint | None:
        """The stored checkpoint of ``slug`` at ``version`` (read on the log's reader connection)."""
        read = self._rows.read_checkpoint
        return await self._log.query(lambda conn: read(conn, slug, version))

    async def save(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        state_offset: int | None = None,
        retain_from: int | None = None,
    ) -> None:
        """Check the fence and write the checkpoint in one transaction (LeaseLost: nothing written)."""
        check_checkpoint(
            slug, reducer_version, reduced_through_offset, state_json, state_offset, retain_from
        )
        row = CheckpointRow(
            slug,
            reducer_version,
            reduced_through_offset,
            state_json,
            state_offset,
            self._path,
            retain_from,
        )
        fence = self.held.fence
        upsert = self._rows.upsert_checkpoint
        staged = self._staged_for(slug, reducer_version)
        carry = self._rows.write_incidents

        def fenced_write(conn: Connection) -> None:
            fence(conn)
            upsert(conn, row)
            if staged is not None:
                carry(conn, *staged)

        # Short (a fence read and one upsert): it may commit on the loop when nothing waits
        # (a log that commits inline), else it rides the writer's next group commit.
        await self._log.write_transaction(fenced_write, inline=True, processor=True)
        self._written(staged)

    async def begin(self, first: FirstCheckpoint) -> StreamEvent:
        """A new processor's first checkpoint after ``first.after``, with its record, in one transaction.

        The record (:data:`~streamkit.checkpoint.BEGAN_EVENT`) and the row
        commit together, fenced; refused (InvalidRequest, nothing written) if
        the slug has a checkpoint by then.
        """
        slug, after = first.slug, first.after
        check_checkpoint(slug, first.version, after, first.state_json, None, None)
        row = CheckpointRow(slug, first.version, after, first.state_json, None, self._path, None)
        rows, fence = self._rows, self.held.fence

        def seal(conn: Connection, events: list[StreamEvent]) -> None:
            fence(conn)
            if rows.read_checkpoint(conn, slug, None) is not None:
                raise InvalidRequest(
                    f"processor {slug!r} has a checkpoint already: it began meanwhile; nothing "
                    "was written",
                    details={"slug": slug, "path": self._path},
                )
            rows.upsert_checkpoint(conn, row)

        payload = {
            "slug": slug,
            "version": first.version,
            "start": first.start,
            "from": after + 1,
            "skipped": after,
            "by": first.by,
        }
        return await self._log.append_control(
            self._path, {"type": BEGAN_EVENT, "payload": payload}, seal
        )

    async def fence_serving(self, slug: str) -> None:
        """Before a cutover: the serving version moves no more (see ``CheckpointStorage``).

        Built under a shadow lease, this takes the serving lease over, in a
        transaction fenced by the shadow lease: its holder's next fenced write
        (a checkpoint, an effect) is refused from this commit on, so the
        serving row's cursor is final. Built under the serving lease itself,
        there is nothing to fence: no other host can move it.
        """
        exchange = self._exchange
        if exchange is None:
            return
        leases, path, fence = self._rows.lease_rows, self._path, self.held.fence

        def take(conn: Connection) -> tuple[Lease, float]:
            fence(conn)
            started = time.monotonic()
            return leases.take_over(
                conn, path, slug, exchange.owner, exchange.clock(), exchange.ttl
            ), started

        self._serving = await self._log.write_transaction(take)

    async def cut_over(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        replacing: str | None,
        retain_from: int | None = None,
    ) -> None:
        """The cutover event, the fence and the serving mark in one transaction.

        LeaseLost or CutoverRaced: nothing is written. Built under a shadow
        lease, the fence is the serving lease :meth:`fence_serving` took (it
        must have run), the shadow lease is released in the same
        transaction, and ``taken`` is told the serving lease after it.
        """
        check_checkpoint(
            slug, reducer_version, reduced_through_offset, state_json, None, retain_from
        )
        row = CheckpointRow(
            slug, reducer_version, reduced_through_offset, state_json, None, self._path, retain_from
        )
        rows, exchange, path = self._rows, self._exchange, self._path
        leases = rows.lease_rows
        fence = self.held.fence
        serving = self._serving
        staged = self._staged_for(slug, reducer_version)
        carry = rows.write_incidents
        if exchange is not None and serving is None:
            raise LeaseLost(
                f"processor {slug!r}: the cutover of version {reducer_version!r} needs the "
                "serving lease, which this host has not taken; nothing was written",
                details={"slug": slug, "path": path},
            )

        def seal(conn: Connection, events: list[StreamEvent]) -> None:
            if exchange is None or serving is None:
                fence(conn)
            else:
                lease, started = serving
                if time.monotonic() - started >= exchange.ttl:
                    raise LeaseLost(
                        f"processor {slug!r}: the serving lease taken for the cutover is older "
                        f"than its ttl of {exchange.ttl:g} s by this host's clock; nothing was "
                        "written",
                        details={"slug": slug, "path": path},
                    )
                leases.check_fence(conn, lease, exchange.clock())
                leases.release(conn, exchange.shadow())
            rows.serve_checkpoint(conn, row, replacing)
            if staged is not None:
                carry(conn, *staged)

        payload = {
            "slug": slug,
            "from_version": replacing,
            "to_version": reducer_version,
            "offset": reduced_through_offset,
        }
        await self._log.append_control(path, {"type": CUTOVER_EVENT, "payload": payload}, seal)
        self._written(staged)
        if exchange is not None and serving is not None:
            exchange.taken(*serving)

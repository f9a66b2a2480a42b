"""A host's checkpoints, whatever the backend: every save fenced by a lease, in one transaction.

:class:`FencedCheckpoints` implements the async
:class:`~streamkit.protocols.CheckpointStorage` over the checkpoint rows a
backend keeps beside its events. Each save is ONE ``log.write_transaction``:
the lease fence (the host's local trust in the lease, then the stored lease
row) and the checkpoint upsert commit together or not at all. A host whose
lease was taken over (or expired) therefore writes nothing: the save raises
:class:`~streamkit.errors.LeaseLost`, which is not retryable, so the engine
latches it and the host stops that engine. A checkpoint no store may take is
refused by :func:`~streamkit.checkpoint.check_checkpoint` before the
transaction is asked for. A backend supplies its two row operations
(:class:`CheckpointRows`).
"""

from __future__ import annotations

from typing import Protocol

from streamkit._requests import Connection
from streamkit.checkpoint import ReduceCheckpoint, check_checkpoint
from streamkit.log import Log
from streamkit.protocols import LeaseGuard

__all__ = ["CheckpointRow", "CheckpointRows", "FencedCheckpoints"]

CheckpointRow = tuple[str, str, int, str | None, int | None]
"""``(slug, reducer_version, reduced_through_offset, state_json, state_offset)``, in column order."""


class CheckpointRows(Protocol):
    """Where a backend keeps checkpoints: a row per slug and version, on a connection."""

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


class FencedCheckpoints:
    """Checkpoints in the log's storage, written only while ``held`` is in force.

    One instance serves one engine incarnation: a host that loses a lease
    builds a new engine (and a new storage) under the next lease it takes.
    """

    __slots__ = ("_log", "_rows", "held")

    def __init__(self, log: Log, held: LeaseGuard, rows: CheckpointRows) -> None:
        self._log = log
        self._rows = rows
        self.held = held

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
    ) -> None:
        """Check the fence and write the checkpoint in one transaction (LeaseLost: nothing written)."""
        check_checkpoint(slug, reducer_version, reduced_through_offset, state_json, state_offset)
        row = (slug, reducer_version, reduced_through_offset, state_json, state_offset)
        fence = self.held.fence
        upsert = self._rows.upsert_checkpoint

        def fenced_write(conn: Connection) -> None:
            fence(conn)
            upsert(conn, row)

        # Short (a fence read and one upsert): it may commit on the loop when nothing waits
        # (a log that commits inline), else it rides the writer's next group commit.
        await self._log.write_transaction(fenced_write, inline=True, processor=True)

    async def cut_over(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        replacing: str | None,
    ) -> None:
        """The fence and the cutover in one transaction (LeaseLost, CutoverRaced: nothing written)."""
        check_checkpoint(slug, reducer_version, reduced_through_offset, state_json)
        row = (slug, reducer_version, reduced_through_offset, state_json, None)
        fence = self.held.fence
        serve = self._rows.serve_checkpoint

        def fenced_cutover(conn: Connection) -> None:
            fence(conn)
            serve(conn, row, replacing)

        await self._log.write_transaction(fenced_cutover)

"""A host's checkpoints on a SQLite log: in the log's own file, every write fenced by a lease.

:class:`FencedCheckpointStorage` implements the async
:class:`~streamkit.protocols.CheckpointStorage` over the checkpoint table in
the log's SQLite file (a PostgreSQL log keeps its fenced checkpoints in its
own schema: ``streamkit.backends.postgres.host_store``). Each :meth:`~FencedCheckpointStorage.save` runs ONE
``log.write_transaction``: the lease fence (the host's local trust in the
lease, then the stored row) and the checkpoint UPSERT commit together or not
at all. A host whose lease was taken over (or expired)
therefore writes nothing: the save raises
:class:`~streamkit.errors.LeaseLost`, which is not retryable, so the engine
latches it and the host stops that engine.
"""

from __future__ import annotations

import sqlite3

from streamkit.backends.sqlite.checkpoints import ReduceCheckpointTable
from streamkit.checkpoint import ReduceCheckpoint
from streamkit.log import Log
from streamkit.protocols import LeaseGuard

__all__ = ["FencedCheckpointStorage"]


class FencedCheckpointStorage:
    """Checkpoints in the log's database, written only while ``lease`` is in force.

    One instance serves one engine incarnation: a host that loses a lease
    builds a new engine (and a new storage) under the next lease it takes.
    """

    __slots__ = ("_log", "held")

    def __init__(self, log: Log, held: LeaseGuard) -> None:
        self._log = log
        self.held = held

    async def load(self, slug: str) -> ReduceCheckpoint | None:
        """The stored checkpoint of ``slug`` (read on the log's reader connection)."""
        return await self._log.query(
            lambda conn: ReduceCheckpointTable(conn, create_table=False).read(slug)
        )

    async def save(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        state_offset: int | None = None,
    ) -> None:
        """Check the fence and write the checkpoint in one transaction.

        Raises :class:`~streamkit.errors.LeaseLost` (nothing written) when the
        lease is no longer this host's; the transaction rolls back whole.
        """
        fence = self.held.fence

        def fenced_write(conn: sqlite3.Connection) -> None:
            fence(conn)
            ReduceCheckpointTable(conn, create_table=False).write(
                slug,
                reducer_version=reducer_version,
                reduced_through_offset=reduced_through_offset,
                state_json=state_json,
                state_offset=state_offset,
            )

        # Short (a fence read and one UPSERT): it may commit on the loop when nothing waits.
        await self._log.write_transaction(fenced_write, inline=True, processor=True)

"""Checkpoints in SQLite: :class:`ReduceCheckpointTable`, one row per processor slug.

Guarantees of :class:`ReduceCheckpointTable`, beyond the rules of
:mod:`streamkit.checkpoint`:

- Every write is ONE SQL statement (an UPSERT), so the cursor and the state can
  never be half-written: either the whole row moved or nothing did.
- A table made before the state had its own offset gains the column when the
  class is built with ``create_table=True``; its rows read as current.
- A write leaves no transaction open that it opened itself. When the caller
  already holds a transaction on the connection, the write joins it and the
  caller's commit decides (this is how a host writes outputs and position
  together).
- sqlite3 failures surface as :class:`~streamkit.errors.StorageError` (or
  :class:`~streamkit.errors.StorageBusy` when the lock was held too long).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from streamkit.backends.sqlite._schema import add_state_offset, storage_error
from streamkit.checkpoint import ReduceCheckpoint, check_checkpoint
from streamkit.errors import InvalidRequest, StorageError

__all__ = ["DEFAULT_CHECKPOINT_TABLE", "ReduceCheckpointTable"]

from streamkit.backends.sqlite._schema import CHECKPOINT_TABLE as DEFAULT_CHECKPOINT_TABLE

# The table name is interpolated into SQL (placeholders cannot name tables), so
# only plain identifiers are accepted; quoting then also covers SQL keywords.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")


class ReduceCheckpointTable:
    """Checkpoints in one SQLite table over a connection the caller owns.

    The caller opens and closes ``conn``; this class never closes it. With
    ``create_table=False`` the table must already exist (a host that created it
    once skips the DDL on every later start).
    """

    __slots__ = ("_conn", "_quoted", "table", "writes")

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        table: str = DEFAULT_CHECKPOINT_TABLE,
        create_table: bool = True,
    ) -> None:
        if not isinstance(table, str) or not _IDENTIFIER.match(table):
            raise InvalidRequest(
                f"checkpoint table name {table!r} is not a plain SQL identifier (a letter or "
                "underscore, then letters, digits or underscores, at most 128 characters); "
                "nothing was created",
                details={"table": repr(table)[:200]},
            )
        self._conn = conn
        self.table = table
        self._quoted = f'"{table}"'
        # Checkpoint rows written so far, one statement each; the DDL is not counted.
        self.writes = 0
        if create_table:
            with self._statement("create the checkpoint table"):
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._quoted} ("
                    " slug TEXT PRIMARY KEY,"
                    " reducer_version TEXT NOT NULL,"
                    " reduced_through_offset INTEGER NOT NULL,"
                    " state TEXT,"
                    " state_offset INTEGER"
                    ")"
                )
                add_state_offset(conn, table)

    def read(self, slug: str) -> ReduceCheckpoint | None:
        """The checkpoint of ``slug``, or ``None`` if none was ever written."""
        with self._statement(f'read the checkpoint of "{slug}"'):
            row = self._conn.execute(
                f"SELECT reducer_version, reduced_through_offset, state, state_offset"
                f" FROM {self._quoted} WHERE slug = ?",
                (slug,),
            ).fetchone()
        if row is None:
            return None
        version, offset, state, state_offset = row
        return ReduceCheckpoint(
            reducer_version=str(version),
            reduced_through_offset=int(offset),
            state_json=None if state is None else str(state),
            state_offset=None if state_offset is None else int(state_offset),
        )

    def write(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        state_offset: int | None = None,
    ) -> None:
        """Write the checkpoint of ``slug`` in exactly one statement.

        The version, the cursor and the state's offset always move; the state
        column moves only when ``state_json`` is given. Refusals (bad
        arguments, a state over the ceiling) happen before any SQL, so the
        stored row is untouched.
        """
        check_checkpoint(slug, reducer_version, reduced_through_offset, state_json, state_offset)
        self.upsert((slug, reducer_version, reduced_through_offset, state_json, state_offset))

    def upsert(self, row: tuple[str, str, int, str | None, int | None]) -> None:
        """:meth:`write` of ``(slug, version, cursor, state, state_offset)``, already checked."""
        with self._statement(f'write the checkpoint of "{row[0]}"'):
            self._conn.execute(
                f"INSERT INTO {self._quoted}"
                " (slug, reducer_version, reduced_through_offset, state, state_offset)"
                " VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(slug) DO UPDATE SET"
                " reducer_version = excluded.reducer_version,"
                " reduced_through_offset = excluded.reduced_through_offset,"
                f" state = COALESCE(excluded.state, {self._quoted}.state),"
                " state_offset = excluded.state_offset",
                row,
            )
        self.writes += 1

    async def load(self, slug: str) -> ReduceCheckpoint | None:
        """Async twin of :meth:`read` (runs it directly; SQLite reads here are short)."""
        return self.read(slug)

    async def save(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        state_offset: int | None = None,
    ) -> None:
        """Async twin of :meth:`write` (runs it directly, on the calling thread)."""
        self.write(
            slug,
            reducer_version=reducer_version,
            reduced_through_offset=reduced_through_offset,
            state_json=state_json,
            state_offset=state_offset,
        )

    def slugs(self) -> list[str]:
        """Every slug that has a checkpoint, sorted."""
        with self._statement("list the checkpoint slugs"):
            rows = self._conn.execute(f"SELECT slug FROM {self._quoted} ORDER BY slug").fetchall()
        return [str(slug) for (slug,) in rows]

    @contextmanager
    def _statement(self, action: str) -> Iterator[None]:
        """Run one statement as its own transaction unless the caller holds one.

        A connection in Python's legacy transaction mode opens a transaction
        implicitly before an INSERT; committing it here is what makes "one
        statement, one transaction" hold for every connection mode. A
        transaction the caller opened is theirs to commit or roll back.
        """
        conn = self._conn
        try:
            owned = not conn.in_transaction
        except sqlite3.Error as exc:  # a closed connection refuses even this
            raise _storage_error(exc, action, self.table) from exc
        try:
            yield
            if owned and conn.in_transaction:
                conn.commit()
        except sqlite3.Error as exc:
            if owned:
                _rollback_quietly(conn)
            raise _storage_error(exc, action, self.table) from exc


def _rollback_quietly(conn: sqlite3.Connection) -> None:
    # The statement already failed; a failing rollback must not hide that error.
    try:
        if conn.in_transaction:
            conn.rollback()
    except sqlite3.Error:
        pass


def _storage_error(exc: sqlite3.Error, action: str, table: str) -> StorageError:
    return storage_error(
        exc, action, table=table, outcome="the statement was rolled back, so nothing was written"
    )

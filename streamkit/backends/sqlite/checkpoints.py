"""Checkpoints in SQLite: :class:`ReduceCheckpointTable`, one row per processor slug and version.

Guarantees of :class:`ReduceCheckpointTable`, beyond the rules of
:mod:`streamkit.checkpoint`:

- Every checkpoint write is ONE SQL statement (an UPSERT), so the cursor and the
  state can never be half-written: either the whole row moved or nothing did. A
  cutover (:meth:`ReduceCheckpointTable.serve`) is one savepoint: the check,
  the serving mark and the new version's row commit together or not at all.
- A table of an older layout (no state offset; one row per slug) is brought to
  this one when the class is built with ``create_table=True``; each old row
  serves.
- A skip tally staged for a version (:class:`~streamkit.protocols.IncidentStorage`)
  is written with that version's next row, in one savepoint, to a table beside
  this one (:mod:`streamkit.backends.sqlite.incidents`).
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
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from streamkit.backends.sqlite._layout import create_checkpoint_table
from streamkit.backends.sqlite._schema import storage_error
from streamkit.backends.sqlite.incidents import INCIDENT_TABLE, read_incidents, write_incidents
from streamkit.checkpoint import (
    CheckpointRow,
    ReduceCheckpoint,
    check_checkpoint,
    check_cutover,
    checkpoint_of,
)
from streamkit.errors import InvalidRequest, StorageError

__all__ = ["DEFAULT_CHECKPOINT_TABLE", "ReduceCheckpointTable"]

from streamkit.backends.sqlite._layout import CHECKPOINT_TABLE as DEFAULT_CHECKPOINT_TABLE

P = ParamSpec("P")
R = TypeVar("R")


def _async_twin(method: Callable[P, R], name: str) -> Callable[P, Coroutine[Any, Any, R]]:
    """``method`` as a coroutine function ``name`` with its very signature (run when awaited)."""

    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return method(*args, **kwargs)

    twin.__name__ = name
    twin.__qualname__ = method.__qualname__.rsplit(".", 1)[0] + "." + name
    twin.__doc__ = f"Async twin of :meth:`{method.__name__}`."
    return twin


# The table name is interpolated into SQL (placeholders cannot name tables), so
# only plain identifiers are accepted; quoting then also covers SQL keywords.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")


class ReduceCheckpointTable:
    """Checkpoints in one SQLite table over a connection the caller owns.

    The caller opens and closes ``conn``; this class never closes it. With
    ``create_table=False`` the table must already exist (a host that created it
    once skips the DDL on every later start). ``path`` is the stream its
    processors read, stored on each row it writes: retention reads it to know
    whose history a row holds (None: every path's; see :mod:`streamkit.horizon`).
    """

    __slots__ = ("_conn", "_incidents", "_quoted", "_staged", "path", "table", "writes")

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        table: str = DEFAULT_CHECKPOINT_TABLE,
        create_table: bool = True,
        path: str | None = None,
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
        self.path = path
        self._quoted = f'"{table}"'
        self._incidents = (
            INCIDENT_TABLE if table == DEFAULT_CHECKPOINT_TABLE else f"{table}_incidents"
        )
        # A skip tally the next write of its version carries: (slug, version, JSON).
        self._staged: tuple[str, str, str] | None = None
        # Checkpoint rows written so far, one statement each; the DDL is not counted.
        self.writes = 0
        if create_table:
            with self._statement("create the checkpoint table"):
                create_checkpoint_table(conn, table)

    def read(self, slug: str, version: str | None = None) -> ReduceCheckpoint | None:
        """The checkpoint of ``slug`` at ``version`` (None: the serving one), or None if none."""
        where = "serving" if version is None else "reducer_version = ?"
        arguments = (slug,) if version is None else (slug, version)
        with self._statement(f'read the checkpoint of "{slug}"'):
            row = self._conn.execute(
                "SELECT reducer_version, reduced_through_offset, state, state_offset, serving,"
                f" cutover_offset, retired_at, retain_from FROM {self._quoted} WHERE slug = ? AND {where}",
                arguments,
            ).fetchone()
        return None if row is None else checkpoint_of(row)

    def write(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        state_offset: int | None = None,
        retain_from: int | None = None,
    ) -> None:
        """Write the checkpoint of ``slug`` in exactly one statement.

        The row of ``(slug, reducer_version)``: the cursor and the state's
        offset always move; the state column moves only when ``state_json`` is
        given. The first version written for a slug serves; whether a version
        serves changes only by a cutover (:meth:`serve`). Refusals (bad
        arguments, a state over the ceiling) happen before any SQL, so the
        stored row is untouched.
        """
        check_checkpoint(
            slug, reducer_version, reduced_through_offset, state_json, state_offset, retain_from
        )
        self.upsert(
            CheckpointRow(
                slug,
                reducer_version,
                reduced_through_offset,
                state_json,
                state_offset,
                self.path,
                retain_from,
            )
        )

    def stage_incidents(self, slug: str, version: str, record_json: str) -> None:
        """Have the next write of ``slug`` at ``version`` carry its skip tally (same transaction)."""
        self._staged = (slug, version, record_json)

    async def load_incidents(self, slug: str, version: str) -> str | None:
        """The skip tally stored for ``slug`` at ``version``, or None."""
        return self.incidents(slug).get(version)

    def incidents(self, slug: str) -> dict[str, str]:
        """``{version: skip tally JSON}`` of every version of ``slug`` that kept one."""
        with self._statement(f'read the skip tallies of "{slug}"'):
            return read_incidents(self._conn, slug, self._incidents)

    @contextmanager
    def _carrying(self, slug: str, version: str) -> Iterator[None]:
        """Write the staged tally of ``slug`` at ``version`` with the row, in one savepoint."""
        staged = self._staged
        if staged is None or staged[:2] != (slug, version):
            yield
            return
        conn = self._conn
        conn.execute('SAVEPOINT "streamkit_tally"')
        try:
            yield
            write_incidents(conn, *staged, table=self._incidents)
        except BaseException:
            conn.execute('ROLLBACK TO "streamkit_tally"')
            conn.execute('RELEASE "streamkit_tally"')
            raise
        conn.execute('RELEASE "streamkit_tally"')
        if self._staged is staged:
            self._staged = None

    def upsert(self, row: CheckpointRow) -> None:
        """:meth:`write` of ``row``, already checked (its path, if None, is this table's)."""
        if row.path is None and self.path is not None:
            row = row._replace(path=self.path)
        with (
            self._statement(f'write the checkpoint of "{row.slug}"'),
            self._carrying(row.slug, row.reducer_version),
        ):
            # The first version written for a slug serves; any other waits for its cutover.
            # A row's path is kept once known: a writer that was not told leaves it.
            self._conn.execute(
                f"INSERT INTO {self._quoted}"
                " (slug, reducer_version, reduced_through_offset, state, state_offset, path,"
                " retain_from, serving)"
                " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,"
                f" NOT EXISTS (SELECT 1 FROM {self._quoted} WHERE slug = ?1 AND serving))"
                " ON CONFLICT(slug, reducer_version) DO UPDATE SET"
                " reduced_through_offset = excluded.reduced_through_offset,"
                f" state = COALESCE(excluded.state, {self._quoted}.state),"
                " state_offset = excluded.state_offset,"
                f" path = COALESCE(excluded.path, {self._quoted}.path),"
                " retain_from = excluded.retain_from",
                row,
            )
        self.writes += 1

    def serve_row(self, row: CheckpointRow, replacing: str | None) -> None:
        """:meth:`serve` of ``row`` (its state whole), already checked."""
        if row.path is None and self.path is not None:
            row = row._replace(path=self.path)
        slug, version, through = row.slug, row.reducer_version, row.reduced_through_offset
        with (
            self._statement(f'cut "{slug}" over to version {version!r}'),
            self._carrying(slug, version),
        ):
            conn = self._conn
            conn.execute('SAVEPOINT "streamkit_cutover"')
            try:
                check_cutover(slug, version, through, self.read(slug), replacing)
                conn.execute(
                    f"UPDATE {self._quoted} SET serving = 0, retired_at = ? WHERE slug = ? AND serving",
                    (through, slug),
                )
                conn.execute(
                    f"INSERT INTO {self._quoted} (slug, reducer_version, reduced_through_offset,"
                    " state, state_offset, path, retain_from, serving, cutover_offset, retired_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, NULL)"
                    " ON CONFLICT(slug, reducer_version) DO UPDATE SET"
                    " reduced_through_offset = excluded.reduced_through_offset,"
                    f" state = COALESCE(excluded.state, {self._quoted}.state),"
                    " state_offset = excluded.state_offset,"
                    f" path = COALESCE(excluded.path, {self._quoted}.path),"
                    " retain_from = excluded.retain_from, serving = 1,"
                    " cutover_offset = excluded.cutover_offset, retired_at = NULL",
                    (*row, through),
                )
            except BaseException:
                conn.execute('ROLLBACK TO "streamkit_cutover"')
                conn.execute('RELEASE "streamkit_cutover"')
                raise
            conn.execute('RELEASE "streamkit_cutover"')
        self.writes += 1

    def serve(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        replacing: str | None,
        retain_from: int | None = None,
    ) -> None:
        """The cutover: write this version's checkpoint and make it the serving one, at once.

        Refused with :class:`~streamkit.errors.CutoverRaced`, nothing written,
        unless ``replacing`` (the version the new one was built to replace;
        None: none served) still serves at or below ``reduced_through_offset``
        (:func:`~streamkit.checkpoint.check_cutover`). The replaced row is kept.
        """
        check_checkpoint(
            slug, reducer_version, reduced_through_offset, state_json, None, retain_from
        )
        self.serve_row(
            CheckpointRow(
                slug,
                reducer_version,
                reduced_through_offset,
                state_json,
                None,
                self.path,
                retain_from,
            ),
            replacing,
        )

    # The async twins of CheckpointStorage, each the sync method run on the calling thread
    # (SQLite reads and writes here are short).
    load = _async_twin(read, "load")
    save = _async_twin(write, "save")
    cut_over = _async_twin(serve, "cut_over")

    async def fence_serving(self, slug: str) -> None:
        """Nothing to fence: this table's writers are the caller's to coordinate."""

    def reinstate(self, slug: str, version: str) -> bool:
        """Lift the retirement of ``slug``'s ``version`` (a rollback); whether one was lifted.

        Its row is kept as it was: the version, run again, resumes from it in
        the shadow and cuts over to serve again (see :mod:`streamkit.checkpoint`).
        """
        with self._statement(f'reinstate version {version!r} of "{slug}"'):
            cursor = self._conn.execute(
                f"UPDATE {self._quoted} SET retired_at = NULL WHERE slug = ?"
                " AND reducer_version = ? AND retired_at IS NOT NULL AND NOT serving",
                (slug, version),
            )
        return cursor.rowcount == 1

    def slugs(self) -> list[str]:
        """Every slug that has a serving checkpoint, sorted."""
        with self._statement("list the checkpoint slugs"):
            rows = self._conn.execute(
                f"SELECT slug FROM {self._quoted} WHERE serving ORDER BY slug"
            ).fetchall()
        return [str(slug) for (slug,) in rows]

    def versions(self, slug: str) -> list[ReduceCheckpoint]:
        """Every version's checkpoint of ``slug``, the serving one first, then by version."""
        with self._statement(f'list the checkpoints of "{slug}"'):
            rows = self._conn.execute(
                "SELECT reducer_version, reduced_through_offset, state, state_offset, serving,"
                f" cutover_offset, retired_at, retain_from FROM {self._quoted} WHERE slug = ?"
                " ORDER BY serving DESC, reducer_version",
                (slug,),
            ).fetchall()
        return [checkpoint_of(row) for row in rows]

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

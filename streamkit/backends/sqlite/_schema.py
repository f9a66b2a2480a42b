"""The SQLite file of a log: what a streamkit log looks like on disk and how one is opened.

Opening refuses, without modifying a byte, any file that is not a streamkit log
of a schema this code knows: the file is inspected through a read-only
connection before any statement that could write (``journal_mode`` included).
A missing or empty file becomes a new log, and a file of an older layout is
upgraded in place when a writer opens it (the tables and the steps:
:mod:`streamkit.backends.sqlite._layout`). Every ``sqlite3`` error that
crosses this boundary is converted to a coded :class:`~streamkit.errors.StorageError`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from streamkit.backends.sqlite._layout import (
    HEADS_TRIGGER,
    SCHEMA,
    SCHEMA_VERSION,
    UPGRADABLE,
    upgrade_tables,
)
from streamkit.backends.sqlite._wal_guard import refuse_replaced_wal
from streamkit.errors import LogOpenError, StorageBusy, StorageError

__all__ = [
    "MEMORY",
    "connect_read_only",
    "connect_reader",
    "connect_writer",
    "is_busy",
    "storage_error",
]

MEMORY = ":memory:"

_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite saying another connection holds a lock it needs."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _BUSY_CODES


def storage_error(
    exc: sqlite3.Error,
    doing: str,
    *,
    table: str | None = None,
    outcome: str = "the transaction was rolled back and nothing was written",
) -> StorageError:
    """The coded error for a ``sqlite3`` failure while ``doing`` something (raise it ``from exc``).

    The one conversion of the SQLite backend: busy (another connection held
    the lock past the busy timeout) is :class:`~streamkit.errors.StorageBusy`,
    retryable; anything else is :class:`~streamkit.errors.StorageError`.
    ``outcome`` says what became of the write (a statement inside a caller's
    transaction changes nothing, and the caller's rollback decides the rest).
    """
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    details: dict[str, str | None] = {"sqlite_error": name}
    where = ""
    if table is not None:
        details["table"] = table
        where = f" (table {table!r})"
    if is_busy(exc):
        return StorageBusy(
            f"{doing}{where} was refused: the database stayed locked by another connection "
            f"past the busy timeout ({exc}); {outcome}; retry, or raise busy_timeout",
            details=details,
        )
    return StorageError(
        f"{doing}{where} failed in SQLite ({name}: {exc}); {outcome}",
        details=details,
    )


def _refuse(path: str, why: str, reason: str = "not_a_log") -> LogOpenError:
    return LogOpenError(
        f"cannot open {path!r} as a streamkit log: {why}; the file was not modified",
        details={"path": path, "reason": reason},
    )


def _not_writable(path: str, exc: BaseException) -> LogOpenError:
    return _refuse(
        path,
        f"it cannot be written here ({exc}): the file, its directory (SQLite keeps its "
        "-wal and -shm files beside it) or the file system is read-only to this process. "
        "Appending and running a host need write access; `streamkit read`, `status` and "
        "`snapshot` open it read-only, and from Python open_log(path, read_only=True) does",
        "not_writable",
    )


def _damaged(path: str, exc: BaseException) -> LogOpenError:
    return _refuse(
        path,
        f"the file is damaged (SQLite says: {exc}), truncated or overwritten. Check it with "
        f"`sqlite3 {path} 'PRAGMA integrity_check'`; if that reports errors, restore the log "
        "from a backup (docs/host.md, 'Backups of the SQLite file')",
        "damaged",
    )


_READONLY_CODES = frozenset({sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM})


def _classify(path: str, exc: sqlite3.Error) -> LogOpenError | None:
    """A refusal that says what is really wrong with ``path``, or None if it is not known."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == sqlite3.SQLITE_CORRUPT or "malformed" in str(exc):
        return _damaged(path, exc)
    if primary in _READONLY_CODES or not _writable(path):
        return _not_writable(path, exc)
    return None


def _writable(path: str) -> bool:
    directory = os.path.dirname(os.path.abspath(path))
    return (
        os.access(directory, os.W_OK)
        and (not os.path.exists(path) or os.access(path, os.W_OK))
        and _fs_writable(directory)
    )


def _fs_writable(directory: str) -> bool:
    try:
        return not os.statvfs(directory).f_flag & os.ST_RDONLY
    except OSError:
        return True


def _inspect(path: str) -> bool:
    """Whether ``path`` needs a schema; raise :class:`LogOpenError` if it is not ours.

    Runs on a read-only connection so that a refused file is never touched.
    """
    if not os.path.exists(path):
        parent = Path(path).parent
        if not parent.is_dir():
            raise _refuse(path, f"its directory {str(parent)!r} does not exist")
        return True
    if os.path.isdir(path):
        raise _refuse(path, "it is a directory")
    if os.path.getsize(path) == 0:
        return True
    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro"
    try:
        probe = sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise _refuse(path, f"SQLite could not open it ({exc})") from exc
    try:
        tables = {
            row[0] for row in probe.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if "streamkit_meta" not in tables:
            if tables:
                raise _refuse(
                    path,
                    "it is a SQLite database with other tables and no streamkit_meta table "
                    "(not a streamkit log)",
                )
            return True
        row = probe.execute(
            "SELECT value FROM streamkit_meta WHERE key = 'schema_version'"
        ).fetchone()
    except sqlite3.DatabaseError as exc:
        known = _classify(path, exc)
        if known is not None:
            raise known from exc
        raise _refuse(path, f"it is not a SQLite database ({exc})") from exc
    finally:
        probe.close()
    _check_version(path, None if row is None else row[0], upgradable=True)
    return False


def _upgrade(conn: sqlite3.Connection, path: str) -> None:
    """Bring a file of an older layout to :data:`SCHEMA_VERSION`, in one transaction.

    The steps are :func:`~streamkit.backends.sqlite._layout.upgrade_tables`'.
    The version moves in the same transaction, so a release that does not
    know a table refuses the file instead of misreading it.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute(
            "SELECT value FROM streamkit_meta WHERE key = 'schema_version'"
        ).fetchone()
        version = None if row is None else str(row[0])
        if version in UPGRADABLE:
            upgrade_tables(conn, version)
            conn.execute(
                "UPDATE streamkit_meta SET value = ? WHERE key = 'schema_version'",
                (str(SCHEMA_VERSION),),
            )
        else:
            _check_version(path, version)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _check_version(path: str, version: object, *, upgradable: bool = False) -> None:
    if upgradable and str(version) in UPGRADABLE:
        return
    if str(version) in UPGRADABLE:
        raise _refuse(
            path,
            f"its schema_version is {version!r}, written by an earlier streamkit; it is "
            f"upgraded to {SCHEMA_VERSION} when a host (or any writer) opens it with write access",
        )
    if str(version) != str(SCHEMA_VERSION):
        raise _refuse(
            path,
            f"its schema_version is {version!r} and this streamkit reads version "
            f"{SCHEMA_VERSION} only (open it with the streamkit release that wrote it)",
        )


def _initialize(conn: sqlite3.Connection, path: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        # executescript() would COMMIT first; run statement by statement inside BEGIN IMMEDIATE
        # so two processes creating one file at once cannot interleave.
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(HEADS_TRIGGER)
        conn.execute(
            "INSERT OR IGNORE INTO streamkit_meta (key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )
        row = conn.execute(
            "SELECT value FROM streamkit_meta WHERE key = 'schema_version'"
        ).fetchone()
        _check_version(path, row[0])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def connect_writer(
    path: str, *, synchronous: Literal["FULL", "NORMAL"], busy_timeout: float
) -> sqlite3.Connection:
    """Open (creating or initializing if needed) the one writer connection of a log."""
    if path != MEMORY:
        refuse_replaced_wal(path)
    fresh = True if path == MEMORY else _inspect(path)
    try:
        conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=busy_timeout
        )
    except sqlite3.Error as exc:
        raise _refuse(path, f"SQLite could not open it ({exc})") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        if fresh:
            # Only possible before the first table (and before WAL writes the header):
            # pages freed by deleting rows can then be handed back to the file system
            # with PRAGMA incremental_vacuum, with no whole-file VACUUM.
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        if path != MEMORY:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise _refuse(path, f"SQLite kept journal_mode {mode!r} instead of WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        if fresh:
            _initialize(conn, path)
        else:
            # Another process may have changed the file between the probe and now.
            row = conn.execute(
                "SELECT value FROM streamkit_meta WHERE key = 'schema_version'"
            ).fetchone()
            version = None if row is None else row[0]
            _check_version(path, version, upgradable=True)
            if str(version) in UPGRADABLE:
                _upgrade(conn, path)
    except sqlite3.Error as exc:
        conn.close()
        known = _classify(path, exc) if path != MEMORY else None
        if known is not None:
            raise known from exc
        raise storage_error(exc, f"opening the log {path!r}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def connect_read_only(path: str, *, busy_timeout: float) -> sqlite3.Connection:
    """A connection that only reads ``path``: for a log this process may not write.

    Opened with ``mode=ro``. A log in WAL mode on a read-only file system can
    only be read when nothing lies in its WAL (SQLite cannot create the
    ``-shm`` file there): with no ``-wal`` file the main file is the whole
    log, and it is then opened as immutable.
    """
    base = "file:" + quote(os.path.abspath(path))
    if not os.path.exists(path):
        raise _refuse(path, "there is no such file", "missing")
    attempts = [base + "?mode=ro"]
    if not os.path.exists(path + "-wal"):
        attempts.append(base + "?mode=ro&immutable=1")
    error: sqlite3.Error | None = None
    for uri in attempts:
        try:
            conn = sqlite3.connect(
                uri, uri=True, isolation_level=None, check_same_thread=False, timeout=busy_timeout
            )
            row = conn.execute(
                "SELECT value FROM streamkit_meta WHERE key = 'schema_version'"
            ).fetchone()
        except sqlite3.Error as exc:
            error = exc
            with contextlib.suppress(Exception):
                conn.close()
            continue
        _check_version(path, None if row is None else row[0])
        return conn
    assert error is not None
    if isinstance(error, sqlite3.DatabaseError) and (
        "malformed" in str(error) or getattr(error, "sqlite_errorcode", 0) & 0xFF == 11
    ):
        raise _damaged(path, error) from error
    raise _refuse(path, f"SQLite could not open it read-only ({error})", "unreadable") from error


def connect_reader(path: str, *, busy_timeout: float) -> sqlite3.Connection:
    """A second connection for reads: WAL lets it read while the writer commits."""
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=busy_timeout
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        # A read-only guard: a query() callback that tries to write fails instead of
        # racing the writer thread for the lock.
        conn.execute("PRAGMA query_only = 1")
    except sqlite3.Error as exc:
        conn.close()
        raise storage_error(exc, f"opening a reader on {path!r}") from exc
    return conn

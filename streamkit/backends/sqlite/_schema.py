"""The SQLite file of a log: what a streamkit log looks like on disk and how one is opened.

Opening refuses, without modifying a byte, any file that is not a streamkit log
of a schema this code knows: the file is inspected through a read-only
connection before any statement that could write (``journal_mode`` included).
A missing or empty file becomes a new log. Every ``sqlite3`` error that
crosses this boundary is converted to a coded :class:`~streamkit.errors.StorageError`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from streamkit.backends.sqlite._wal_guard import refuse_replaced_wal
from streamkit.errors import LogOpenError, StorageBusy, StorageError

__all__ = [
    "CHECKPOINT_TABLE",
    "HOLDS_TABLE",
    "MEMORY",
    "SCHEMA_VERSION",
    "SEGMENTS_TABLE",
    "add_retention_columns",
    "add_state_offset",
    "connect_reader",
    "connect_writer",
    "create_checkpoint_table",
    "is_busy",
    "recount_stored_types",
    "storage_error",
]

MEMORY = ":memory:"
SCHEMA_VERSION = 8
"""The layout this release writes. 2: a checkpoint's state has an offset of its own. 3: an
event row records the version of its payload's shape. 4: the summary of stored types
(``streamkit_stored_types``, see :mod:`streamkit.backends._stored_types`). 5: a checkpoint
row per slug and contract version, one of them marked serving (:mod:`streamkit.checkpoint`).
6: a path's durable head is kept in its ``streamkit_heads`` row, written in each commit, and
idempotency keys in ``streamkit_keys`` (:mod:`streamkit.backends._keys`) instead of an index
over the events. 7: a checkpoint row names its path and what its state still needs
(``retain_from``), operators' holds on history are kept in ``streamkit_holds``
(:mod:`streamkit.horizon`), a path's heads row says through which offset its history was
taken (``truncated_through``) and the archived ranges are recorded in
``streamkit_segments``. 8: a path's key window is kept in ``streamkit_key_windows``
(:mod:`streamkit.key_window`), and the keys of taken events are indexed by when their
events were created."""

CHECKPOINT_TABLE = "streamkit_checkpoints"
"""The table a host keeps its checkpoints in (made by the host store, not at open)."""

_UPGRADABLE = frozenset({"1", "2", "3", "4", "5", "6", "7"})
"""Older layouts the writer upgrades in place when it opens the file."""

# One row per stored (path, type, payload version), moved in each commit's transaction
# (see streamkit.backends._stored_types).
_STORED_TYPES_TABLE = """
CREATE TABLE IF NOT EXISTS streamkit_stored_types (
    path TEXT NOT NULL,
    type TEXT NOT NULL,
    version INTEGER NOT NULL,
    events INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    PRIMARY KEY (path, type, version)
) WITHOUT ROWID
"""

# One row per idempotency key ever used, which outlives its event's row (see
# streamkit.backends._keys); the hash and time are recorded when the row goes.
_KEYS_TABLE = """
CREATE TABLE IF NOT EXISTS streamkit_keys (
    path TEXT NOT NULL,
    key TEXT NOT NULL,
    "offset" INTEGER NOT NULL,
    body_sha256 TEXT,
    created_at TEXT,
    PRIMARY KEY (path, key)
) WITHOUT ROWID
"""

# A path's key window (see streamkit.key_window): how long keys of taken events answer.
# No row: forever. The index finds the keys a window lets go: only a taken event's key
# has a created_at.
KEY_WINDOWS_TABLE = """
CREATE TABLE IF NOT EXISTS streamkit_key_windows (
    path TEXT PRIMARY KEY,
    keep_for REAL NOT NULL,
    set_by TEXT NOT NULL,
    reason TEXT NOT NULL,
    set_at REAL NOT NULL
) WITHOUT ROWID
"""
RECORDED_KEYS_INDEX = """
CREATE INDEX IF NOT EXISTS streamkit_keys_recorded ON streamkit_keys (path, created_at)
WHERE created_at IS NOT NULL
"""

# An operator's hold on a path's history from an offset on (see streamkit.horizon):
# retention keeps every event at or after it until the hold is released or expires.
HOLDS_TABLE = """
CREATE TABLE IF NOT EXISTS streamkit_holds (
    path TEXT NOT NULL,
    name TEXT NOT NULL,
    from_offset INTEGER NOT NULL,
    until REAL,
    placed_by TEXT NOT NULL,
    reason TEXT NOT NULL,
    placed_at REAL NOT NULL,
    PRIMARY KEY (path, name)
) WITHOUT ROWID
"""

# Each archived range of a path, in a segment file of its own, chained by hash (see
# streamkit.backends._segments); a range deleted without an archive has none.
SEGMENTS_TABLE = """
CREATE TABLE IF NOT EXISTS streamkit_segments (
    path TEXT NOT NULL,
    first_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    count INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    file TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    prev_sha256 TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (path, first_offset)
) WITHOUT ROWID
"""

# Events are keyed by (path, offset) in a WITHOUT ROWID table: a read of a
# path's range is one ordered b-tree walk and an append writes one b-tree (and
# a keyed one a row of streamkit_keys; bench/bench_log.py measured the layout
# against a rowid table with a unique index). The heads table holds each path's durable head,
# moved in the transaction of every commit that stores an event, and the block
# of offsets reserved for ephemerals: the head never goes back, whatever rows
# are deleted, so an offset is never handed out twice (see ._offsets).
_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS streamkit_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streamkit_events (
    path TEXT NOT NULL,
    "offset" INTEGER NOT NULL,
    type TEXT NOT NULL,
    payload TEXT NOT NULL,
    metadata TEXT NOT NULL,
    source TEXT,
    idempotency_key TEXT,
    created_at TEXT NOT NULL,
    payload_version INTEGER,
    PRIMARY KEY (path, "offset")
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streamkit_heads (
    path TEXT PRIMARY KEY,
    reserved_through INTEGER NOT NULL,
    reserved_by TEXT NOT NULL,
    head INTEGER NOT NULL DEFAULT 0,
    truncated_through INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streamkit_claims (
    path TEXT NOT NULL,
    slug TEXT NOT NULL,
    due_at REAL NOT NULL,
    PRIMARY KEY (path, slug)
) WITHOUT ROWID;
"""
    + _STORED_TYPES_TABLE
    + ";"
    + _KEYS_TABLE
    + ";"
    + HOLDS_TABLE
    + ";"
    + SEGMENTS_TABLE
    + ";"
    + KEY_WINDOWS_TABLE
    + ";"
    + RECORDED_KEYS_INDEX
)

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


def add_state_offset(conn: sqlite3.Connection, table: str = CHECKPOINT_TABLE) -> None:
    """Give a checkpoint table made before states had their own offset its column.

    Its rows keep NULL there, which reads as "the state is the cursor's": true
    of every row such a release wrote, since it wrote the state every batch.
    """
    columns = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
    if columns and "state_offset" not in columns:
        conn.execute(f'ALTER TABLE "{table}" ADD COLUMN state_offset INTEGER')


def _table_names(conn: sqlite3.Connection) -> set[str]:
    return {
        str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }


def create_checkpoint_table(conn: sqlite3.Connection, table: str = CHECKPOINT_TABLE) -> None:
    """Make the checkpoint table ``table``, or bring one of an older layout to this one.

    One row per (slug, contract version); a partial unique index lets one row
    per slug be the serving one. A table of one row per slug (schema 4 and
    before) is copied into the new shape, each row serving since offset 0
    (it was the only version), in the caller's transaction.
    """
    quoted = f'"{table}"'
    columns = {row[1] for row in conn.execute(f"PRAGMA table_info({quoted})")}
    if columns and "serving" in columns:
        add_retention_columns(conn, table)
        return
    if columns:
        add_state_offset(conn, table)
        conn.execute(f'ALTER TABLE {quoted} RENAME TO "{table}_before_versions"')
    conn.execute(
        f"CREATE TABLE {quoted} ("
        " slug TEXT NOT NULL,"
        " reducer_version TEXT NOT NULL,"
        " reduced_through_offset INTEGER NOT NULL,"
        " state TEXT,"
        " state_offset INTEGER,"
        " serving INTEGER NOT NULL DEFAULT 0,"
        " cutover_offset INTEGER NOT NULL DEFAULT 0,"
        " retired_at INTEGER,"
        " path TEXT,"
        " retain_from INTEGER,"
        " PRIMARY KEY (slug, reducer_version)"
        ")"
    )
    conn.execute(f'CREATE UNIQUE INDEX "{table}_serving" ON {quoted} (slug) WHERE serving')
    if columns:
        conn.execute(
            f"INSERT INTO {quoted} (slug, reducer_version, reduced_through_offset, state,"
            " state_offset, serving, cutover_offset)"
            " SELECT slug, reducer_version, reduced_through_offset, state, state_offset, 1, 0"
            f' FROM "{table}_before_versions"'
        )
        conn.execute(f'DROP TABLE "{table}_before_versions"')


def add_retention_columns(conn: sqlite3.Connection, table: str = CHECKPOINT_TABLE) -> None:
    """Give a checkpoint table made before retention its ``path`` and ``retain_from`` columns.

    An old row's path is taken from the leases when its slug was leased on
    one path only; else it stays NULL, which holds every path's history back
    (safe: nothing it may need can go) until its host next writes the row.
    NULL in ``retain_from`` reads as "nothing before the cursor", true of
    every row written before processors could say otherwise.
    """
    quoted = f'"{table}"'
    columns = {row[1] for row in conn.execute(f"PRAGMA table_info({quoted})")}
    if "path" in columns:
        return
    conn.execute(f"ALTER TABLE {quoted} ADD COLUMN path TEXT")
    conn.execute(f"ALTER TABLE {quoted} ADD COLUMN retain_from INTEGER")
    if "streamkit_leases" in _table_names(conn):
        conn.execute(
            f"UPDATE {quoted} SET path = (SELECT min(l.path) FROM streamkit_leases l"
            f" WHERE l.slug = {quoted}.slug) WHERE (SELECT count(DISTINCT l.path)"
            f" FROM streamkit_leases l WHERE l.slug = {quoted}.slug) = 1"
        )


def add_payload_version(conn: sqlite3.Connection) -> None:
    """Give an events table made before payloads had versions its column (NULL reads as 1)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(streamkit_events)")}
    if "payload_version" not in columns:
        conn.execute("ALTER TABLE streamkit_events ADD COLUMN payload_version INTEGER")


_COUNT_STORED_TYPES = """
INSERT INTO streamkit_stored_types (path, type, version, events, first_offset, last_offset)
SELECT path, type, coalesce(payload_version, 1), count(*), min("offset"), max("offset")
FROM streamkit_events GROUP BY path, type, coalesce(payload_version, 1)
"""


# Each path found by walking the primary key from one path to the next (no scan of
# the rows between), with its last offset: a few index probes per path.
_COUNT_HEADS = """
INSERT INTO streamkit_heads (path, reserved_through, reserved_by, head)
WITH RECURSIVE p(x) AS (
    SELECT min(path) FROM streamkit_events
    UNION ALL
    SELECT (SELECT min(path) FROM streamkit_events WHERE path > x) FROM p WHERE x IS NOT NULL
)
SELECT x, 0, '', (SELECT max("offset") FROM streamkit_events WHERE path = x)
FROM p WHERE x IS NOT NULL
ON CONFLICT (path) DO UPDATE SET head = max(head, excluded.head)
"""


def add_durable_heads(conn: sqlite3.Connection) -> None:
    """Give a log made before heads were kept its ``head`` column, set from the rows once."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(streamkit_heads)")}
    if "head" not in columns:
        conn.execute("ALTER TABLE streamkit_heads ADD COLUMN head INTEGER NOT NULL DEFAULT 0")
    conn.execute(_COUNT_HEADS)


_COPY_KEYS = """
INSERT INTO streamkit_keys (path, key, "offset")
SELECT path, idempotency_key, "offset" FROM streamkit_events WHERE idempotency_key IS NOT NULL
"""


def add_key_table(conn: sqlite3.Connection) -> None:
    """Move a log's idempotency keys from the index over its events to their own table."""
    conn.execute(_KEYS_TABLE)
    conn.execute(_COPY_KEYS)
    conn.execute("DROP INDEX IF EXISTS streamkit_events_idempotency")


def add_stored_types(conn: sqlite3.Connection) -> None:
    """Give a log made before the summary of stored types its table, counted from the rows."""
    conn.execute(_STORED_TYPES_TABLE)
    recount_stored_types(conn)


def recount_stored_types(conn: sqlite3.Connection) -> None:
    """Count the summary of stored types from the events again (in the caller's write lock)."""
    conn.execute("DELETE FROM streamkit_stored_types")
    conn.execute(_COUNT_STORED_TYPES)


def _upgrade(conn: sqlite3.Connection, path: str) -> None:
    """Bring a file of an older layout to :data:`SCHEMA_VERSION`, in one transaction.

    1 to 2: the checkpoint table gains ``state_offset`` (NULL on every old
    row: that release wrote the state every batch, so it is the cursor's).
    2 to 3: the events table gains ``payload_version`` (NULL on every old
    row, read as version 1: no release before it knew another). Adding a
    column rewrites no row. 3 to 4: the summary of stored types is made and
    counted from the events, the one time it reads the whole log (0.17 s
    for 300,000 events, measured). 4 to 5: the checkpoint table (when a host
    made one) becomes one row per slug and version, each old row serving
    (:func:`create_checkpoint_table`). 5 to 6: the heads table gains ``head``,
    set to each path's last offset (an index probe or two per path), and the
    idempotency keys are copied from the index over the events (read in
    that index's order) to ``streamkit_keys``, and the index dropped. 6 to
    7: the checkpoint table gains ``path`` and ``retain_from``
    (:func:`add_retention_columns`), the holds and segments tables are made
    and the heads gain ``truncated_through`` (0: nothing taken). 7 to 8:
    the key windows table and the index of recorded keys are made. The
    version moves in the same transaction,
    so a release that does not know a table refuses the file instead of
    misreading it.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute(
            "SELECT value FROM streamkit_meta WHERE key = 'schema_version'"
        ).fetchone()
        version = None if row is None else str(row[0])
        if version in _UPGRADABLE:
            if version not in ("5", "6"):
                add_payload_version(conn)
                add_stored_types(conn)
            if version != "6":
                add_durable_heads(conn)
                add_key_table(conn)
            if CHECKPOINT_TABLE in _table_names(conn):
                create_checkpoint_table(conn)
            conn.execute(HOLDS_TABLE)
            conn.execute(SEGMENTS_TABLE)
            conn.execute(KEY_WINDOWS_TABLE)
            conn.execute(RECORDED_KEYS_INDEX)
            heads = {row[1] for row in conn.execute("PRAGMA table_info(streamkit_heads)")}
            if "truncated_through" not in heads:
                conn.execute(
                    "ALTER TABLE streamkit_heads"
                    " ADD COLUMN truncated_through INTEGER NOT NULL DEFAULT 0"
                )
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
    if upgradable and str(version) in _UPGRADABLE:
        return
    if str(version) in _UPGRADABLE:
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
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
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
            if str(version) in _UPGRADABLE:
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

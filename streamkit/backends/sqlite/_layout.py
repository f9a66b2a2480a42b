"""The tables of a streamkit log in SQLite, and the steps that bring an older file to them.

:data:`SCHEMA` makes a new log's tables; :func:`upgrade_tables` brings a file
of an older layout (:data:`UPGRADABLE`) to :data:`SCHEMA_VERSION`, inside the
caller's write transaction, by exactly the steps each version after it added:
a step never rereads or rewrites what a later version already had. The
checkpoint table is made by a host store, not at open
(:func:`create_checkpoint_table`).
"""

from __future__ import annotations

import sqlite3

__all__ = [
    "CHECKPOINT_TABLE",
    "HEADS_TRIGGER",
    "SCHEMA",
    "SCHEMA_VERSION",
    "UPGRADABLE",
    "add_retention_columns",
    "add_state_offset",
    "create_checkpoint_table",
    "recount_stored_types",
    "table_names",
    "upgrade_tables",
]
SCHEMA_VERSION = 10
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
events were created. 9: a commit no longer moves the heads row; a trigger raises it when
a row above it is deleted (:data:`HEADS_TRIGGER`). 10: a commit no longer moves the summary
of stored types, now ``streamkit_type_summary``; each heads row says through which offset
it counts its path (``summarized_through``, see :mod:`._summary`)."""

CHECKPOINT_TABLE = "streamkit_checkpoints"
"""The table a host keeps its checkpoints in (made by the host store, not at open)."""

UPGRADABLE = frozenset({"1", "2", "3", "4", "5", "6", "7", "8", "9"})
"""Older layouts the writer upgrades in place when it opens the file."""

# One row per stored (path, type, payload version), made by the first event's commit and
# settled in steps (see streamkit.backends.sqlite._summary). Layouts 4 to 9 kept it in
# streamkit_stored_types, moved in every commit: an upgraded file keeps that table for a
# writer of such a release still appending (it moves it, harmlessly: nothing reads it).
_TYPE_SUMMARY_TABLE = """
CREATE TABLE IF NOT EXISTS streamkit_type_summary (
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
# streamkit.backends._retention.segments); a range deleted without an archive has none.
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
# against a rowid table with a unique index). The heads table holds, for each path,
# the block of offsets reserved for ephemerals and a floor under its durable head:
# set by the path's first stored event, raised by the trigger below whenever a row
# above it is deleted. The durable head is the greater of the floor and the newest
# row, so it never goes back, whatever rows are deleted, and an offset is never
# handed out twice (see ._offsets), while a commit writes no heads row.
SCHEMA = (
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
    truncated_through INTEGER NOT NULL DEFAULT 0,
    summarized_through INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streamkit_claims (
    path TEXT NOT NULL,
    slug TEXT NOT NULL,
    due_at REAL NOT NULL,
    PRIMARY KEY (path, slug)
) WITHOUT ROWID;
"""
    + _TYPE_SUMMARY_TABLE
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


HEADS_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS streamkit_events_deleted AFTER DELETE ON streamkit_events
FOR EACH ROW WHEN OLD."offset" > coalesce((SELECT head FROM streamkit_heads WHERE path = OLD.path), 0)
BEGIN
    INSERT INTO streamkit_heads (path, reserved_through, reserved_by, head)
    VALUES (OLD.path, 0, '', OLD."offset")
    ON CONFLICT (path) DO UPDATE SET head = max(head, excluded.head);
END
"""
"""Whoever deletes a row above its path's recorded head (a user with a SQL shell, say)
raises the head to it in the same transaction, so its offset is never handed out again.
Its body holds semicolons: it runs on its own, never split out of :data:`SCHEMA`. A
retention run raises the head to the newest row before it deletes, so its deletes,
all below it, never fire the body."""


def add_state_offset(conn: sqlite3.Connection, table: str = CHECKPOINT_TABLE) -> None:
    """Give a checkpoint table made before states had their own offset its column.

    Its rows keep NULL there, which reads as "the state is the cursor's": true
    of every row such a release wrote, since it wrote the state every batch.
    """
    columns = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
    if columns and "state_offset" not in columns:
        conn.execute(f'ALTER TABLE "{table}" ADD COLUMN state_offset INTEGER')


def table_names(conn: sqlite3.Connection) -> set[str]:
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
    if "streamkit_leases" in table_names(conn):
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
INSERT INTO streamkit_type_summary (path, type, version, events, first_offset, last_offset)
SELECT path, type, coalesce(payload_version, 1), count(*), min("offset"), max("offset")
FROM streamkit_events WHERE true GROUP BY path, type, coalesce(payload_version, 1)
ON CONFLICT (path, type, version) DO UPDATE SET events = excluded.events,
    first_offset = excluded.first_offset, last_offset = excluded.last_offset
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


def recount_stored_types(conn: sqlite3.Connection) -> None:
    """Count the summary of stored types from the events again (in the caller's write lock).

    Rows are zeroed and counted, never deleted (a writer may remember that
    one exists, see :mod:`._summary`), and every path's mark moves to its
    newest row: the rows count everything.
    """
    conn.execute("UPDATE streamkit_type_summary SET events = 0")
    conn.execute(_COUNT_STORED_TYPES)
    conn.execute(_MARK_ALL)


_MARK_ALL = """
UPDATE streamkit_heads SET summarized_through = max(summarized_through,
    coalesce((SELECT max("offset") FROM streamkit_events e WHERE e.path = streamkit_heads.path), 0))
"""


def add_type_summary(conn: sqlite3.Connection) -> None:
    """Give a file made before the summary was settled in steps its table and marks.

    A file of layout 4 to 9 has its summary carried over as it stands:
    those releases moved ``streamkit_stored_types`` in every commit, so it is
    exact and counts the archived events too (which the events table no
    longer holds); that table stays for a writer of such a release still
    appending. An older file's summary is counted from its events, the one
    time it reads the whole log. Then every path's mark is its newest row.
    """
    conn.execute(_TYPE_SUMMARY_TABLE)
    heads = {row[1] for row in conn.execute("PRAGMA table_info(streamkit_heads)")}
    if "summarized_through" not in heads:
        conn.execute(
            "ALTER TABLE streamkit_heads ADD COLUMN summarized_through INTEGER NOT NULL DEFAULT 0"
        )
    if "streamkit_stored_types" in table_names(conn):
        conn.execute(
            "INSERT INTO streamkit_type_summary"
            " (path, type, version, events, first_offset, last_offset)"
            " SELECT path, type, version, events, first_offset, last_offset"
            " FROM streamkit_stored_types WHERE events > 0"
        )
        conn.execute(_MARK_ALL)
    else:
        recount_stored_types(conn)


def upgrade_tables(conn: sqlite3.Connection, version: str) -> None:
    """Bring the tables of a file of layout ``version`` (one of :data:`UPGRADABLE`) to
    :data:`SCHEMA_VERSION`, in the caller's transaction; the caller moves the version.

    1 to 2: the checkpoint table gains ``state_offset`` (NULL on every old
    row: that release wrote the state every batch, so it is the cursor's).
    2 to 3: the events table gains ``payload_version`` (NULL on every old
    row, read as version 1: no release before it knew another). Adding a
    column rewrites no row. 3 to 4: the summary of stored types (made at
    the step to 10 now). 4 to 5: the checkpoint table (when a host
    made one) becomes one row per slug and version, each old row serving
    (:func:`create_checkpoint_table`). 5 to 6: the heads table gains ``head``,
    set to each path's last offset (an index probe or two per path), and the
    idempotency keys are copied from the index over the events (read in
    that index's order) to ``streamkit_keys``, and the index dropped. 6 to
    7: the checkpoint table gains ``path`` and ``retain_from``
    (:func:`add_retention_columns`), the holds and segments tables are made
    and the heads gain ``truncated_through`` (0: nothing taken). 7 to 8:
    the key windows table and the index of recorded keys are made. 8 to 9:
    the trigger that raises a head when a row above it is deleted
    (:data:`HEADS_TRIGGER`; every heads row is exact already: those
    releases moved it in each commit). 9 to 10: the heads gain
    ``summarized_through`` and the summary of stored types moves to its own
    table: carried over from a file of 4 to 9 (exact, archived events
    counted), counted from the events of an older one, the one time it reads
    the whole log (0.17 s for 300,000 events, measured) (:func:`add_type_summary`).
    """
    old = int(version)
    if old < 5:
        add_payload_version(conn)
    if old < 6:
        add_durable_heads(conn)
        add_key_table(conn)
    if old < 7:
        if CHECKPOINT_TABLE in table_names(conn):
            create_checkpoint_table(conn)
        conn.execute(HOLDS_TABLE)
        conn.execute(SEGMENTS_TABLE)
        heads = {row[1] for row in conn.execute("PRAGMA table_info(streamkit_heads)")}
        if "truncated_through" not in heads:
            conn.execute(
                "ALTER TABLE streamkit_heads ADD COLUMN truncated_through INTEGER NOT NULL DEFAULT 0"
            )
    if old < 8:
        conn.execute(KEY_WINDOWS_TABLE)
        conn.execute(RECORDED_KEYS_INDEX)
    if old < 9:
        conn.execute(HEADS_TRIGGER)
    if old < 10:
        add_type_summary(conn)

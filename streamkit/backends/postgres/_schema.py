"""The tables of a streamkit log in PostgreSQL, their version, and creating them exactly once.

A log lives in one PostgreSQL schema (see :mod:`._target`). Its tables:

- ``streamkit_meta``: one row, the schema version this layout has (and when
  it was made); a layout of a newer streamkit is refused, never changed;
- ``streamkit_events``: one row per durable event, keyed ``(path, "offset")``;
  the payload, metadata and source are the JSON texts streamkit validated and
  encoded (``text``, so a read gives back exactly what was written; cast to
  ``jsonb`` to query them);
- ``streamkit_keys``: every idempotency key used, unique within its path,
  with its event's offset; it outlives the event's row
  (:mod:`streamkit.backends._keys`);
- ``streamkit_heads``: one row per path, its last durable offset and the
  block of offsets reserved for ephemerals. An append takes the row with
  ``UPDATE ... RETURNING`` inside its transaction, so appends to one path
  commit one after another, in offset order, and a rolled-back append leaves
  no hole (see docs/postgres.md for why this and not a sequence); it also
  keeps the path's latest ``created_at`` (``stamped``), so stamps follow
  offset order whichever host commits;
- ``streamkit_claims``: the alarm claims, one per ``(path, claimant)``;
- ``streamkit_stored_types``: per (path, type, payload version) the number
  of events and their first and last offsets, moved in each commit's
  transaction (:mod:`streamkit.backends._stored_types`);
- what hosts keep: ``streamkit_leases`` (:mod:`.leases`),
  ``streamkit_checkpoints``, ``streamkit_version_incidents``, ``streamkit_skips`` and
  ``streamkit_hosts``
  (:mod:`.host_store`), and operators' holds on history, ``streamkit_holds``
  (:mod:`.retention`).

:func:`ensure_schema` creates whatever is missing in ONE transaction and
records the version. Hosts starting together may all run it: creating a
schema or a table that a concurrent creator made first fails on the
catalog's unique names, and the loser rolls back and looks again, finding
everything in place. No advisory lock is involved (they fail behind a
transaction-mode pooler); the catalog itself is the arbiter.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql

from streamkit.errors import LogOpenError

__all__ = ["SCHEMA_VERSION", "ensure_schema", "recount_stored_types", "stored_version"]

SCHEMA_VERSION = 9
"""The layout this release writes and reads. 2: a checkpoint's state has an offset of its own.
3: an event row records the version of its payload's shape. 4: the summary of stored types
(``streamkit_stored_types``, see :mod:`streamkit.backends._stored_types`). 5: a checkpoint
row per slug and contract version, one of them marked serving (:mod:`streamkit.checkpoint`).
6: idempotency keys in ``streamkit_keys`` (:mod:`streamkit.backends._keys`) instead of an
index over the events. 7: a checkpoint row names its path and what its state still needs
(``retain_from``), operators' holds on history are kept in ``streamkit_holds``
(:mod:`streamkit.horizon`), a path's heads row says through which offset its history was
taken (``truncated_through``) and the archived ranges are recorded in ``streamkit_segments``.
8: a path's key window is kept in ``streamkit_key_windows`` (:mod:`streamkit.key_window`),
and the keys of taken events are indexed by when their events were created.
9: each version's skips are kept in ``streamkit_version_incidents``
(:mod:`streamkit.engine._skip_tally`).

A log of version 1 to 8 is upgraded in place when opened; any other is refused.
"""

_STATE_OFFSET = (
    "ALTER TABLE {schema}.streamkit_checkpoints ADD COLUMN IF NOT EXISTS state_offset bigint"
)
_PAYLOAD_VERSION = (
    "ALTER TABLE {schema}.streamkit_events ADD COLUMN IF NOT EXISTS payload_version smallint"
)
_STORED_TYPES = """CREATE TABLE IF NOT EXISTS {schema}.streamkit_stored_types (
        path text NOT NULL,
        type text NOT NULL,
        version integer NOT NULL,
        events bigint NOT NULL,
        first_offset bigint NOT NULL,
        last_offset bigint NOT NULL,
        PRIMARY KEY (path, type, version)
    )"""
_COUNT_STORED_TYPES = (
    "INSERT INTO {schema}.streamkit_stored_types "
    "(path, type, version, events, first_offset, last_offset) "
    'SELECT path, type, coalesce(payload_version, 1), count(*), min("offset"), max("offset") '
    "FROM {schema}.streamkit_events GROUP BY path, type, coalesce(payload_version, 1)"
)
_SERVING_INDEX = (
    "CREATE UNIQUE INDEX IF NOT EXISTS streamkit_checkpoints_serving "
    "ON {schema}.streamkit_checkpoints (slug) WHERE serving"
)
_CHECKPOINT_VERSIONS = (
    # Every row a release before 5 wrote is its slug's only version: it serves.
    "ALTER TABLE {schema}.streamkit_checkpoints "
    "ADD COLUMN IF NOT EXISTS serving boolean NOT NULL DEFAULT true",
    "ALTER TABLE {schema}.streamkit_checkpoints ALTER COLUMN serving SET DEFAULT false",
    "ALTER TABLE {schema}.streamkit_checkpoints "
    "ADD COLUMN IF NOT EXISTS cutover_offset bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {schema}.streamkit_checkpoints ADD COLUMN IF NOT EXISTS retired_at bigint",
    "ALTER TABLE {schema}.streamkit_checkpoints DROP CONSTRAINT streamkit_checkpoints_pkey",
    "ALTER TABLE {schema}.streamkit_checkpoints ADD PRIMARY KEY (slug, reducer_version)",
    _SERVING_INDEX,
)
# One row per idempotency key ever used, which outlives its event's row (see
# streamkit.backends._keys); the hash and time are recorded when the row goes.
_KEYS = """CREATE TABLE IF NOT EXISTS {schema}.streamkit_keys (
        path text NOT NULL,
        key text NOT NULL,
        "offset" bigint NOT NULL,
        body_sha256 text,
        created_at text,
        PRIMARY KEY (path, key)
    )"""
_KEY_TABLE = (
    _KEYS,
    'INSERT INTO {schema}.streamkit_keys (path, key, "offset") '
    'SELECT path, idempotency_key, "offset" FROM {schema}.streamkit_events '
    "WHERE idempotency_key IS NOT NULL",
    "DROP INDEX IF EXISTS {schema}.streamkit_events_idempotency",
)
# An operator's hold on a path's history from an offset on (see streamkit.horizon).
_HOLDS = """CREATE TABLE IF NOT EXISTS {schema}.streamkit_holds (
        path text NOT NULL,
        name text NOT NULL,
        from_offset bigint NOT NULL,
        until double precision,
        placed_by text NOT NULL,
        reason text NOT NULL,
        placed_at double precision NOT NULL,
        PRIMARY KEY (path, name)
    )"""
# Each archived range of a path, in a segment file of its own, chained by hash (see
# streamkit.backends._retention.segments); a range deleted without an archive has none.
_SEGMENTS = """CREATE TABLE IF NOT EXISTS {schema}.streamkit_segments (
        path text NOT NULL,
        first_offset bigint NOT NULL,
        last_offset bigint NOT NULL,
        count bigint NOT NULL,
        bytes bigint NOT NULL,
        file text NOT NULL,
        sha256 text NOT NULL,
        prev_sha256 text,
        created_at text NOT NULL,
        PRIMARY KEY (path, first_offset)
    )"""
_RETENTION = (
    "ALTER TABLE {schema}.streamkit_checkpoints ADD COLUMN IF NOT EXISTS path text",
    "ALTER TABLE {schema}.streamkit_checkpoints ADD COLUMN IF NOT EXISTS retain_from bigint",
    # An old row's path, where its slug was leased on one path only; else NULL, which
    # holds every path's history back until its host next writes the row.
    "UPDATE {schema}.streamkit_checkpoints c SET path = l.path FROM ("
    "SELECT slug, min(path) AS path FROM {schema}.streamkit_leases GROUP BY slug "
    "HAVING count(DISTINCT path) = 1) l WHERE l.slug = c.slug AND c.path IS NULL",
    _HOLDS,
    _SEGMENTS,
    "ALTER TABLE {schema}.streamkit_heads "
    "ADD COLUMN IF NOT EXISTS truncated_through bigint NOT NULL DEFAULT 0",
)
# A path's key window (see streamkit.key_window); no row: forever. The index finds the
# keys a window lets go: only a taken event's key has a created_at.
_KEY_WINDOWS = (
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_key_windows (
        path text PRIMARY KEY,
        keep_for double precision NOT NULL,
        set_by text NOT NULL,
        reason text NOT NULL,
        set_at double precision NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS streamkit_keys_recorded ON {schema}.streamkit_keys "
    "(path, created_at) WHERE created_at IS NOT NULL",
)
_INCIDENTS = """CREATE TABLE IF NOT EXISTS {schema}.streamkit_version_incidents (
    slug text NOT NULL,
    reducer_version text NOT NULL,
    record text NOT NULL,
    PRIMARY KEY (slug, reducer_version)
)"""

_UPGRADES = {
    1: (
        _STATE_OFFSET,
        _PAYLOAD_VERSION,
        _STORED_TYPES,
        _COUNT_STORED_TYPES,
        *_CHECKPOINT_VERSIONS,
        *_KEY_TABLE,
        *_RETENTION,
        *_KEY_WINDOWS,
        _INCIDENTS,
    ),
    2: (
        _PAYLOAD_VERSION,
        _STORED_TYPES,
        _COUNT_STORED_TYPES,
        *_CHECKPOINT_VERSIONS,
        *_KEY_TABLE,
        *_RETENTION,
        *_KEY_WINDOWS,
        _INCIDENTS,
    ),
    3: (
        _STORED_TYPES,
        _COUNT_STORED_TYPES,
        *_CHECKPOINT_VERSIONS,
        *_KEY_TABLE,
        *_RETENTION,
        *_KEY_WINDOWS,
        _INCIDENTS,
    ),
    4: (*_CHECKPOINT_VERSIONS, *_KEY_TABLE, *_RETENTION, *_KEY_WINDOWS, _INCIDENTS),
    5: (*_KEY_TABLE, *_RETENTION, *_KEY_WINDOWS, _INCIDENTS),
    6: (*_RETENTION, *_KEY_WINDOWS, _INCIDENTS),
    7: (*_KEY_WINDOWS, _INCIDENTS),
    8: (_INCIDENTS,),
}
"""The statements that bring a log of an older version to :data:`SCHEMA_VERSION`.

1 to 2: NULL in ``state_offset`` reads as "the state is the cursor's", true of
every row version 1 wrote (it wrote the state every batch). 2 to 3: NULL in
``payload_version`` reads as version 1, the only one earlier releases knew;
adding a column without a default rewrites no row. 3 to 4: the summary of
stored types is made and counted from the events, the one time it reads the
whole log. 4 to 5: checkpoints are keyed by slug and version; each old row
serves (a constant default rewrites no row either). 5 to 6: the idempotency
keys are copied from the index over the events to ``streamkit_keys`` and the
index is dropped. 6 to 7: checkpoints gain ``path`` (from the leases where a
slug was leased on one path) and ``retain_from``, the holds and segments tables
are made, and the heads gain ``truncated_through`` (0: nothing taken). 7 to 8:
the key windows table and the index of recorded keys are made. 8 to 9: the table of
each version's skips is made (empty: what older releases skipped was never kept).
"""

_ATTEMPTS = 20
"""How many times a creator that lost the race to a concurrent one looks again."""

_TABLES = (
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_meta (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        schema_version integer NOT NULL,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )""",
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_events (
        path text NOT NULL,
        "offset" bigint NOT NULL CHECK ("offset" > 0),
        type text NOT NULL,
        payload text NOT NULL,
        metadata text NOT NULL,
        source text,
        idempotency_key text,
        created_at text NOT NULL,
        payload_version smallint,
        PRIMARY KEY (path, "offset")
    )""",
    _KEYS,
    _STORED_TYPES,
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_heads (
        path text PRIMARY KEY,
        head bigint NOT NULL DEFAULT 0 CHECK (head >= 0),
        reserved_through bigint NOT NULL DEFAULT 0,
        reserved_by text NOT NULL DEFAULT '',
        stamped text NOT NULL DEFAULT '',
        truncated_through bigint NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_claims (
        path text NOT NULL,
        slug text NOT NULL,
        due_at double precision NOT NULL,
        PRIMARY KEY (path, slug)
    )""",
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_leases (
        path text NOT NULL,
        slug text NOT NULL,
        owner text NOT NULL,
        generation bigint NOT NULL,
        expires_at double precision NOT NULL,
        beat bigint NOT NULL DEFAULT 0,
        db_expires_at double precision NOT NULL,
        PRIMARY KEY (path, slug)
    )""",
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_checkpoints (
        slug text NOT NULL,
        reducer_version text NOT NULL,
        reduced_through_offset bigint NOT NULL,
        state text,
        state_offset bigint,
        serving boolean NOT NULL DEFAULT false,
        cutover_offset bigint NOT NULL DEFAULT 0,
        retired_at bigint,
        path text,
        retain_from bigint,
        PRIMARY KEY (slug, reducer_version)
    )""",
    _SERVING_INDEX,
    _HOLDS,
    _SEGMENTS,
    *_KEY_WINDOWS,
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_skips (
        path text NOT NULL,
        slug text NOT NULL,
        "offset" bigint NOT NULL,
        skip_event_offset bigint NOT NULL,
        PRIMARY KEY (path, slug, "offset")
    )""",
    _INCIDENTS,
    """CREATE TABLE IF NOT EXISTS {schema}.streamkit_hosts (
        owner text PRIMARY KEY,
        machine text NOT NULL,
        socket text NOT NULL,
        pid integer NOT NULL,
        started_at double precision NOT NULL,
        beat_at double precision,
        processors text NOT NULL DEFAULT '[]'
    )""",
)


class _Raced(Exception):
    """A concurrent creator's meta table was there without its row yet: look again."""


# What a creator that raced a concurrent one meets: the catalog's unique names.
_RACED = (
    _Raced,
    psycopg.errors.UniqueViolation,
    psycopg.errors.DuplicateObject,
    psycopg.errors.DuplicateTable,
    psycopg.errors.DuplicateSchema,
)


def stored_version(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """The schema version recorded in ``schema``, or None if it holds no streamkit log yet."""
    found = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = 'streamkit_meta'",
        (schema,),
    ).fetchone()
    if found is None:
        return None
    row = conn.execute(
        sql.SQL("SELECT schema_version FROM {}.streamkit_meta").format(sql.Identifier(schema))
    ).fetchone()
    return None if row is None else int(row[0])


def ensure_schema(conn: psycopg.Connection[Any], schema: str, shown: str) -> None:
    """Create the log's tables in ``schema`` if missing, upgrade an older layout, refuse another.

    ``conn`` must be in autocommit mode (each attempt is its own transaction);
    ``shown`` names the target in messages. Raises
    :class:`~streamkit.errors.LogOpenError` (nothing changed) for a schema of
    another streamkit version.
    """
    for attempt in range(_ATTEMPTS):
        try:
            with conn.transaction():
                version = stored_version(conn, schema)
                if version is None:
                    _create(conn, schema)
                    return
                if version in _UPGRADES:
                    _upgrade(conn, schema, version)
                    return
            _check_version(version, schema, shown)
            return
        except _RACED:
            # A concurrent creator committed first: what it made is there on the next look.
            time.sleep(0.01 * (attempt + 1))
    raise LogOpenError(
        f"the schema {schema!r} of {shown!r} kept changing while streamkit tried to create its "
        f"tables ({_ATTEMPTS} attempts); nothing was opened; try again",
        details={"target": shown, "schema": schema},
    )


def _create(conn: psycopg.Connection[Any], schema: str) -> None:
    name = sql.Identifier(schema)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(name))
    for statement in _TABLES:
        conn.execute(sql.SQL(statement).format(schema=name))
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.streamkit_meta (schema_version) VALUES (%s) "
            "ON CONFLICT (singleton) DO NOTHING"
        ).format(name),
        (SCHEMA_VERSION,),
    )
    # A meta table made by a concurrent creator that had not yet written its row: ours
    # went in, or theirs did; either way the version must now be this one.
    if stored_version(conn, schema) != SCHEMA_VERSION:
        raise _Raced


def _upgrade(conn: psycopg.Connection[Any], schema: str, version: int) -> None:
    """Bring the log to :data:`SCHEMA_VERSION` in the caller's transaction.

    The meta row is locked first, so of two hosts upgrading at once the second
    waits, then finds the version moved and changes nothing. The version moves
    in the same transaction as the tables, so a release that does not know
    the new layout refuses the log instead of misreading it.
    """
    name = sql.Identifier(schema)
    row = conn.execute(
        sql.SQL("SELECT schema_version FROM {}.streamkit_meta FOR UPDATE").format(name)
    ).fetchone()
    if row is None or int(row[0]) != version:
        return  # upgraded (or changed) by a concurrent opener meanwhile
    for statement in _UPGRADES[version]:
        conn.execute(sql.SQL(statement).format(schema=name))
    conn.execute(
        sql.SQL("UPDATE {}.streamkit_meta SET schema_version = %s").format(name),
        (SCHEMA_VERSION,),
    )


def recount_stored_types(conn: psycopg.Connection[Any], schema: str) -> None:
    """Count the summary of stored types from the events again, in the caller's transaction.

    The table is locked first (EXCLUSIVE: reads go on, writes wait): a writer
    that moved the summary in a transaction still open is waited for, so its
    rows are committed before the count reads them; a writer whose rows are
    not yet committed moves the summary only after this commits. Either way
    each row is counted once.
    """
    name = sql.Identifier(schema)
    conn.execute(sql.SQL("LOCK TABLE {}.streamkit_stored_types IN EXCLUSIVE MODE").format(name))
    conn.execute(sql.SQL("DELETE FROM {}.streamkit_stored_types").format(name))
    conn.execute(sql.SQL(_COUNT_STORED_TYPES).format(schema=name))


def _check_version(version: int, schema: str, shown: str) -> None:
    if version != SCHEMA_VERSION:
        newer = version > SCHEMA_VERSION
        raise LogOpenError(
            f"the schema {schema!r} of {shown!r} holds a streamkit log of schema version "
            f"{version}; this release reads version {SCHEMA_VERSION} only"
            f"{' (it was written by a newer streamkit)' if newer else ''}; nothing was opened "
            "or changed (open it with the streamkit release that wrote it)",
            details={"target": shown, "schema": schema, "version": version},
        )

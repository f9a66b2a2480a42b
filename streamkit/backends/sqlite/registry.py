"""The hosts on one log file, and where each one's control socket is.

Several hosts may run on one file (a lease per processor keeps each processor
in one host at a time), each with its own control socket. The first takes the
default ``<db>.sock``; a host that finds it taken by a live host, and was not
given a socket of its own, binds ``<db>.<token>.sock`` instead. Every host
records itself in ``streamkit_hosts`` (owner, socket, pid) once its socket
listens, and removes its row when it stops; a killed host's row stays behind,
harmless: its socket no longer answers.

A client that wants the host running a processor reads the lease's owner and
that owner's socket (:func:`sockets_for`), so after a failover the CLI talks
to the host that took over, with no flag. The registry says where to look,
never whom to trust: the client still checks every socket it talks to.

Each host also beats here (:func:`beat`, at every heartbeat: when, and which
processors it is configured to run), with or without a socket; the hosts
that beat within a lease ttl are the live ones the processors are shared
among (:func:`live_hosts`, see ``streamkit.host._spread``).
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from urllib.parse import quote

from streamkit.backends.sqlite.leases import LEASE_TABLE

__all__ = [
    "HOSTS_TABLE",
    "beat",
    "deregister",
    "ensure_hosts_table",
    "live_hosts",
    "register",
    "registered_sockets",
    "sockets_for",
]

HOSTS_TABLE = "streamkit_hosts"


def ensure_hosts_table(conn: sqlite3.Connection) -> None:
    """Create the registry if missing (joins the caller's transaction).

    A registry made before hosts beat gets the columns (no beat: not alive).
    """
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {HOSTS_TABLE} ("
        " owner TEXT PRIMARY KEY,"
        " socket TEXT NOT NULL,"
        " pid INTEGER NOT NULL,"
        " started_at REAL NOT NULL,"
        " beat_at REAL,"
        " processors TEXT NOT NULL DEFAULT '[]'"
        ") WITHOUT ROWID"
    )
    columns = {str(row[1]) for row in conn.execute(f"PRAGMA table_info({HOSTS_TABLE})")}
    if "beat_at" not in columns:
        conn.execute(f"ALTER TABLE {HOSTS_TABLE} ADD COLUMN beat_at REAL")
    if "processors" not in columns:
        conn.execute(f"ALTER TABLE {HOSTS_TABLE} ADD COLUMN processors TEXT NOT NULL DEFAULT '[]'")


def beat(conn: sqlite3.Connection, owner: str, pid: int, processors: list[str], now: float) -> None:
    """Record that ``owner`` is alive at ``now`` and which processors it runs."""
    conn.execute(
        f"INSERT INTO {HOSTS_TABLE} (owner, socket, pid, started_at, beat_at, processors)"
        " VALUES (?, '', ?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE SET"
        " beat_at = excluded.beat_at, processors = excluded.processors",
        (owner, pid, now, now, json.dumps(processors)),
    )


def live_hosts(conn: sqlite3.Connection, now: float, ttl: float) -> dict[str, list[str]]:
    """The hosts that beat within ``ttl`` of ``now``: owner -> the processors it runs.

    Empty on a file no host ever ran on (no table yet: it reads as empty).
    """
    if not _has_hosts_table(conn):
        return {}
    rows = conn.execute(
        f"SELECT owner, processors FROM {HOSTS_TABLE} WHERE beat_at > ?", (now - ttl,)
    ).fetchall()
    return {str(owner): [str(k) for k in json.loads(keys)] for owner, keys in rows}


def _has_hosts_table(conn: sqlite3.Connection) -> bool:
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (HOSTS_TABLE,)
    ).fetchone()
    return found is not None


def register(conn: sqlite3.Connection, owner: str, socket: str, pid: int, now: float) -> None:
    """Record that ``owner`` serves its control socket at ``socket``."""
    ensure_hosts_table(conn)
    # A socket path belongs to one live host: a row of a dead one naming it goes.
    conn.execute(f"DELETE FROM {HOSTS_TABLE} WHERE socket = ? AND owner != ?", (socket, owner))
    conn.execute(
        f"INSERT INTO {HOSTS_TABLE} (owner, socket, pid, started_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (owner) DO UPDATE SET socket = excluded.socket, pid = excluded.pid",
        (owner, socket, pid, now),
    )


def deregister(conn: sqlite3.Connection, owner: str) -> None:
    """Remove ``owner``'s row (its host is stopping)."""
    ensure_hosts_table(conn)
    conn.execute(f"DELETE FROM {HOSTS_TABLE} WHERE owner = ?", (owner,))


def sockets_for(conn: sqlite3.Connection, slug: str | None = None) -> list[str]:
    """The registered sockets, the one of the host holding ``slug``'s lease first.

    Without ``slug``: the hosts holding any lease first (by how many they
    hold), then the others. Reads only; tables not created yet read as empty.
    """
    tables = {
        str(row[0])
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    }
    if HOSTS_TABLE not in tables:
        return []
    rows = conn.execute(
        f"SELECT owner, socket FROM {HOSTS_TABLE} WHERE socket != '' ORDER BY started_at"
    ).fetchall()
    held: dict[str, int] = {}
    if LEASE_TABLE in tables:
        query = f"SELECT owner, count(*) FROM {LEASE_TABLE} WHERE expires_at > -1e308"
        args: tuple[str, ...] = ()
        if slug is not None:
            query += " AND slug = ?"
            args = (slug,)
        held = {str(o): int(n) for o, n in conn.execute(query + " GROUP BY owner", args)}
    ordered = sorted(rows, key=lambda row: -held.get(str(row[0]), 0))
    return [str(socket) for _, socket in ordered]


def registered_sockets(db: str, slug: str | None = None) -> list[str]:
    """:func:`sockets_for` read from the file at ``db`` (empty if there is none yet).

    Opens its own read-only connection, so a client asks without opening a log.
    """
    if not os.path.isfile(db):
        return []
    uri = "file:" + quote(os.path.abspath(db)) + "?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True, timeout=1.0)) as conn:
            return sockets_for(conn, slug)
    except sqlite3.Error:
        return []  # no registry to read: the default socket is still tried

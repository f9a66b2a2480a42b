"""Processor leases with fencing: one processor runs in one host at a time.

A lease is one row per ``(path, slug)`` in ``streamkit_leases``: the owner that
holds it, a fencing ``generation``, a ``beat`` counter that every renewal bumps,
and the epoch second it expires at by the holder's clock. A host takes a free
lease with :func:`try_acquire`, keeps it with :func:`renew` (its heartbeat),
proves it inside every fenced transaction with :func:`check_fence`, and gives
it up with :func:`release`.

No clock decides a takeover. Another owner's lease is taken only as *stale*:
the taker passes the row it observed, and the takeover succeeds only if the
row still names that owner, generation and beat. The caller must have watched
that exact row go unrenewed for a full ttl of its OWN monotonic time. So a
host whose wall clock runs fast cannot steal a live lease (the holder's beats
keep changing the row), and a holder whose clock ran fast cannot pin a lease
after it dies (its ``expires_at`` is never consulted by a taker).

Guarantees:

- The generation of a ``(path, slug)`` strictly increases on every takeover and
  is never reused: a released lease keeps its row (expired, not deleted), so the
  next holder gets the next generation even when it uses the same owner string.
- At any instant at most one holder passes :func:`check_fence`: the check
  demands the stored owner AND generation AND an unexpired row, and only a
  takeover of an expired row can hand out a new generation.
- :func:`try_acquire`, :func:`renew` and :func:`release` are each ONE
  conditional statement, so they are atomic on their own; a lost race shows up
  as ``None`` or :class:`~streamkit.errors.LeaseLost`, never as two holders.
- The holder's ``expires_at`` is the holder's own promise, judged only by the
  holder (in :func:`check_fence`, with its own clock); a host also stops
  trusting a lease once its own monotonic clock says a ttl passed since the
  last renewal began (see the host's lease keeper).
- :func:`check_fence` must run inside the transaction of the write it guards
  (the host runs both in the log's writer thread under ``BEGIN IMMEDIATE``); it
  refuses to run outside one, because a check and a write in separate
  transactions fence nothing.

Times are epoch seconds passed in by the caller (``now``), never read here.
The holder treats its lease as in force while ``now < expires_at``. Owner strings must be unique per
host incarnation (host name, pid and a random token, say): two live processes
sharing one owner string would share one lease.

Renewing an expired lease that nobody took is allowed: the generation is the
fence, and while the row kept this owner and generation no one else could have
written under a newer one, while this holder's own fenced writes were refused
for as long as it was expired. Renewing a released lease is refused: the holder
gave it up on purpose.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from streamkit.backends._lease_rules import check_names, check_time, lease_lost
from streamkit.backends.sqlite._schema import storage_error
from streamkit.errors import InvalidRequest, LeaseLost
from streamkit.protocols import RELEASED, Lease, LeaseAsk

__all__ = [
    "LEASES",
    "LEASE_TABLE",
    "SqliteLeases",
    "check_fence",
    "ensure_lease_table",
    "leases",
    "read_lease",
    "release",
    "renew",
    "take_over",
    "try_acquire",
]

LEASE_TABLE = "streamkit_leases"

# A released lease keeps its row (and so its generation) with this expiry: it
# is expired at every ``now``, and it tells "given up" apart from "timed out".
_RELEASED = RELEASED


def ensure_lease_table(conn: sqlite3.Connection) -> None:
    """Create the lease table if it does not exist (idempotent; joins the caller's transaction).

    A table made before leases had a ``beat`` gets the column (0 for every row).
    """
    with _storage("create the lease table"):
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {LEASE_TABLE} ("
            " path TEXT NOT NULL,"
            " slug TEXT NOT NULL,"
            " owner TEXT NOT NULL,"
            " generation INTEGER NOT NULL,"
            " expires_at REAL NOT NULL,"
            " beat INTEGER NOT NULL DEFAULT 0,"
            " PRIMARY KEY (path, slug)"
            ") WITHOUT ROWID"
        )
        columns = {str(row[1]) for row in conn.execute(f"PRAGMA table_info({LEASE_TABLE})")}
        if "beat" not in columns:
            conn.execute(f"ALTER TABLE {LEASE_TABLE} ADD COLUMN beat INTEGER NOT NULL DEFAULT 0")


def try_acquire(conn: sqlite3.Connection, ask: LeaseAsk) -> Lease | None:
    """Take the lease of ``(path, slug)`` for ``owner`` until ``now + ttl``, or return ``None``.

    - A missing row starts at generation 1.
    - A released lease is taken with the next generation.
    - A lease ``owner`` holds itself is renewed under the same generation while
      unexpired by ``now``, and taken with the next generation once expired, so
      a reacquire after expiry fences the earlier incarnation.
    - Another owner's lease is taken (next generation) only when ``stale`` is
      given and the row is still exactly ``stale``: the caller watched that row
      go unrenewed for a ttl of its own monotonic time. A clock never decides
      it (see the module docstring).

    Otherwise ``None`` comes back and nothing changed.
    """
    path, slug, owner, now, ttl, stale = ask.path, ask.slug, ask.owner, ask.now, ask.ttl, ask.stale
    check_names(path, slug, owner)
    check_time(now, ttl)
    # One UPSERT decides and writes, so two hosts racing for a free lease cannot
    # both win even outside a transaction: the loser's WHERE no longer holds.
    # Every right-hand side of SET sees the OLD row, so the CASE compares the
    # previous owner and expiry.
    params: dict[str, Any] = {
        "path": path,
        "slug": slug,
        "owner": owner,
        "now": now,
        "expires_at": now + ttl,
        "released": _RELEASED,
        "s_owner": None if stale is None else stale.owner,
        "s_generation": None if stale is None else stale.generation,
        "s_beat": None if stale is None else stale.beat,
        "s_expires_at": None if stale is None else stale.expires_at,
    }
    with _storage(f"acquire the lease of {slug!r} at {path!r}"):
        row = conn.execute(
            f"INSERT INTO {LEASE_TABLE} (path, slug, owner, generation, expires_at, beat)"
            " VALUES (:path, :slug, :owner, 1, :expires_at, 0)"
            " ON CONFLICT (path, slug) DO UPDATE SET"
            "  generation = CASE WHEN owner = excluded.owner AND expires_at > :now"
            "   THEN generation ELSE generation + 1 END,"
            "  beat = CASE WHEN owner = excluded.owner AND expires_at > :now"
            "   THEN beat + 1 ELSE 0 END,"
            "  owner = excluded.owner,"
            "  expires_at = excluded.expires_at"
            " WHERE expires_at = :released OR owner = excluded.owner"
            "  OR (owner = :s_owner AND generation = :s_generation AND beat = :s_beat"
            "   AND expires_at = :s_expires_at)"
            " RETURNING generation, expires_at, beat",
            params,
        ).fetchone()
    if row is None:
        return None
    return Lease(path, slug, owner, int(row[0]), float(row[1]), int(row[2]))


def take_over(
    conn: sqlite3.Connection, path: str, slug: str, owner: str, now: float, ttl: float
) -> Lease:
    """Take the lease of ``(path, slug)`` for ``owner`` whoever holds it, at the next generation.

    Only for a cutover, inside its transaction: the version that served is
    fenced by that very commit (its holder's next fenced write finds another
    owner and generation and is refused), and the new version serves under
    the lease taken here. Nothing else takes a live lease away.
    """
    check_names(path, slug, owner)
    check_time(now, ttl)
    with _storage(f"take over the lease of {slug!r} at {path!r}"):
        row = conn.execute(
            f"INSERT INTO {LEASE_TABLE} (path, slug, owner, generation, expires_at, beat)"
            " VALUES (?, ?, ?, 1, ?, 0)"
            " ON CONFLICT (path, slug) DO UPDATE SET generation = generation + 1, beat = 0,"
            "  owner = excluded.owner, expires_at = excluded.expires_at"
            " RETURNING generation, expires_at, beat",
            (path, slug, owner, now + ttl),
        ).fetchone()
    return Lease(path, slug, owner, int(row[0]), float(row[1]), int(row[2]))


def read_lease(conn: sqlite3.Connection, path: str, slug: str) -> Lease | None:
    """The lease row of ``(path, slug)`` as stored, or ``None`` if nobody ever held it."""
    with _storage(f"read the lease of {slug!r} at {path!r}"):
        row = conn.execute(
            f"SELECT owner, generation, expires_at, beat FROM {LEASE_TABLE}"
            " WHERE path = ? AND slug = ?",
            (path, slug),
        ).fetchone()
    if row is None:
        return None
    return Lease(path, slug, str(row[0]), int(row[1]), float(row[2]), int(row[3]))


def renew(conn: sqlite3.Connection, lease: Lease, now: float, ttl: float) -> Lease:
    """Extend ``lease`` to ``now + ttl`` under the same generation; return the renewed lease.

    Raises :class:`~streamkit.errors.LeaseLost` (and changes nothing) when the
    row no longer names this owner and generation (someone took over) or the
    holder released it. An expired lease nobody took is renewed: see the module
    docstring for why that keeps fencing sound.
    """
    check_time(now, ttl)
    with _storage(f"renew the lease of {lease.slug!r} at {lease.path!r}"):
        row = conn.execute(
            f"UPDATE {LEASE_TABLE} SET expires_at = ?, beat = beat + 1"
            " WHERE path = ? AND slug = ? AND owner = ? AND generation = ? AND expires_at > ?"
            " RETURNING expires_at, beat",
            (now + ttl, lease.path, lease.slug, lease.owner, lease.generation, _RELEASED),
        ).fetchone()
    if row is None:
        raise _lost(conn, lease, now, "renew")
    return Lease(lease.path, lease.slug, lease.owner, lease.generation, float(row[0]), int(row[1]))


def check_fence(conn: sqlite3.Connection, lease: Lease, now: float) -> None:
    """Raise :class:`~streamkit.errors.LeaseLost` unless ``lease`` is still in force at ``now``.

    In force means the row still names this owner and generation and has not
    expired. Call it inside the transaction of the write it fences and let
    ``LeaseLost`` propagate so that transaction rolls back: the check and the
    write then commit together or not at all. Outside a transaction it raises
    :class:`~streamkit.errors.InvalidRequest`, since the fence would prove nothing
    about a later write.
    """
    if not conn.in_transaction:
        raise InvalidRequest(
            f"check_fence for {lease.slug!r} at {lease.path!r} ran outside a transaction; a "
            "fence only protects a write made in the same transaction, so open one first "
            "(BEGIN IMMEDIATE), check the fence, write, then commit; nothing was checked or "
            "written",
            details={"path": lease.path, "slug": lease.slug},
        )
    with _storage(f"check the lease of {lease.slug!r} at {lease.path!r}"):
        row = conn.execute(
            f"SELECT 1 FROM {LEASE_TABLE}"
            " WHERE path = ? AND slug = ? AND owner = ? AND generation = ? AND expires_at > ?",
            (lease.path, lease.slug, lease.owner, lease.generation, now),
        ).fetchone()
    if row is None:
        raise _lost(conn, lease, now, "write")


def release(conn: sqlite3.Connection, lease: Lease) -> bool:
    """Give ``lease`` up if it is still ours; return whether it was.

    The row is kept, expired, so the next holder gets the next generation. A
    lease someone else took (or we already released) is left as it is.
    """
    with _storage(f"release the lease of {lease.slug!r} at {lease.path!r}"):
        cursor = conn.execute(
            f"UPDATE {LEASE_TABLE} SET expires_at = ?"
            " WHERE path = ? AND slug = ? AND owner = ? AND generation = ? AND expires_at > ?",
            (_RELEASED, lease.path, lease.slug, lease.owner, lease.generation, _RELEASED),
        )
    return cursor.rowcount == 1


def leases(conn: sqlite3.Connection) -> list[Lease]:
    """Every lease row (held, expired or released), sorted by path then slug.

    None in a log no host ever ran on (read-only, the table was never made).
    """
    with _storage("list the leases"):
        made = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (LEASE_TABLE,)
        ).fetchone()
        if made is None:
            return []
        rows = conn.execute(
            f"SELECT path, slug, owner, generation, expires_at, beat FROM {LEASE_TABLE}"
            " ORDER BY path, slug"
        ).fetchall()
    return [Lease(str(p), str(s), str(o), int(g), float(e), int(b)) for p, s, o, g, e, b in rows]


class SqliteLeases:
    """The functions of this module as one part (a :class:`~streamkit.backends._lease_rules.LeaseRows`)."""

    __slots__ = ()

    read_lease = staticmethod(read_lease)
    try_acquire = staticmethod(try_acquire)
    take_over = staticmethod(take_over)
    renew = staticmethod(renew)
    check_fence = staticmethod(check_fence)
    release = staticmethod(release)


LEASES = SqliteLeases()


def _lost(conn: sqlite3.Connection, lease: Lease, now: float, attempt: str) -> LeaseLost:
    with _storage(f"read the lease of {lease.slug!r} at {lease.path!r}"):
        row = conn.execute(
            f"SELECT owner, generation, expires_at FROM {LEASE_TABLE} WHERE path = ? AND slug = ?",
            (lease.path, lease.slug),
        ).fetchone()
    stored = None if row is None else (str(row[0]), int(row[1]), float(row[2]))
    return lease_lost(lease, now, attempt, stored)


class _storage:
    """Turn sqlite3 failures into coded storage errors; the caller's transaction decides the rest."""

    __slots__ = ("_action",)

    def __init__(self, action: str) -> None:
        self._action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, sqlite3.Error):
            raise storage_error(
                exc,
                self._action,
                table=LEASE_TABLE,
                outcome="this statement changed nothing (roll back the surrounding transaction)",
            ) from exc

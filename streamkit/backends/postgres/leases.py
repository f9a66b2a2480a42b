"""Processor leases in PostgreSQL, with fencing, and expiry judged on the database's clock.

The rules are the SQLite backend's (:mod:`streamkit.backends.sqlite.leases`
explains them): one row per ``(path, slug)`` with the holder, a fencing
``generation`` that only a takeover moves, a ``beat`` every renewal bumps,
and ``expires_at``, the holder's own promise by its own clock. A takeover of
another owner's lease names the row the taker watched go unrenewed.

What PostgreSQL adds: ``db_expires_at``, the same ttl counted on the
server's clock (``clock_timestamp()``) at every take and renewal. Every
host, on every machine, judges it by that one clock, never its own:

- the fence (:func:`check_fence`) passes only while the server's clock is
  before it, so a holder whose renewals stopped reaching the server (a
  partition, a pause) cannot write past its ttl whatever its clock says;
- a lease whose ``db_expires_at`` passed may be taken without a watched row,
  so a dead holder's work moves on within the ttl.

The fence reads the row ``FOR SHARE`` inside the transaction of the write it
guards: a takeover, an ``UPDATE`` of that row, waits until the write commits
(or rolls back), and a write that has not checked yet sees the takeover.
The check and the write are one transaction, so a host that lost its lease
writes nothing. No advisory lock is involved anywhere: they fence nothing,
and a transaction-mode pooler breaks them.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from streamkit.backends._lease_rules import check_names, check_time, lease_lost
from streamkit.errors import InvalidRequest
from streamkit.protocols import RELEASED, Lease, LeaseAsk

__all__ = ["CLOCK", "Leases"]

CLOCK = "EXTRACT(EPOCH FROM clock_timestamp())::float8"
"""The server's clock, in epoch seconds: the one every host's lease is judged by."""
_CLOCK = CLOCK


class Leases:
    """The lease statements of one schema."""

    def __init__(self, schema: str) -> None:
        t = f'"{schema}".streamkit_leases'
        self._acquire = f"""
            INSERT INTO {t} AS l
                (path, slug, owner, generation, expires_at, beat, db_expires_at)
            VALUES (%(path)s, %(slug)s, %(owner)s, 1, %(expires_at)s, 0, {_CLOCK} + %(ttl)s)
            ON CONFLICT (path, slug) DO UPDATE SET
                generation = CASE WHEN l.owner = excluded.owner AND l.expires_at > %(now)s
                    AND l.db_expires_at > {_CLOCK} THEN l.generation ELSE l.generation + 1 END,
                beat = CASE WHEN l.owner = excluded.owner AND l.expires_at > %(now)s
                    AND l.db_expires_at > {_CLOCK} THEN l.beat + 1 ELSE 0 END,
                owner = excluded.owner,
                expires_at = excluded.expires_at,
                db_expires_at = excluded.db_expires_at
            WHERE l.expires_at = %(released)s OR l.owner = excluded.owner
                OR (l.owner = %(s_owner)s AND l.generation = %(s_generation)s
                    AND l.beat = %(s_beat)s AND l.expires_at = %(s_expires_at)s)
                OR l.db_expires_at <= {_CLOCK}
            RETURNING generation, expires_at, beat
        """
        self._take_over = f"""
            INSERT INTO {t} AS l
                (path, slug, owner, generation, expires_at, beat, db_expires_at)
            VALUES (%(path)s, %(slug)s, %(owner)s, 1, %(expires_at)s, 0, {_CLOCK} + %(ttl)s)
            ON CONFLICT (path, slug) DO UPDATE SET
                generation = l.generation + 1, beat = 0, owner = excluded.owner,
                expires_at = excluded.expires_at, db_expires_at = excluded.db_expires_at
            RETURNING generation, expires_at, beat
        """
        self._read = (
            f"SELECT owner, generation, expires_at, beat FROM {t} WHERE path = %s AND slug = %s"
        )
        self._renew = f"""
            UPDATE {t} SET expires_at = %s, beat = beat + 1, db_expires_at = {_CLOCK} + %s
            WHERE path = %s AND slug = %s AND owner = %s AND generation = %s AND expires_at > %s
            RETURNING expires_at, beat
        """
        self._fence = f"""
            SELECT 1 FROM {t}
            WHERE path = %s AND slug = %s AND owner = %s AND generation = %s AND expires_at > %s
                AND db_expires_at > {_CLOCK}
            FOR SHARE
        """
        self._release = f"""
            UPDATE {t} SET expires_at = %s, db_expires_at = %s
            WHERE path = %s AND slug = %s AND owner = %s AND generation = %s AND expires_at > %s
        """
        self._all = f"""
            SELECT path, slug, owner, generation, expires_at, beat, db_expires_at > {_CLOCK}
            FROM {t} ORDER BY path COLLATE "C", slug COLLATE "C"
        """
        self._stored = (
            f"SELECT owner, generation, expires_at FROM {t} WHERE path = %s AND slug = %s"
        )

    def try_acquire(self, conn: psycopg.Connection[Any], ask: LeaseAsk) -> Lease | None:
        """Take the lease of ``(path, slug)`` for ``owner`` (one statement), or None."""
        path, slug, owner, now, ttl = ask.path, ask.slug, ask.owner, ask.now, ask.ttl
        stale = ask.stale
        check_names(path, slug, owner)
        check_time(now, ttl)
        row = conn.execute(
            self._acquire,
            {
                "path": path,
                "slug": slug,
                "owner": owner,
                "now": float(now),
                "ttl": float(ttl),
                "expires_at": float(now + ttl),
                "released": RELEASED,
                "s_owner": None if stale is None else stale.owner,
                "s_generation": None if stale is None else stale.generation,
                "s_beat": None if stale is None else stale.beat,
                "s_expires_at": None if stale is None else float(stale.expires_at),
            },
        ).fetchone()
        if row is None:
            return None
        return Lease(path, slug, owner, int(row[0]), float(row[1]), int(row[2]))

    def take_over(
        self,
        conn: psycopg.Connection[Any],
        path: str,
        slug: str,
        owner: str,
        now: float,
        ttl: float,
    ) -> Lease:
        """Take the lease of ``(path, slug)`` whoever holds it, at the next generation.

        Only inside a cutover's transaction (see ``leases`` in the SQLite
        backend): the holder's next fenced write is refused from its commit on.
        """
        check_names(path, slug, owner)
        check_time(now, ttl)
        row = conn.execute(
            self._take_over,
            {
                "path": path,
                "slug": slug,
                "owner": owner,
                "ttl": float(ttl),
                "expires_at": float(now + ttl),
            },
        ).fetchone()
        assert row is not None  # an upsert without a condition always returns its row
        return Lease(path, slug, owner, int(row[0]), float(row[1]), int(row[2]))

    def read_lease(self, conn: psycopg.Connection[Any], path: str, slug: str) -> Lease | None:
        """The stored row of ``(path, slug)``, or None if nobody ever held it."""
        row = conn.execute(self._read, (path, slug)).fetchone()
        if row is None:
            return None
        return Lease(path, slug, str(row[0]), int(row[1]), float(row[2]), int(row[3]))

    def renew(self, conn: psycopg.Connection[Any], lease: Lease, now: float, ttl: float) -> Lease:
        """Extend ``lease`` on both clocks under its generation; LeaseLost if it is not ours."""
        check_time(now, ttl)
        row = conn.execute(
            self._renew,
            (
                float(now + ttl),
                float(ttl),
                lease.path,
                lease.slug,
                lease.owner,
                lease.generation,
                RELEASED,
            ),
        ).fetchone()
        if row is None:
            raise self._lost(conn, lease, now, "renew")
        return Lease(
            lease.path, lease.slug, lease.owner, lease.generation, float(row[0]), int(row[1])
        )

    def check_fence(self, conn: psycopg.Connection[Any], lease: Lease, now: float) -> None:
        """Inside the write's transaction: LeaseLost unless ``lease`` is in force on both clocks."""
        if conn.info.transaction_status != TransactionStatus.INTRANS:
            raise InvalidRequest(
                f"check_fence for {lease.slug!r} at {lease.path!r} ran outside a transaction; a "
                "fence only protects a write made in the same transaction, so open one first, "
                "check the fence, write, then commit; nothing was checked or written",
                details={"path": lease.path, "slug": lease.slug},
            )
        row = conn.execute(
            self._fence,
            (lease.path, lease.slug, lease.owner, lease.generation, float(now)),
        ).fetchone()
        if row is None:
            raise self._lost(conn, lease, now, "write")

    def release(self, conn: psycopg.Connection[Any], lease: Lease) -> bool:
        """Give ``lease`` up if it is still ours (the row and its generation stay)."""
        cursor = conn.execute(
            self._release,
            (
                RELEASED,
                RELEASED,
                lease.path,
                lease.slug,
                lease.owner,
                lease.generation,
                RELEASED,
            ),
        )
        return cursor.rowcount == 1

    def leases(self, conn: psycopg.Connection[Any]) -> list[tuple[Lease, bool]]:
        """Every row, with whether it is in force by the server's clock, by path then slug."""
        return [
            (Lease(str(p), str(s), str(o), int(g), float(e), int(b)), bool(held))
            for p, s, o, g, e, b, held in conn.execute(self._all)
        ]

    def _lost(
        self, conn: psycopg.Connection[Any], lease: Lease, now: float, attempt: str
    ) -> Exception:
        row = conn.execute(self._stored, (lease.path, lease.slug)).fetchone()
        stored = None if row is None else (str(row[0]), int(row[1]), float(row[2]))
        return lease_lost(lease, now, attempt, stored)

"""Sessions a stopped process left holding this log's row locks, and how a writer ends them.

Each streamkit session asks the server to end it when it sits idle inside a
transaction for half its lock timeout (``_connect.session_options``), so a
host that is frozen mid-transaction (SIGSTOP, a paused VM) costs the writers
behind its locks a pause, not a refusal. That timer alone was not enough:
on PostgreSQL 15 a frozen host's writer session was seen waiting for its
client inside a write transaction for over 50 s with a 2.5 s timeout, and
every writer behind the head row it held timed out again and again (a
cutover never came). So a writer whose lock wait timed out looks for such
sessions itself and ends them (:meth:`FrozenSessions.end`), then runs its
group again once.

A session is ended only when all of this holds: it is a streamkit session
(``application_name``) of the same database, not this one; its transaction
has written (it has a transaction id); it is waiting for its client
(``ClientRead``), not working; it has done so for longer than
:func:`frozen_after` of the caller's lock timeout (twice the shortest time
the server should have taken to end it, and never less than the lock
timeout); and it holds a lock on a table of this log's schema. A live
writer sends a transaction's statements back to back and is never caught:
waiting seconds for its own client mid-transaction is what a frozen process
does. Ending it rolls back its uncommitted transaction (nothing it wrote
had been acknowledged); its process, if it runs again, gets a broken
connection, a retryable error. Every session ended is logged (a warning)
and counted (``LogStats.frozen_sessions_ended``,
``streamkit_host_frozen_sessions_ended_total``). Where the server refuses
(another role without the right to signal it), the refusal is logged and
the caller's lock error stands.
"""

from __future__ import annotations

from typing import Any

import psycopg
import structlog

from streamkit.backends.postgres._connect import IDLE_IN_TRANSACTION_FLOOR

__all__ = ["FrozenSessions", "frozen_after"]

log = structlog.get_logger("streamkit.postgres")

_FIND = """
SELECT a.pid, a.application_name, EXTRACT(EPOCH FROM clock_timestamp() - a.state_change)
FROM pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND a.application_name LIKE 'streamkit%%'
  AND a.backend_xid IS NOT NULL
  AND a.wait_event = 'ClientRead'
  AND a.state IN ('idle in transaction', 'active')
  AND clock_timestamp() - a.state_change > make_interval(secs => %s)
  AND EXISTS (
      SELECT 1 FROM pg_locks AS l
      JOIN pg_class AS c ON c.oid = l.relation
      JOIN pg_namespace AS n ON n.oid = c.relnamespace
      WHERE l.pid = a.pid AND l.granted AND n.nspname = %s
  )
"""


def frozen_after(lock_timeout: float) -> float:
    """Seconds a session must have waited for its client mid-transaction to count as frozen."""
    return max(2 * IDLE_IN_TRANSACTION_FLOOR, lock_timeout)


class FrozenSessions:
    """Finds and ends the frozen sessions holding locks in ``schema`` (see the module).

    ``ended`` counts the sessions this writer ended; it is never rolled
    back with a failed group (the session is gone either way).
    """

    def __init__(self, schema: str, lock_timeout: float) -> None:
        self._schema = schema
        self._after = frozen_after(lock_timeout)
        self.ended = 0

    def end(self, conn: psycopg.Connection[Any]) -> int:
        """End the frozen sessions found now; how many ended (0: none, or the server refused)."""
        try:
            found = conn.execute(_FIND, (self._after, self._schema)).fetchall()
            ended = 0
            for pid, application, idle in found:
                row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
                if row is not None and row[0]:
                    ended += 1
                    log.warning(
                        "postgres.frozen_session_ended",
                        pid=pid,
                        application=application,
                        waiting_seconds=round(float(idle), 3),
                        schema=self._schema,
                    )
        except psycopg.Error as exc:
            log.warning(
                "postgres.frozen_session_not_ended", error=str(exc).strip(), schema=self._schema
            )
            return 0
        self.ended += ended
        return ended

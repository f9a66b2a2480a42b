"""Connections to the PostgreSQL server of a log, and the one conversion of its failures.

Every connection streamkit opens is in autocommit mode (each write opens its
own transaction explicitly), names itself ``streamkit`` to the server
(``application_name``, seen in ``pg_stat_activity``) and gives up connecting
after ``connect_timeout`` seconds (10 unless the URL says otherwise), so an
unreachable server is an error, never a hang.

:func:`storage_error` turns a ``psycopg`` failure into a coded error: a
server that cannot be reached, or a connection that broke, is
:class:`~streamkit.errors.StorageUnavailable` (retryable); a lock wait past
the lock timeout is :class:`~streamkit.errors.StorageBusy`; anything else is
:class:`~streamkit.errors.StorageError`, with the SQLSTATE in its details.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict

from streamkit.errors import LogOpenError, StorageBusy, StorageError, StorageUnavailable

__all__ = [
    "CONNECT_TIMEOUT",
    "connect",
    "idle_in_transaction_timeout",
    "is_disconnect",
    "is_retryable",
    "open_error",
    "storage_error",
]

CONNECT_TIMEOUT = 10
"""Seconds to wait for the server when the URL sets no ``connect_timeout``."""

_RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


IDLE_IN_TRANSACTION_FLOOR = 1.0
"""The shortest time a session of ours may sit idle inside a transaction, whatever its lock timeout."""


def idle_in_transaction_timeout(lock_timeout: float) -> float:
    """Seconds the server lets a writing session sit idle inside a transaction: half its lock
    timeout, and at least :data:`IDLE_IN_TRANSACTION_FLOOR`.

    Half, so that a process stopped mid-transaction (SIGSTOP, a paused VM, a
    swapped-out host) is ended by the server, and its row locks freed, before
    the writers queued behind those locks reach their own lock timeout: a
    frozen host costs the others a pause, never a refused append. A live
    writer's transaction is a few statements sent back to back; it is never
    idle that long between them.
    """
    return max(IDLE_IN_TRANSACTION_FLOOR, lock_timeout / 2)


def session_options(lock_timeout: float) -> dict[str, str]:
    """The settings of a session that writes: how long it waits for a row lock, and how long
    it may stay idle inside a transaction (:func:`idle_in_transaction_timeout`)."""
    idle = idle_in_transaction_timeout(lock_timeout)
    return {
        "lock_timeout": f"{max(1, round(lock_timeout * 1000))}ms",
        "idle_in_transaction_session_timeout": f"{round(idle * 1000)}ms",
    }


def connect(
    conninfo: str,
    shown: str,
    *,
    options: dict[str, str] | None = None,
    outcome: str = "nothing was done",
    role: str | None = None,
) -> psycopg.Connection[Any]:
    """A new autocommit connection; ``options`` are server settings for its session.

    ``role`` names the connection's job in ``application_name`` (``streamkit
    listener``, say) unless the URL sets one.

    Raises :class:`~streamkit.errors.StorageUnavailable` when the server
    cannot be reached.
    """
    params: dict[str, Any] = {"autocommit": True}
    given = conninfo_to_dict(conninfo)
    if "connect_timeout" not in given:
        params["connect_timeout"] = CONNECT_TIMEOUT
    if "application_name" not in given:
        # What pg_stat_activity shows: streamkit, and which of its connections this is.
        params["application_name"] = "streamkit" if role is None else f"streamkit {role}"
    if options:
        params["options"] = " ".join(f"-c {name}={value}" for name, value in options.items())
    try:
        return psycopg.connect(conninfo, **params)
    except psycopg.Error as exc:
        raise storage_error(exc, f"connecting to {shown}", outcome=outcome) from exc


def is_retryable(exc: BaseException) -> bool:
    """Whether the server aborted the transaction only to have it run again (deadlock, serialization)."""
    return isinstance(exc, _RETRYABLE)


def is_disconnect(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (the server stopped, the network broke)."""
    # psycopg files lock timeouts and the server's rollbacks (deadlock, serialization)
    # under OperationalError too; those leave the connection usable.
    return isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc,
        psycopg.errors.QueryCanceled
        | psycopg.errors.LockNotAvailable
        | psycopg.errors.TransactionRollback,
    )


def storage_error(
    exc: psycopg.Error,
    doing: str,
    *,
    outcome: str = "the transaction was rolled back and nothing was written",
) -> StorageError:
    """The coded error for a ``psycopg`` failure while ``doing`` something (raise it ``from exc``)."""
    state = exc.sqlstate
    details: dict[str, str | None] = {"postgres_error": type(exc).__name__, "sqlstate": state}
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
        return StorageBusy(
            f"{doing} was refused: a row it needed stayed locked by another transaction past "
            f"the lock timeout ({message}); {outcome}; retry, or raise busy_timeout",
            details=details,
        )
    if is_retryable(exc):
        return StorageBusy(
            f"{doing} was refused: the server rolled it back to resolve a conflict with "
            f"another transaction ({message}), every time it was tried; {outcome}; retry",
            details=details,
        )
    answer = _server_refusal(str(exc))
    if answer is not None and is_disconnect(exc):
        # The server answered and refused (a bad parameter, a role it does not know):
        # retrying will not help, and "unreachable" would send the operator the wrong way.
        return StorageError(
            f"{doing} failed: the PostgreSQL server refused the connection ({answer}); "
            f"{outcome}; check the URL's parameters and the server's settings",
            details=details,
        )
    if is_disconnect(exc):
        return StorageUnavailable(
            f"{doing} failed: the PostgreSQL server is unreachable or the connection broke "
            f"({message}); {outcome}; retry once the server is back",
            details=details,
        )
    return StorageError(f"{doing} failed in PostgreSQL ({message}); {outcome}", details=details)


# FATAL answers that pass: the server is starting, stopping or full; a retry may connect.
_TRANSIENT = (
    "the database system is",
    "too many clients",
    "connection slots",
    "terminating connection",
)


def _server_refusal(text: str) -> str | None:
    """The FATAL answer a server gave a connection, if it gave one that a retry cannot change."""
    at = text.find("FATAL:")
    if at < 0:
        return None
    answer = " ".join(text[at:].split())[:300]
    if any(phrase in answer for phrase in _TRANSIENT):
        return None
    return answer


def open_error(exc: StorageError, shown: str) -> LogOpenError:
    """A failure while opening the log (its message says nothing was opened), as the refusal."""
    return LogOpenError(exc.message, details={"target": shown, **exc.details})

"""What every command line verb shares: argument types, and how it opens an existing log.

argparse calls the types on the raw text; a refusal is a usage error
(`Error: ...`, exit 1) that names the flag's rule, so a command never starts
(or writes anything) with a value it cannot honour: not-a-number seconds,
negative timeouts, offsets past what the log can hold, JSON that is not an
object.

:func:`existing_log` never creates a database where a path was mistyped, and
opens a log this process cannot write read-only, so reading commands work on
it (a write through it is then refused with a clear error).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from streamkit._targets import default_socket, is_postgres_target, served_name
from streamkit.backends import host_store, open_log, registered_sockets
from streamkit.checkpoint import shown_snapshot
from streamkit.control import host_socket
from streamkit.errors import InvalidRequest, LogOpenError, UntrustedSocket
from streamkit.events import MAX_OFFSET
from streamkit.log import Log

__all__ = [
    "existing_log",
    "host_socket_for",
    "json_object",
    "live_host_sockets",
    "non_negative_int",
    "positive_int",
    "positive_seconds",
    "stored_snapshot",
]


def json_object(flag: str) -> Callable[[str], dict[str, Any]]:
    """A parser of ``flag``'s value as a JSON object."""

    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{flag} is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise argparse.ArgumentTypeError(
                f"{flag} nests too deeply to parse (over Python's recursion limit)"
            ) from exc
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(
                f"{flag} must be a JSON object, got {type(value).__name__}"
            )
        return value

    return parse


def _whole_number(text: str, low: int) -> int:
    """A whole number from ``low`` to the largest offset; the refusal names that range."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from exc
    if not low <= value <= MAX_OFFSET:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from {low} to {MAX_OFFSET} (2^63 - 1), got {value}"
        )
    return value


def non_negative_int(text: str) -> int:
    """A whole number from 0 to the largest offset."""
    return _whole_number(text, 0)


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (never NaN, never infinite)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds above 0, got {text!r}"
        )
    return value


def positive_int(text: str) -> int:
    """A whole number from 1 to the largest offset."""
    return _whole_number(text, 1)


def existing_log(db: str, *, read_only: bool = False) -> Log:
    """Open the log at ``db``, which must exist; read-only if asked or if this process cannot
    write it."""
    if db != ":memory:" and not is_postgres_target(db) and not os.path.exists(db):
        raise InvalidRequest(
            f"no log file at {db!r}; nothing was read or written (append creates one)",
            details={"db": db},
        )
    if read_only:
        return open_log(db, read_only=True)
    try:
        return open_log(db)
    except LogOpenError as exc:
        if exc.details.get("reason") != "not_writable":
            raise
        return open_log(db, read_only=True)


def served_log(db: str) -> str:
    """The log a request to a host names (``db=`` of every request): a host on another refuses it.

    A SQLite file's real path, or a PostgreSQL server, database and schema.
    """
    return served_name(db)


def host_socket_for(db: str, socket: str | None, slug: str | None = None) -> str | None:
    """The checked socket of a live host on ``db``: ``socket`` if given, else found.

    Found means: the host holding ``slug``'s lease (or, without a slug, the
    host holding the most leases), as the file's host registry says, then any
    other registered host, then the default socket (``<db>.sock`` for a file). Every candidate is
    checked before anything is sent to it (see ``control.host_socket``).
    """
    if socket is not None:
        return host_socket(db, socket)
    seen: set[str] = set()
    for candidate in [*registered_sockets(db, slug), default_socket(db)]:
        where = os.path.realpath(candidate)
        if where in seen:
            continue
        seen.add(where)
        found = host_socket(db, candidate)
        if found is not None:
            return found
    return None


def live_host_sockets(db: str, socket: str | None) -> list[str]:
    """Every checked live host socket on ``db`` (just ``socket``'s, if one is given)."""
    if socket is not None:
        found = host_socket(db, socket)
        return [] if found is None else [found]
    live: list[str] = []
    untrusted: list[UntrustedSocket] = []
    candidates = {os.path.realpath(c): c for c in [default_socket(db), *registered_sockets(db)]}
    for candidate in candidates.values():
        try:
            found = host_socket(db, candidate)
        except UntrustedSocket as exc:
            # Another user's file where a socket is looked for (planted at <db>.sock, say)
            # must not hide the hosts that do run: pass it, and say so.
            untrusted.append(exc)
            continue
        if found is not None:
            live.append(found)
    if untrusted and not live:
        raise untrusted[0]
    for passed in untrusted:
        sys.stderr.write(f"Warning: {passed.message}; it was passed over [{passed.code}]\n")
    return live


async def stored_snapshot(log: Log, slug: str, path: str | None = None) -> dict[str, Any]:
    """``{offset, cursor, state, version, source: "checkpoint"}`` of ``slug`` from its checkpoint.

    What a command shows of a processor when no host answers. ``offset`` and
    ``cursor`` are never past the durable head of the processor's path
    (``path``, else the path its lease names, else ``/``), as status shows
    them. A slug with no checkpoint in the log is refused with
    :class:`~streamkit.errors.InvalidRequest`; nothing is written either way.
    """
    store = host_store(log)
    snapshot = await store.stored_snapshot(slug)
    if path is None:
        paths = {lease.path for lease in await store.leases() if lease.slug == slug}
        path = paths.pop() if len(paths) == 1 else "/"
    return shown_snapshot(snapshot, await log.stream(path).head())

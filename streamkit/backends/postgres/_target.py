"""What a ``postgresql://`` target names: the server to connect to, and the schema of the log.

The target is a libpq connection URL (``postgresql://`` or ``postgres://``,
user, password, host, port, database and libpq's own query parameters such
as ``sslmode`` or ``connect_timeout``), plus one parameter of streamkit's:
``schema=NAME``, the PostgreSQL schema the log's tables live in (``public``
when absent), so several logs can share one database. It is taken out of
the URL before libpq sees it. A schema name is refused unless it is a plain
lower-case identifier, so it never needs quoting to mean what it says.

Messages show the target with its password replaced by ``***``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from streamkit.errors import LogOpenError

__all__ = ["DEFAULT_SCHEMA", "PostgresTarget", "masked", "postgres_target"]

DEFAULT_SCHEMA = "public"
_SCHEMES = ("postgresql", "postgres")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class PostgresTarget:
    """A parsed target: ``conninfo`` for libpq, ``schema`` for streamkit, ``shown`` for messages."""

    conninfo: str
    schema: str
    shown: str


def masked(url: str) -> str:
    """``url`` with the password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def postgres_target(target: str) -> PostgresTarget:
    """Parse ``target``; LogOpenError (nothing opened) if it is not a usable PostgreSQL URL."""
    shown = masked(target)[:300]
    try:
        parts = urlsplit(target)
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise LogOpenError(
            f"the target {shown!r} is not a valid PostgreSQL URL ({exc}); nothing was opened "
            "(write postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?schema=NAME])",
            details={"target": shown},
        ) from None
    if parts.scheme.lower() not in _SCHEMES:
        raise LogOpenError(
            f"the target {shown!r} is not a PostgreSQL URL; nothing was opened",
            details={"target": shown},
        )
    schemas = [value for key, value in query if key == "schema"]
    if len(schemas) > 1:
        raise LogOpenError(
            f"the target {shown!r} names the schema {len(schemas)} times; nothing was opened "
            "(give schema=NAME once)",
            details={"target": shown},
        )
    schema = schemas[0] if schemas else DEFAULT_SCHEMA
    if not _SCHEMA_NAME.fullmatch(schema):
        raise LogOpenError(
            f"the schema name {schema[:80]!r} in {shown!r} is refused: it must be 1 to 63 "
            "lower-case letters, digits or underscores, not starting with a digit; nothing was "
            "opened",
            details={"target": shown, "schema": schema[:80]},
        )
    rest = [(key, value) for key, value in query if key != "schema"]
    conninfo = urlunsplit(parts._replace(query=urlencode(rest)))
    return PostgresTarget(conninfo=conninfo, schema=schema, shown=masked(conninfo))

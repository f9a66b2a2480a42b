"""What a log target names: which backend, and where.

One rule for every place a target is written (``open_log``, ``--db``,
``db =`` in streamkit.toml):

- a filesystem path, or ``":memory:"``: SQLite;
- ``sqlite://PATH``: SQLite at ``PATH`` (``sqlite:///var/app.db`` is the
  absolute ``/var/app.db``, ``sqlite://app.db`` is relative,
  ``sqlite://:memory:`` private and in memory);
- ``postgresql://...`` or ``postgres://...``: PostgreSQL, a libpq connection
  URL (user, password, host, port, database and libpq's own parameters such
  as ``sslmode`` or ``connect_timeout``) plus one parameter of streamkit's,
  ``schema=NAME``: the PostgreSQL schema the log's tables live in
  (``public`` when absent), so several logs can share one database. It is
  taken out of the URL before libpq sees it, and refused unless it is a
  plain lower-case identifier, so it never needs quoting. Messages show
  the target with its password replaced by ``***`` (:func:`postgres_target`);
- ``SCHEME://...`` of any other scheme: refused with
  :class:`~streamkit.errors.LogOpenError` (the message names the scheme);
  nothing is opened or created.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from streamkit.errors import LogOpenError

__all__ = [
    "DEFAULT_SCHEMA",
    "PostgresTarget",
    "default_socket",
    "is_postgres_target",
    "masked",
    "own_socket",
    "postgres_target",
    "served_name",
    "shown_target",
    "sqlite_target",
    "target_digest",
]

_SQLITE = "sqlite://"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_POSTGRES = ("postgresql://", "postgres://")


def is_postgres_target(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` names a PostgreSQL log (``postgresql://`` or ``postgres://``)."""
    return isinstance(target, str) and target[:13].lower().startswith(_POSTGRES)


def sqlite_target(target: str | os.PathLike[str]) -> str:
    """The SQLite file (or ``":memory:"``) ``target`` names; LogOpenError for any other backend.

    Ask :func:`is_postgres_target` first: a PostgreSQL URL is refused here too.
    """
    if not isinstance(target, str):
        return os.fspath(target)
    if target.startswith(_SQLITE):
        path = target[len(_SQLITE) :]
        if not path:
            raise LogOpenError(
                f"the target {target!r} names no file; nothing was opened (write sqlite://PATH, "
                "e.g. sqlite:///var/app.db or sqlite://app.db)",
                details={"target": target},
            )
        return path
    if _SCHEME.match(target):
        scheme = target.split("://", 1)[0]
        raise LogOpenError(
            f"no installed backend serves {scheme}:// targets ({target[:200]!r}); nothing was "
            "opened (give a SQLite file path, sqlite://PATH or postgresql://...)",
            details={"target": target[:200], "scheme": scheme},
        )
    return target


DEFAULT_SCHEMA = "public"
_SCHEMES = ("postgresql", "postgres")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SYSTEM_SCHEMAS = frozenset({"information_schema"})


@dataclass(frozen=True)
class PostgresTarget:
    """A parsed target: ``conninfo`` for libpq, ``schema`` for streamkit, ``shown`` for messages."""

    conninfo: str
    schema: str
    shown: str


def masked(url: str) -> str:
    """``url`` with its password, if any (in the user part or as ``password=``), as ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            user = parts.username or ""
            host = parts.netloc.rsplit("@", 1)[1]
            parts = parts._replace(netloc=f"{user}:***@{host}")
        if "password" in parts.query.lower():
            query = [
                (key, "***" if key.lower() == "password" else value)
                for key, value in parse_qsl(parts.query, keep_blank_values=True)
            ]
            parts = parts._replace(query=urlencode(query, safe="*"))
        return urlunsplit(parts)
    except ValueError:
        return "postgresql://***"  # unreadable: show nothing of it


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
    if schema in _SYSTEM_SCHEMAS or schema.startswith("pg_"):
        raise LogOpenError(
            f"the schema name {schema!r} in {shown!r} is refused: it is PostgreSQL's own "
            "(information_schema and pg_* belong to the server); choose a schema of your own; "
            "nothing was opened",
            details={"target": shown, "schema": schema},
        )
    rest = [(key, value) for key, value in query if key != "schema"]
    # libpq's parameters stay exactly as written: re-encoding them would turn %20 into
    # "+", which libpq does not read as a space (application_name=my%20app).
    kept = "&".join(
        piece for piece in parts.query.split("&") if piece and piece.split("=", 1)[0] != "schema"
    )
    conninfo = urlunsplit(parts._replace(query=kept))
    shown = masked(conninfo)
    if schemas:
        shown += f"{'&' if rest else '?'}schema={schema}"
    return PostgresTarget(conninfo=conninfo, schema=schema, shown=shown)


def served_name(target: str | os.PathLike[str]) -> str:
    """What a host tells its clients it serves, so a client can tell it means the same log.

    A SQLite file's real path; for PostgreSQL the server, database and schema
    (never the user or password), in one fixed spelling.
    """
    if is_postgres_target(target):
        parsed = postgres_target(str(target))
        parts = urlsplit(parsed.conninfo)
        host = parts.hostname or "localhost"
        return f"postgresql://{host}:{parts.port or 5432}{parts.path or '/'}?schema={parsed.schema}"
    return os.path.realpath(sqlite_target(target))


def target_digest(target: str | os.PathLike[str]) -> str:
    """A short name for a target in file names (a socket's, say): 12 hex digits of its hash."""
    return hashlib.sha256(served_name(target).encode()).hexdigest()[:12]


def default_socket(target: str | os.PathLike[str]) -> str:
    """Where a host on ``target`` listens unless told otherwise.

    ``<db>.sock`` beside a SQLite file; for PostgreSQL, which has no file to
    sit beside, ``streamkit-<digest>.sock`` in the system's temporary
    directory (sticky, so only its owner may replace it), named by the
    server, database and schema (:func:`served_name`).
    """
    if is_postgres_target(target):
        return os.path.join(tempfile.gettempdir(), f"streamkit-{target_digest(target)}.sock")
    return sqlite_target(target) + ".sock"


def own_socket(target: str | os.PathLike[str], owner: str) -> str:
    """The socket a host takes when another live host holds the default one.

    Beside the default, named by the random token that ends ``owner``.
    """
    token = "".join(c for c in owner.rsplit(":", 1)[-1] if c.isalnum())[:12] or "host"
    return default_socket(target).removesuffix(".sock") + f".{token}.sock"


def shown_target(target: str | os.PathLike[str]) -> str:
    """``target`` as logs and status show it: a PostgreSQL URL without its password."""
    if is_postgres_target(target):
        return masked(str(target))
    return os.fspath(target)

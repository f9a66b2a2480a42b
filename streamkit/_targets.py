"""What a log target names: which backend, and where.

One rule for every place a target is written (``open_log``, ``--db``,
``db =`` in streamkit.toml):

- a filesystem path, or ``":memory:"``: SQLite;
- ``sqlite://PATH``: SQLite at ``PATH`` (``sqlite:///var/app.db`` is the
  absolute ``/var/app.db``, ``sqlite://app.db`` is relative,
  ``sqlite://:memory:`` private and in memory);
- ``postgresql://...`` or ``postgres://...``: PostgreSQL (a libpq URL, plus
  ``schema=NAME``; see :mod:`streamkit.backends.postgres._target`);
- ``SCHEME://...`` of any other scheme: refused with
  :class:`~streamkit.errors.LogOpenError` (the message names the scheme);
  nothing is opened or created.
"""

from __future__ import annotations

import os
import re

from streamkit.errors import LogOpenError

__all__ = ["is_postgres_target", "sqlite_target"]

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

"""The SQLite backend: one file, one writer connection, WAL readers."""

from streamkit.backends.sqlite._storage import SQLITE, SqliteStorage

__all__ = ["SQLITE", "SqliteStorage"]

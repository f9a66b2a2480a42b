"""Retention's rows of an open log, for tests that drive a rule module with their own clock."""

from __future__ import annotations

from streamkit.backends._retention.cuts import TruncationRows
from streamkit.backends.postgres._backend import PostgresLogBackend
from streamkit.backends.postgres.retention import PostgresRetentionRows
from streamkit.backends.sqlite.retention import ROWS
from streamkit.log import Log


def retention_rows(log: Log) -> TruncationRows:
    """The backend's retention rows of ``log`` (SQLite or PostgreSQL)."""
    backend = log.backend
    if isinstance(backend, PostgresLogBackend):
        return PostgresRetentionRows(backend.target.schema)
    return ROWS

"""The SQLite backend: one file, one writer connection, WAL readers."""

"""The PostgreSQL backend (the ``postgres`` extra: psycopg 3): a log shared by hosts on many machines."""

from streamkit.backends.postgres._storage import POSTGRES, PostgresStorage

__all__ = ["POSTGRES", "PostgresStorage"]

"""The PostgreSQL backend (the ``postgres`` extra: psycopg 3): a log shared by hosts on many machines."""

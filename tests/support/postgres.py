"""PostgreSQL for tests: the throwaway server ``scripts/test`` started, or a skip saying how.

``scripts/test`` starts a cluster with ``scripts/pg-cluster`` for each worker
process of a pass (pytest-xdist) when the server is installed, and exports
their URLs, space-separated, as ``STREAMKIT_TEST_POSTGRES``: worker ``gwN``
takes the N-th, so a test that ends every session of a kind on its server
never reaches another worker's. CI sets ``STREAMKIT_REQUIRE_POSTGRES=1`` as
well, so there a missing server fails the tests that need it instead of
skipping them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql

URL_VARIABLE = "STREAMKIT_TEST_POSTGRES"
REQUIRED_VARIABLE = "STREAMKIT_REQUIRE_POSTGRES"
WORKER_VARIABLE = "PYTEST_XDIST_WORKER"
"""Set by pytest-xdist in each worker process: ``gw0``, ``gw1``, ..."""


def postgres_url() -> str:
    """This worker's test server's URL; skips the test (fails it in CI) when there is none."""
    urls = os.environ.get(URL_VARIABLE, "").split()
    if urls:
        worker = os.environ.get(WORKER_VARIABLE, "")
        index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
        if index >= len(urls) > 1:
            pytest.fail(
                f"worker {worker} has no server of its own: {URL_VARIABLE} names "
                f"{len(urls)}; give one URL per worker (or one, shared, for a single process)"
            )
        return urls[index % len(urls)]
    why = (
        f"needs a PostgreSQL server: run scripts/test, which starts a throwaway one when the "
        f"server is installed (Debian: postgresql-15), or set {URL_VARIABLE} to a URL"
    )
    if os.environ.get(REQUIRED_VARIABLE):
        pytest.fail(f"{REQUIRED_VARIABLE} is set but no server is: {why}")
    pytest.skip(why)


def fresh_schema_name() -> str:
    """A schema name no other test uses."""
    return f"t_{uuid.uuid4().hex[:16]}"


@contextmanager
def dropped_after(url: str, *schemas: str) -> Iterator[None]:
    """Drop ``schemas`` (and all in them) when the block ends, however it ends."""
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )

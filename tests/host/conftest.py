"""What the host tests share: a fresh log on every backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.backends import BACKENDS, Target


@pytest.fixture(params=sorted(BACKENDS))
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A fresh log target, once per backend (SQLite, PostgreSQL), removed afterwards."""
    made = BACKENDS[request.param].fresh()
    try:
        yield made
    finally:
        made.remove()

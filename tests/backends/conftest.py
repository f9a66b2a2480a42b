"""Fixtures of the backend tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support.backends import BACKENDS, Target


@pytest.fixture
async def pg() -> AsyncIterator[Target]:
    """A fresh log on the test PostgreSQL server (a schema of its own, dropped after)."""
    target = BACKENDS["postgres"].fresh()
    try:
        yield target
    finally:
        target.remove()

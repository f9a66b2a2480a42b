"""The fixtures of the contract suites: each is parametrized over every backend.

``log_target`` is a fresh, empty target of one backend (``support.backends``);
``log`` opens it (overriding the SQLite-only ``log`` of the root conftest);
``store`` is that log's host store. A suite that takes any of them runs
once per backend; a backend joins by adding its entry to ``BACKENDS``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from support.backends import BACKENDS, Target

from streamkit.backends import host_store
from streamkit.log import Log
from streamkit.protocols import HostStore


@pytest.fixture(params=sorted(BACKENDS))
def log_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A fresh target of one backend, removed afterwards."""
    target = BACKENDS[request.param].fresh()
    try:
        yield target
    finally:
        target.remove()


@pytest.fixture
async def log(log_target: Target) -> AsyncIterator[Log]:
    """An open log on ``log_target``, closed after the test."""
    opened = log_target.open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def store(log: Log) -> HostStore:
    """The host store of ``log``'s backend, its tables prepared."""
    made = host_store(log)
    await made.prepare()
    return made

"""The fixtures of the contract suites: each is parametrized over every backend.

``log_target`` is a fresh, empty target of one backend (``support.backends``);
``log`` opens it (overriding the SQLite-only ``log`` of the root conftest);
``store`` is that log's host store. A suite that takes any of them runs
once per backend; a backend joins by adding its entry to ``BACKENDS``. A
module that sets ``ALSO_IN_MEMORY = True`` runs on a private in-memory log
too (``WITH_MEMORY``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from support.backends import BACKENDS, WITH_MEMORY, Target

from streamkit.backends import host_store
from streamkit.log import Log
from streamkit.protocols import HostStore


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test that takes ``log_target`` runs once per backend, and once more on a private
    in-memory log in a module that says ``ALSO_IN_MEMORY = True``."""
    if "log_target" in metafunc.fixturenames:
        names = WITH_MEMORY if getattr(metafunc.module, "ALSO_IN_MEMORY", False) else BACKENDS
        metafunc.parametrize("log_target", sorted(names), indirect=True)


@pytest.fixture
def log_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A fresh target of one backend, removed afterwards."""
    target = WITH_MEMORY[request.param].fresh()
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

"""Shared fixtures (a log file under the test's temporary directory, an open log on it,
a short private directory for Unix sockets, an engine rig)
and the hypothesis profile: CI runs derandomized, so a landing never hinges on a lucky draw;
local runs explore new examples each time (and replay saved failures).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from support.engine import Rig

from streamkit import SPEED_TRICKS, open_log
from streamkit.log import Log

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first; under STREAMKIT_PLAIN=1 the tests that pin a speed trick itself
    are skipped, saying so.

    Slow first: scripts/test spreads a pass over worker processes, which take
    tests in this order, so the multi-process drills start at once, side by
    side, rather than one of them last, alone, while the other workers idle.
    Every other test runs both ways (scripts/test runs the suite with the
    switch on, then off): the plain twins must give the same outcomes.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if SPEED_TRICKS:
        return
    off = pytest.mark.skip(reason="pins a speed trick, which STREAMKIT_PLAIN=1 turns off")
    for item in items:
        if item.get_closest_marker("speed_trick") is not None:
            item.add_marker(off)


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    """Where the test's log lives (not created until a log is opened on it)."""
    return tmp_path / "log.db"


@pytest.fixture
async def log(log_file: Path) -> AsyncIterator[Log]:
    """An open log on ``log_file``, closed after the test."""
    opened = open_log(log_file)
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory under /tmp: tmp_path can be too long for AF_UNIX's ~107 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="sk-", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """A fresh engine rig (memory stream, storage, clock); its engines are closed afterwards."""
    made = Rig()
    try:
        yield made
    finally:
        await made.close()

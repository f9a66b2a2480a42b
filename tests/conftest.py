"""Shared fixtures: a log file under the test's temporary directory, and an open log on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from streamkit.log import Log, open_log


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

"""Shared fixtures (a log file under the test's temporary directory, an open log on it)
and the hypothesis profile: CI runs derandomized, so a landing never hinges on a lucky draw;
local runs explore new examples each time (and replay saved failures).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import settings

from streamkit import open_log
from streamkit.log import Log

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


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

"""pytest plugin (registered through the ``pytest11`` entry point): fixtures for processor tests.

- ``streamkit_stream``: a fresh :class:`~streamkit.testing.MemoryStream` at ``/``,
  stamping its events by ``streamkit_clock``;
- ``streamkit_storage``: a fresh :class:`~streamkit.testing.MemoryStorage`, closed
  after the test;
- ``streamkit_clock``: a :class:`~streamkit.testing.ManualClock` to pass as ``clock=``.

The fixtures are synchronous, so the plugin works with any async test runner.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from streamkit.testing import ManualClock, MemoryStorage, MemoryStream, memory_storage


@pytest.fixture
def streamkit_stream(streamkit_clock: ManualClock) -> MemoryStream:
    """An in-memory stream at ``/`` that pushes appends to the engines in its ``.engines``.

    Its events' ``created_at`` is the test's one clock, ``streamkit_clock``, so a
    time derived from an event and a time read from the clock agree.
    """
    return MemoryStream("/", clock=streamkit_clock)


@pytest.fixture
def streamkit_storage() -> Iterator[MemoryStorage]:
    """The real checkpoint table over in-memory SQLite, closed when the test ends."""
    storage = memory_storage()
    try:
        yield storage
    finally:
        storage.close()


@pytest.fixture
def streamkit_clock() -> ManualClock:
    """A wall clock that moves only when the test calls ``advance``."""
    return ManualClock()

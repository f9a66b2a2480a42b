"""What the host tests share: a fresh log on every backend, and a daemon rig over one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from support.backends import BACKENDS, Target
from support.daemon import HostRig


@pytest.fixture(params=sorted(BACKENDS))
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A fresh log target, once per backend (SQLite, PostgreSQL), removed afterwards."""
    made = BACKENDS[request.param].fresh()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(params=sorted(BACKENDS))
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[HostRig]:
    """A daemon rig on a fresh log of each backend in turn (the same drills over both)."""
    target = None if request.param == "sqlite" else BACKENDS[request.param].fresh()
    try:
        with closing(HostRig(tmp_path, target)) as made:
            yield made
    finally:
        if target is not None:
            target.remove()

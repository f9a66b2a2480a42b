"""The storage backends the contract suites run over: one entry each.

A backend here is how a test gets a fresh, empty log target of that kind
and how it opens it. The contract suites (``tests/contract``) are written
against these entries only, so a new backend joins every suite by adding
one entry to :data:`BACKENDS`: the same tests, not copies.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamkit import open_log
from streamkit.log import Log


@dataclass(frozen=True)
class Backend:
    """One storage engine under test."""

    name: str

    def fresh(self) -> Target:
        """A new, empty log target of this backend (remove it with :meth:`Target.remove`)."""
        directory = Path(tempfile.mkdtemp(prefix=f"streamkit-{self.name}-"))
        return Target(self, str(directory / "log.db"), directory)


@dataclass(frozen=True)
class Target:
    """A log target of one backend: what ``open_log`` is given."""

    backend: Backend
    target: str
    directory: Path

    def open(self, **options: Any) -> Log:
        """Open the log (one more connection to the same storage, like another process)."""
        return open_log(self.target, **options)

    def remove(self) -> None:
        """Delete the storage."""
        shutil.rmtree(self.directory, ignore_errors=True)


BACKENDS = {"sqlite": Backend("sqlite")}
"""Every backend the contract suites run over (PostgreSQL joins with its fixture)."""

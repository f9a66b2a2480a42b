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
from support.postgres import dropped_after, fresh_schema_name, postgres_url


@dataclass(frozen=True)
class Backend:
    """One storage engine under test."""

    name: str

    @property
    def fast(self) -> dict[str, Any]:
        """``open`` options that trade durability against a crash of the machine for speed.

        For suites that open many logs (the model); the PostgreSQL test server
        runs with fsync off already.
        """
        return {"synchronous": "NORMAL"} if self.name == "sqlite" else {}

    def fresh(self) -> Target:
        """A new, empty log target of this backend (remove it with :meth:`Target.remove`).

        PostgreSQL's is a schema of its own on the test server (the test skips,
        or fails in CI, without one: ``support.postgres``).
        """
        directory = Path(tempfile.mkdtemp(prefix=f"streamkit-{self.name}-"))
        if self.name == "memory":
            return Target(self, ":memory:", directory)
        if self.name == "postgres":
            url = postgres_url()
            schema = fresh_schema_name()
            joiner = "&" if "?" in url else "?"
            return Target(self, f"{url}{joiner}schema={schema}", directory, (url, schema))
        return Target(self, str(directory / "log.db"), directory)


@dataclass(frozen=True)
class Target:
    """A log target of one backend: what ``open_log`` is given."""

    backend: Backend
    target: str
    directory: Path
    schema: tuple[str, str] | None = None
    """PostgreSQL's server URL and schema (dropped by :meth:`remove`)."""

    def open(self, **options: Any) -> Log:
        """Open the log (one more connection to the same storage, like another process; a
        memory target opens a new, empty log each time)."""
        return open_log(self.target, **options)

    def remove(self) -> None:
        """Delete the storage."""
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.schema is not None:
            url, schema = self.schema
            with dropped_after(url, schema):
                pass


BACKENDS = {"sqlite": Backend("sqlite"), "postgres": Backend("postgres")}
"""Every backend the contract suites run over."""

WITH_MEMORY = {**BACKENDS, "memory": Backend("memory")}
"""The same, and a private in-memory log (``":memory:"``), which a second ``open`` does not
see: for the suites whose tests keep to the one log they opened (``pytestmark =
pytest.mark.parametrize("log_target", sorted(WITH_MEMORY), indirect=True)``)."""

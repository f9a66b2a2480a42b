"""Run ``python -m streamkit host`` as a real daemon subprocess (not a test module).

A :class:`DaemonRig` (one per test, closed in a ``finally`` or a fixture's teardown)
guarantees:

- every child it starts, or is handed through :meth:`DaemonRig.track`, is killed with
  SIGKILL if still running when :meth:`DaemonRig.close` runs, and reaped either way;
- each host's stdout and stderr are appended to ``<tmp>/<log>.log`` (restarts under one
  log name share the file);
- :meth:`DaemonRig.start_host` returns only once the host's control socket answers, and
  fails with the host's log if the child exits first or is not up within 30 s;
- control sockets live in a fresh short directory under /tmp (a Unix socket path must stay
  under ~100 bytes, too short for pytest's ``tmp_path``), removed by ``close``.

A :class:`HostRig` is the one the host drills share (tests/host/conftest.py makes one per
backend): hosts over ``support/host.py``'s processors and CLI commands against one log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from streamkit.cli._args import served_log
from streamkit.cli._host_commands import _merged_status as merged_status
from streamkit.control import live_server_at, request_sync
from support import SUPPORT
from support.backends import Target

STARTUP_TIMEOUT = 30.0

_Child = TypeVar("_Child", bound="subprocess.Popen[Any]")


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``check`` every 50 ms until it holds; fail once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


class DaemonRig:
    """Starts ``streamkit host`` children in ``tmp`` and kills every one of them at the end.

    ``tmp_on_pythonpath`` puts ``tmp`` first on the children's PYTHONPATH (for processor or
    handler modules a test writes there); ``extra_env`` adds variables. With neither, the
    children inherit the environment as it is (``env`` is None).
    """

    def __init__(
        self,
        tmp: Path,
        *,
        socket_prefix: str,
        tmp_on_pythonpath: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.sockets = Path(tempfile.mkdtemp(dir="/tmp", prefix=socket_prefix))
        self.children: list[subprocess.Popen[Any]] = []
        self.env: dict[str, str] | None = None
        if tmp_on_pythonpath or extra_env:
            self.env = {**os.environ, **(extra_env or {})}
            if tmp_on_pythonpath:
                self.env["PYTHONPATH"] = os.pathsep.join(
                    [str(tmp), *filter(None, [os.environ.get("PYTHONPATH")])]
                )

    def socket(self, name: str) -> str:
        """The control socket path of the host called ``name``."""
        return str(self.sockets / f"{name}.sock")

    def host_log(self, log: str) -> str:
        """What the hosts logging to ``<tmp>/<log>.log`` have written so far."""
        return (self.tmp / f"{log}.log").read_text(errors="replace")

    def track(self, child: _Child) -> _Child:
        """Have ``child`` killed and reaped with the hosts when the rig closes."""
        self.children.append(child)
        return child

    def start_host(self, name: str, *args: str, log: str | None = None) -> subprocess.Popen[bytes]:
        """Run ``python -m streamkit host --socket <socket(name)> *args`` and wait for the socket.

        The child runs in ``tmp`` with the rig's ``env``; its output is appended to
        ``<tmp>/<log>.log`` (``log`` defaults to ``name``).
        """
        log = name if log is None else log
        socket = self.socket(name)
        argv = [sys.executable, "-m", "streamkit", "host", "--socket", socket, *args]
        with (self.tmp / f"{log}.log").open("ab") as out:  # the child keeps its own copy
            child = self.track(
                subprocess.Popen(argv, env=self.env, stdout=out, stderr=out, cwd=self.tmp)
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not live_server_at(socket):
            assert child.poll() is None, self.host_log(log)
            assert time.monotonic() < deadline, "host did not start"
            time.sleep(0.02)
        return child

    def kill_all(self) -> None:
        """SIGKILL every tracked child still running, then reap them all."""
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait()

    def close(self) -> None:
        """Kill and reap the children, then remove the socket directory."""
        try:
            self.kill_all()
        finally:
            shutil.rmtree(self.sockets, ignore_errors=True)


def admin_address(db: Path | str, *flags: str) -> str:
    """What ``streamkit admin --db DB [flags]`` prints, as the host's owner runs it."""
    return subprocess.run(
        [sys.executable, "-m", "streamkit", "admin", "--db", str(db), *flags],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()


def owner_headers(db: Path | str) -> dict[str, str]:
    """The token header of the host on ``db``, as its owner gets it (``admin --token``)."""
    return {"Authorization": f"Bearer {admin_address(db, '--token')}"}


def wait_for_http(base: str) -> None:
    """Wait until the HTTP surface at ``base`` answers ``/healthz`` with 200."""
    import httpx  # the web tests' client; the rest of the support package needs none

    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    eventually(up)


class HostRig(DaemonRig):
    """Spawns hosts and CLI commands against one log; kills every child at the end.

    ``db`` is a SQLite file in ``tmp_path`` or, given a PostgreSQL ``target``,
    its URL (a schema of its own on the test server).
    """

    def __init__(self, tmp_path: Path, target: Target | None = None) -> None:
        shutil.copy(SUPPORT / "host.py", tmp_path / "hostprocs.py")
        super().__init__(tmp_path, socket_prefix="skd", tmp_on_pythonpath=True)
        self.db = str(tmp_path / "d.db") if target is None else target.target
        self.target = target

    def host(self, name: str, *processors: str, ttl: str = "5") -> subprocess.Popen[bytes]:
        argv = ["--db", self.db, "--lease-ttl", ttl, "--log-format", "json"]
        for processor in processors or ("hostprocs:Tally",):
            argv += ["--processor", processor]
        return self.start_host(name, *argv)

    def cli(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "streamkit", *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def status(self, name: str) -> dict[str, Any]:
        """What ``streamkit status --socket`` of host ``name`` prints as JSON, asked from this
        process over the control socket: the drills poll it, and a CLI process a poll cost
        each a Python start-up (tests/cli and docs/cli.md run the command itself)."""
        answer = request_sync(self.socket(name), "status", db=served_log(self.db), timeout=30)
        return merged_status([answer])

    def cli_status(self, name: str) -> dict[str, Any]:
        """The same through ``streamkit status --json`` in a process of its own."""
        out = self.cli("status", "--db", self.db, "--socket", self.socket(name), "--json").stdout
        status: dict[str, Any] = json.loads(out)
        return status

    def row(self, name: str, slug: str = "tally") -> dict[str, Any]:
        return next(r for r in self.status(name)["processors"] if r["slug"] == slug)

"""Clients trust only the host's own socket; a host refuses a socket directory others can write."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.host import Tally

from streamkit import open_log
from streamkit.config import HostConfig
from streamkit.errors import ControlSocketInUse, InvalidRequest, UntrustedSocket
from streamkit.host import ProcessorHost

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="handing a file to another user needs root"
)


class PlantedServer:
    """A listening Unix socket that records whatever a client sends it, as an impostor would."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.received = b""
        self.connections = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                self.connections += 1
                conn.settimeout(0.5)
                try:
                    self.received += conn.recv(65536)
                    conn.sendall(b'{"id":1,"ok":true,"result":{"db":"/fake"}}\n')
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def make_log(db: Path) -> None:
    async with open_log(db) as log:
        await log.stream("/").head()


async def durable_count(db: Path) -> int:
    async with open_log(db) as log:
        return len((await log.stream("/").read()).events)


@ROOT_ONLY
async def test_a_socket_planted_by_another_user_is_refused(short_dir: Path) -> None:
    """append refuses a live socket owned by another user, naming that owner; nothing is sent."""
    db = short_dir / "a.db"
    await make_log(db)
    planted = PlantedServer(f"{db}.sock")
    try:
        os.chown(planted.path, 12345, 12345)
        done = await asyncio.to_thread(cli, "append", "--db", str(db), "item")
        status = await asyncio.to_thread(cli, "status", "--db", str(db))
    finally:
        planted.close()
    assert done.returncode == 1
    assert "owned by uid 12345" in done.stderr
    assert "nothing was sent" in done.stderr
    assert "[CONTROL_SOCKET_UNTRUSTED]" in done.stderr
    assert status.returncode == 1  # status shows no fake host either
    assert planted.received == b""
    assert planted.connections == 0
    assert await durable_count(db) == 0


async def test_a_socket_others_may_connect_to_is_refused(short_dir: Path) -> None:
    """A socket of this user's whose mode lets others in is not a host's: refused, nothing sent."""
    db = short_dir / "a.db"
    await make_log(db)
    planted = PlantedServer(f"{db}.sock")
    try:
        os.chmod(planted.path, 0o666)
        done = await asyncio.to_thread(cli, "append", "--db", str(db), "item")
    finally:
        planted.close()
    assert done.returncode == 1
    assert "its mode is 0666, not 0600" in done.stderr
    assert planted.connections == 0


async def test_a_socket_serving_another_database_is_refused(short_dir: Path) -> None:
    """--socket pointing at another database's host: refused naming both; nothing written anywhere."""
    served, other = short_dir / "a.db", short_dir / "b.db"
    await make_log(other)
    config = HostConfig.model_validate({"db": str(served), "shutdown_grace": 0.0})
    async with ProcessorHost(config, processors=[Tally()]):
        done = await asyncio.to_thread(
            cli, "append", "--db", str(other), "--socket", f"{served}.sock", "item"
        )
    assert done.returncode == 1
    assert f"this host serves '{served}'" in done.stderr
    assert str(other) in done.stderr
    assert await durable_count(served) == 0
    assert await durable_count(other) == 0


async def test_a_host_refuses_a_socket_directory_others_can_write(short_dir: Path) -> None:
    """A socket directory writable by others without the sticky bit: refused before the db exists."""
    shared = short_dir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    db = short_dir / "h.db"
    config = HostConfig.model_validate(
        {"db": str(db), "socket": str(shared / "h.sock"), "shutdown_grace": 0.0}
    )
    try:
        with pytest.raises(UntrustedSocket, match="lets other users create, replace and remove"):
            await ProcessorHost(config, processors=[Tally()]).start()
        assert not db.exists()
        allowed = config.model_copy(update={"shared_socket_dir": True})
        async with ProcessorHost(allowed, processors=[Tally()]) as host:
            assert host.runner("tally").state == "running"
    finally:
        shared.chmod(0o700)
        for child in shared.iterdir():
            child.unlink()
        shared.rmdir()


@pytest.mark.parametrize("shared", [False, True])
async def test_a_missing_socket_directory_is_refused_before_the_db_exists(
    short_dir: Path, shared: bool
) -> None:
    """A socket in a directory that does not exist: refused first, no database created."""
    db = short_dir / "m.db"
    config = HostConfig.model_validate(
        {
            "db": str(db),
            "socket": str(short_dir / "nowhere" / "m.sock"),
            "shared_socket_dir": shared,
        }
    )
    with pytest.raises(InvalidRequest, match="does not exist; create it"):
        await ProcessorHost(config, processors=[Tally()]).start()
    assert not db.exists()


@ROOT_ONLY
async def test_a_planted_default_socket_does_not_hide_the_host_that_runs(short_dir: Path) -> None:
    """The real host on its own socket: status and admin reach it, warning of the planted one."""
    db = short_dir / "p.db"
    own = short_dir / "own.sock"
    config = HostConfig.model_validate({"db": str(db), "socket": str(own), "shutdown_grace": 0.0})
    async with ProcessorHost(config, processors=[Tally()]):
        planted = PlantedServer(f"{db}.sock")
        try:
            os.chown(planted.path, 12345, 12345)
            status = await asyncio.to_thread(cli, "status", "--db", str(db))
            done = await asyncio.to_thread(cli, "append", "--db", str(db), "item")
        finally:
            planted.close()
    assert status.returncode == 0, status.stderr
    assert "tally" in status.stdout
    assert "owned by uid 12345" in status.stderr
    assert "it was passed over [CONTROL_SOCKET_UNTRUSTED]" in status.stderr
    assert done.returncode == 0, done.stderr
    assert planted.connections == 0
    assert await durable_count(db) == 1


@pytest.mark.parametrize("kind", ["file", "directory"])
async def test_a_socket_path_taken_by_a_file_or_directory_fails_the_start_creating_nothing(
    short_dir: Path, kind: str
) -> None:
    """Refused before the log is opened: no database file is left behind."""
    db = short_dir / "n.db"
    taken = short_dir / "n.sock"
    if kind == "file":
        taken.write_text("")
    else:
        taken.mkdir()
    config = HostConfig.model_validate({"db": str(db), "socket": str(taken), "shutdown_grace": 0.0})
    with pytest.raises(ControlSocketInUse, match="exists and is"):
        await ProcessorHost(config, processors=[Tally()]).start()
    assert not db.exists()
    assert taken.exists()  # left untouched

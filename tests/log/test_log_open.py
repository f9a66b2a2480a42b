"""Opening a log says what is really wrong: damaged, or not writable; a read-only log still reads."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from streamkit import InvalidConfig, InvalidRequest, LogOpenError, ReduceCheckpointTable, open_log
from streamkit.cli import main
from streamkit.config import load_config


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


async def make_log(path: Path, count: int = 50) -> None:
    async with open_log(path) as log:
        await log.stream("/").append(
            *({"type": "item", "payload": {"n": n, "pad": "p" * 2000}} for n in range(count))
        )


async def test_a_truncated_log_is_reported_as_damaged_with_how_to_check(tmp_path: Path) -> None:
    """A log cut short is 'damaged', with the integrity check and the backup to restore from."""
    path = tmp_path / "cut.db"
    await make_log(path)
    size = path.stat().st_size
    with path.open("r+b") as handle:
        handle.truncate(size // 3)
    with pytest.raises(LogOpenError) as caught:
        open_log(path)
    message = caught.value.message
    assert caught.value.details["reason"] == "damaged"
    assert "damaged" in message
    assert "PRAGMA integrity_check" in message
    assert "backup" in message
    assert "not a SQLite database" not in message


@pytest.fixture
def read_only_dir() -> Iterator[Path]:
    """A directory on a tmpfs that the test remounts read-only (needs root and mount)."""
    where = Path(tempfile.mkdtemp(prefix="skro"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "tmpfs", str(where)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        shutil.rmtree(where, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def remount_read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def test_a_log_that_cannot_be_written_says_so_and_still_reads(read_only_dir: Path) -> None:
    """On a read-only file system: opening to write names the cause; read, status, snapshot work."""
    path = read_only_dir / "ro.db"
    asyncio.run(make_log(path, count=3))
    with closing(sqlite3.connect(path)) as conn, conn:
        ReduceCheckpointTable(conn).write(
            "tally", reducer_version="1", reduced_through_offset=3, state_json='{"n": 3}'
        )
    remount_read_only(read_only_dir)
    assert not os.access(read_only_dir, os.W_OK) or os.statvfs(read_only_dir).f_flag & os.ST_RDONLY

    with pytest.raises(LogOpenError) as caught:
        open_log(path)
    assert caught.value.details["reason"] == "not_writable"
    assert "cannot be written here" in caught.value.message
    assert "not a SQLite database" not in caught.value.message

    async def read_only_session() -> list[int]:
        async with open_log(path, read_only=True) as log:
            page = await log.stream("/").read()
            with pytest.raises(InvalidRequest, match="opened read-only; nothing was written"):
                await log.stream("/").append({"type": "item"})
            return [event.offset for event in page.events]

    assert asyncio.run(read_only_session()) == [1, 2, 3]
    code, out = run("read", "--db", str(path))
    assert code == 0
    assert re.match(r"1  \S+Z  item  ", out.splitlines()[0])
    assert run("status", "--db", str(path))[0] == 0
    code, out = run("snapshot", "tally", "--db", str(path), "--json")
    assert code == 0
    assert json.loads(out)["state"] == {"n": 3}
    code, out = run("append", "--db", str(path), "item")
    assert code == 1


async def test_a_sqlite_url_opens_the_file_it_names(tmp_path: Path) -> None:
    """sqlite:///abs/path and a plain path open the same log; sqlite://:memory: is in memory."""
    path = tmp_path / "url.db"
    async with open_log(f"sqlite://{path}") as log:
        assert log.path == str(path)
        await log.stream("/").append({"type": "a"})
    async with open_log(path) as log:
        assert await log.stream("/").head() == 1
    async with open_log("sqlite://:memory:") as log:
        assert log.path == ":memory:"
        assert await log.stream("/").head() == 0


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("postgresql://app@127.0.0.1:1/app?connect_timeout=2", "unreachable"),
        ("redis://localhost", "redis://"),
        ("sqlite://", "names no file"),
    ],
)
def test_a_target_no_backend_serves_is_refused_and_nothing_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, said: str
) -> None:
    """An unknown scheme, an empty sqlite:// target or a PostgreSQL server that does not answer
    is LOG_OPEN_REFUSED; no file appears."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LogOpenError, match=said) as caught:
        open_log(target)
    assert "nothing was opened" in caught.value.message
    assert list(tmp_path.iterdir()) == []


def test_every_db_option_takes_a_sqlite_url(tmp_path: Path) -> None:
    """--db sqlite://PATH appends and reads the file; another scheme is refused with its code."""
    db = tmp_path / "cli.db"
    assert run("append", "--db", f"sqlite://{db}", "item", "--payload", '{"n": 1}')[0] == 0
    code, out = run("read", "--db", f"sqlite://{db}", "--json")
    assert code == 0
    assert json.loads(out.splitlines()[0])["payload"] == {"n": 1}
    assert run("read", "--db", "redis://x/y")[0] == 1


def test_a_config_db_may_be_a_sqlite_or_postgresql_url_and_another_scheme_is_refused(
    tmp_path: Path,
) -> None:
    """db = "sqlite://..." is the file, "postgresql://..." is kept (its schema checked at load),
    another scheme is INVALID_CONFIG."""
    good = tmp_path / "good.toml"
    good.write_text(f'db = "sqlite://{tmp_path}/h.db"\n')
    assert load_config(good).db == tmp_path / "h.db"
    server = tmp_path / "pg.toml"
    server.write_text('db = "postgresql://app@db.internal/app?schema=shop"\n')
    loaded = load_config(server)
    assert loaded.db == "postgresql://app@db.internal/app?schema=shop"
    assert loaded.socket_path.name.startswith("streamkit-")
    bad_schema = tmp_path / "bad_schema.toml"
    bad_schema.write_text('db = "postgresql://app@db.internal/app?schema=Shop"\n')
    with pytest.raises(InvalidConfig, match=r"db: the schema name 'Shop'"):
        load_config(bad_schema)
    bad = tmp_path / "bad.toml"
    bad.write_text('db = "redis://x/y"\n')
    with pytest.raises(InvalidConfig, match=r"db: no installed backend serves redis://"):
        load_config(bad)

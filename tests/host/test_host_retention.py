"""What a path's history must keep, seen from a running host and from the command line.

Over every backend: a host runs a processor whose state points back into
the log (``retain_from``). Its status, ``/metrics`` and ``streamkit status``
name the horizon and who holds it; an operator's hold lowers it and its
release lifts it, each recorded in the log; the processor holds its
history while its host is gone, and only ``streamkit processor forget``,
refused while a live host runs it, lets go.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.backends import BACKENDS, Target
from support.host import Effector, Sums

from streamkit import open_log
from streamkit.cli import main
from streamkit.config import HostConfig
from streamkit.holds import HOLD_PLACED, HOLD_RELEASED, PROCESSOR_FORGOTTEN
from streamkit.host import ProcessorHost
from streamkit.web._metrics import exposition


class Keeper(Effector):
    """An effector whose state needs the log from offset 3 on once it folded anything."""

    def retain_from(self, state: Sums) -> int | None:
        return 3 if state.items else None


@pytest.fixture(params=sorted(BACKENDS))
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    made = BACKENDS[request.param].fresh()
    try:
        yield made
    finally:
        made.remove()


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


async def until(check: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_the_horizon_is_shown_held_released_and_let_go_only_when_forgotten(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    config = HostConfig.model_validate(
        {"db": target.target, "lease": {"ttl": 1.0, "heartbeat": 0.1}, "shutdown_grace": 1.0}
    )
    host = ProcessorHost(config, processors=[Keeper()], serve_control=False, owner="a")
    db = target.target
    try:
        await host.start()
        async with open_log(db) as log:
            stream = log.stream("/")
            appended = await stream.append(
                *({"type": "item", "payload": {"n": 1}} for _ in range(9))
            )
            await host.wait_until_processed("effector", appended[-1].offset, timeout=30)

        status = await host.status()
        (row,) = status["retention"]
        assert (row["path"], row["horizon"]) == ("/", 3)
        assert row["held_by"] == [
            {
                "kind": "processor",
                "name": "effector@1",
                "from": 3,
                "why": "retain_from",
                "state": "serving",
            }
        ]
        metrics = exposition(
            status,
            follow_age=None,
            log_stats=host.log.stats if host.log else None,
            lag_seconds={},
            histograms={},
        ).decode()
        assert 'streamkit_retention_horizon{path="/"} 3.0' in metrics
        assert (
            'streamkit_retention_held_by{kind="processor",name="effector@1",path="/",'
            'why="retain_from"} 1.0'
        ) in metrics

        code, said = await asyncio.to_thread(
            cli,
            "retention",
            "hold",
            "/",
            "audit",
            "--from",
            "2",
            "--reason",
            "auditors",
            "--by",
            "ops",
            "--db",
            db,
        )
        assert (code, said.startswith("hold 'audit' keeps / from offset 2")) == (0, True)
        code, shown = await asyncio.to_thread(cli, "retention", "horizon", "--db", db)
        assert code == 0
        assert "horizon 2" in shown.splitlines()[0]
        assert "* hold audit: hold, from 2" in shown
        assert "  processor effector@1 (serving): retain_from, from 3" in shown
        code, text = await asyncio.to_thread(cli, "status", "--db", db)
        assert code == 0
        assert "retention:" in text
        assert "held by hold audit: hold" in text
        code, _ = await asyncio.to_thread(
            cli, "retention", "release", "/", "audit", "--reason", "done", "--db", db
        )
        assert code == 0

        # A live host runs it: forgetting it is refused, nothing written.
        capsys.readouterr()
        code, _ = await asyncio.to_thread(
            cli, "processor", "forget", "effector", "--reason", "gone", "--db", db
        )
        assert code == 1
        assert "runs on host(s) a" in capsys.readouterr().err
    finally:
        await host.stop(grace=0.0)

    # Offline, it still holds its history.
    code, shown = await asyncio.to_thread(cli, "retention", "horizon", "--json", "--db", db)
    assert code == 0
    assert '"horizon":3' in shown
    code, said = await asyncio.to_thread(
        cli, "processor", "forget", "effector", "--reason", "removed in 9", "--db", db
    )
    assert code == 0, said
    assert said.startswith("forgot effector (version 1)")
    async with open_log(db) as log:
        page = await log.stream("/").read(0, 1000)
        head = await log.stream("/").head()
        types = [e.type for e in page.events if e.type.startswith("streamkit.")]
    assert types == [HOLD_PLACED, HOLD_RELEASED, PROCESSOR_FORGOTTEN]
    code, shown = await asyncio.to_thread(cli, "retention", "horizon", "--json", "--db", db)
    assert f'"horizon":{head + 1}' in shown


async def test_an_archived_path_is_read_whole_by_a_new_processor_and_proven_by_verify(
    target: Target, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`retention run --archive` takes what nobody needs; a processor that starts afterwards
    builds its state from the archive and the log together; `verify --archive` names damage."""
    config = HostConfig.model_validate(
        {"db": target.target, "lease": {"ttl": 1.0, "heartbeat": 0.1}, "shutdown_grace": 1.0}
    )
    db, archive = target.target, str(tmp_path / "archive")
    async with open_log(db) as log:
        await log.stream("/").append(*({"type": "item", "payload": {"n": n}} for n in range(1, 31)))
    code, said = await asyncio.to_thread(
        cli, "retention", "run", "/", "--archive", archive, "--chunk", "8", "--db", db
    )
    assert code == 0, said
    assert said.startswith("/: archived 30 events in 4 chunk(s); it starts at offset 31")
    code, said = await asyncio.to_thread(cli, "verify", "--archive", "--db", db)
    assert (code, said) == (0, "4 segment(s) checked: every byte as recorded\n")
    capsys.readouterr()
    code, _ = await asyncio.to_thread(cli, "read", "--db", db)
    assert code == 1
    assert "[HISTORY_TRUNCATED]" in capsys.readouterr().err
    code, shown = await asyncio.to_thread(
        cli, "read", "--db", db, "--include-archive", "--limit", "2", "--json"
    )
    assert code == 0
    assert [json.loads(line)["payload"]["n"] for line in shown.splitlines()] == [1, 2]
    code, text = await asyncio.to_thread(cli, "status", "--db", db)
    assert "  /  start 31, horizon " in text
    assert "; archived 4 segment(s), " in text

    host = ProcessorHost(config, processors=[Effector()], serve_control=False, owner="late")
    try:
        await host.start()
        async with open_log(db) as log:
            (last,) = await log.stream("/").append({"type": "item", "payload": {"n": 100}})
        await host.wait_until_processed("effector", last.offset, timeout=30)
        snapshot = await host.snapshot("effector")
        assert snapshot["state"] == {"total": sum(range(1, 31)) + 100, "items": 31}
    finally:
        await host.stop(grace=0.0)

    segment = await asyncio.to_thread(flip_a_byte, Path(archive), 1)
    code, said = await asyncio.to_thread(cli, "verify", "--archive", "--db", db)
    assert code == 1
    assert f"DAMAGED: segment {segment} of / (9..16) has SHA-256 " in said
    assert said.endswith("4 segment(s) checked: 1 problem(s)\n")


def flip_a_byte(archive: Path, index: int) -> Path:
    """Flip a byte in the middle of the ``index``-th segment file of ``archive``; that file."""
    file = sorted(archive.iterdir())[index]
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))
    return file

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
import dataclasses
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.backends import Target
from support.host import Effector, Sums

from streamkit import open_log
from streamkit.checkpoint import BEGAN_EVENT
from streamkit.cli import main
from streamkit.config import HostConfig
from streamkit.contract import StartFrom
from streamkit.errors import HistoryTruncated
from streamkit.holds import HOLD_PLACED, HOLD_RELEASED, PROCESSOR_FORGOTTEN
from streamkit.host import ProcessorHost
from streamkit.web._metrics import exposition


def starting(start: StartFrom) -> Effector:
    """An :class:`Effector` whose contract declares where it starts on a path the first time."""

    class Declared(Effector):
        contract = dataclasses.replace(Effector.contract, start=start)

    return Declared()


class Keeper(Effector):
    """An effector whose state needs the log from offset 3 on once it folded anything."""

    def retain_from(self, state: Sums) -> int | None:
        return 3 if state.items else None


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

    # A processor that never ran here must say where it starts: undeclared, the host refuses.
    refused = ProcessorHost(config, processors=[Effector()], serve_control=False, owner="late")
    with pytest.raises(HistoryTruncated) as caught:
        await refused.start()
    assert (
        "processor 'effector' has never run on '/', which starts at offset 31: its events "
        "through 30 are archived in 4 segment file(s); declare where it starts: start = "
        '"beginning" (from offset 1, reading the archive), "start" (from offset 31) or "head"'
    ) in caught.value.message
    assert caught.value.message.endswith("nothing was started")
    host = ProcessorHost(
        config, processors=[starting("beginning")], serve_control=False, owner="late"
    )
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


def policy_config(target: Target, **policy: Any) -> HostConfig:
    return HostConfig.model_validate(
        {
            "db": target.target,
            "lease": {"ttl": 1.0, "heartbeat": 0.1},
            "shutdown_grace": 1.0,
            "retention_interval": 0.1,
            "retention": [{"path": "/", **policy}],
        }
    )


async def test_a_host_runs_its_policies_under_one_lease_and_another_takes_over_when_it_goes(
    target: Target, tmp_path: Path
) -> None:
    """One host at a time runs the policies; its runs show in status and /metrics; when it
    stops, the other host takes the lease and runs them from where the first left off."""
    archive = tmp_path / "archive"
    # Not the default share: these runs are about the lease, not about pacing, and
    # at 0.005 three chunks on a busy machine can take longer than the waits below.
    first = ProcessorHost(
        policy_config(target, keep_last=5, archive=str(archive), chunk=4, share=0.5),
        processors=[Effector()],
        serve_control=False,
        owner="first",
    )
    second = ProcessorHost(
        policy_config(target, keep_last=5, archive=str(archive), chunk=4, share=0.5),
        processors=[Effector()],
        serve_control=False,
        owner="second",
    )
    try:
        await first.start()
        await second.start()
        async with open_log(target.target) as log:
            appended = await log.stream("/").append(
                *({"type": "item", "payload": {"n": n}} for n in range(1, 21))
            )
        await first.wait_until_processed("effector", appended[-1].offset, timeout=30)

        async def one_run_done() -> bool:
            jobs = [(await host.status())["retention_job"] for host in (first, second)]
            return any(job["policies"][0]["events_taken"] >= 12 for job in jobs)

        await until(one_run_done)
        (row,) = (await first.status())["retention"]
        assert row["start"] > 12
        jobs = [(await host.status())["retention_job"] for host in (first, second)]
        holding = [job for job in jobs if job["holds_lease"]]
        assert len(holding) == 1, jobs
        (job,) = holding
        (record,) = job["policies"]
        assert record["events_taken"] >= 12
        assert record["failures"] == 0
        assert record["last_run"]["stopped_by"] in ("keep_last", "horizon")
        assert {j["holder"] for j in jobs} == {job["holder"]}
        holder_host = first if job["holder"] == "first" else second
        metrics = exposition(
            await holder_host.status(),
            follow_age=None,
            log_stats=holder_host.log.stats if holder_host.log else None,
            lag_seconds={},
            histograms={},
        ).decode()
        assert "streamkit_retention_lease_held 1.0" in metrics
        assert 'streamkit_retention_policy_runs_total{outcome="failed",path="/"} 0.0' in metrics
        assert 'streamkit_retention_policy_events_taken_total{mode="archive",path="/"}' in metrics

        holder = first if job["holder"] == "first" else second
        other = second if holder is first else first
        await holder.stop(grace=0.0)
        async with open_log(target.target) as log:
            more = await log.stream("/").append(
                *({"type": "item", "payload": {"n": n}} for n in range(21, 41))
            )
        await other.wait_until_processed("effector", more[-1].offset, timeout=30)

        async def other_ran() -> bool:
            (row,) = (await other.status())["retention"]
            job = (await other.status())["retention_job"]
            return bool(job["holds_lease"] and row["start"] > more[0].offset)

        await until(other_ran)
        code, said = await asyncio.to_thread(cli, "verify", "--archive", "--db", target.target)
        assert code == 0, said
    finally:
        await first.stop(grace=0.0)
        await second.stop(grace=0.0)


async def test_a_policy_that_fails_is_counted_shown_and_tried_again(
    target: Target, tmp_path: Path
) -> None:
    """An archive directory that cannot be written: each run fails, is counted with its error,
    and nothing is taken; once the directory can be made, the next run goes through."""
    blocker = tmp_path / "archive"
    blocker.write_text("a file where the archive directory should be")
    host = ProcessorHost(
        policy_config(target, keep_last=2, archive=str(blocker / "orders")),
        processors=[Effector()],
        serve_control=False,
        owner="alone",
    )
    try:
        await host.start()
        async with open_log(target.target) as log:
            appended = await log.stream("/").append(
                *({"type": "item", "payload": {"n": n}} for n in range(1, 11))
            )
        await host.wait_until_processed("effector", appended[-1].offset, timeout=30)

        async def failed_twice() -> bool:
            job = (await host.status())["retention_job"]
            return bool(job["policies"][0]["failures"] >= 2)

        await until(failed_twice)
        (record,) = (await host.status())["retention_job"]["policies"]
        assert record["last_error"]["code"] == "STORAGE_ERROR", record
        assert record["events_taken"] == 0
        (row,) = (await host.status())["retention"]
        assert row["start"] == 1
        await asyncio.to_thread(blocker.unlink)

        # The job records a run after the store has committed it, so the path's start can move
        # a moment before the record does: wait on the record, which is what is asserted.
        async def ran() -> bool:
            (record,) = (await host.status())["retention_job"]["policies"]
            return bool(record["events_taken"] > 0)

        await until(ran)
        (record,) = (await host.status())["retention_job"]["policies"]
        assert record["last_error"] is None
        (row,) = (await host.status())["retention"]
        assert row["start"] > 1
    finally:
        await host.stop(grace=0.0)


@pytest.mark.parametrize("start", ["start", "head"])
async def test_a_new_processor_declared_to_start_past_deleted_history_begins_there_on_record(
    target: Target, start: StartFrom
) -> None:
    """On a path whose oldest events were deleted: "beginning" is refused (the state cannot be
    built), "start" folds from the path's start and "head" from the newest event; the first
    checkpoint comes with a streamkit.processor-began record, shown in status; a restart
    resumes from the checkpoint, with no second record."""
    config = HostConfig.model_validate(
        {"db": target.target, "lease": {"ttl": 1.0, "heartbeat": 0.1}, "shutdown_grace": 1.0}
    )
    db = target.target
    async with open_log(db) as log:
        await log.stream("/").append(*({"type": "item", "payload": {"n": n}} for n in range(1, 21)))
    code, said = await asyncio.to_thread(
        cli, "retention", "run", "/", "--delete", "--through", "10", "--db", db
    )
    assert code == 0, said
    with pytest.raises(
        HistoryTruncated,
        match="declares start = \"beginning\" on '/', but its events through 10 were deleted",
    ):
        await ProcessorHost(config, processors=[starting("beginning")], serve_control=False).start()

    host = ProcessorHost(config, processors=[starting(start)], serve_control=False, owner="new")
    try:
        await host.start()

        async def began_here() -> bool:
            (row,) = (await host.status())["processors"]
            return row["began"] is not None

        await until(began_here)
        async with open_log(db) as log:
            (last,) = await log.stream("/").append({"type": "item", "payload": {"n": 100}})
        await host.wait_until_processed("effector", last.offset, timeout=30)
        snapshot = await host.snapshot("effector")
        # "start" folds 11..20 and the new item; "head" only the new item.
        expected = sum(range(11, 21)) + 100 if start == "start" else 100
        assert snapshot["state"]["total"] == expected
        (row,) = (await host.status())["processors"]
        began = row["began"]
        assert (began["slug"], began["version"], began["start"]) == ("effector", "1", start)
        # The head was 21 (20 items, then the deletion's record): "head" starts after it.
        assert began["from"] == (11 if start == "start" else 22)
        assert began["skipped"] == began["from"] - 1
    finally:
        await host.stop(grace=0.0)
    async with open_log(db) as log:
        page = await log.stream("/").read(10, 100)
    records = [e for e in page.events if e.type == BEGAN_EVENT]
    assert [r.payload["from"] for r in records] == [began["from"]]

    again = ProcessorHost(config, processors=[starting(start)], serve_control=False, owner="again")
    try:
        await again.start()
        async with open_log(db) as log:
            (more,) = await log.stream("/").append({"type": "item", "payload": {"n": 1000}})
        await again.wait_until_processed("effector", more.offset, timeout=30)
        assert (await again.snapshot("effector"))["state"]["total"] == expected + 1000
        (row,) = (await again.status())["processors"]
        assert row["began"] is None
    finally:
        await again.stop(grace=0.0)
    async with open_log(db) as log:
        page = await log.stream("/").read(10, 100)
    assert len([e for e in page.events if e.type == BEGAN_EVENT]) == 1

"""The task-service demo (examples/task_service): its board, its handler, and the drill run short."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamkit.processors.tasks import TaskContext, task_requested_event
from streamkit.testing import memory_storage, memory_stream, settle
from support import ROOT
from support.backends import BACKENDS

from streamkit import ProcessorEngine

EXAMPLES = ROOT / "examples"
# The demo is not installed: import it from examples/, without leaving that
# directory (and its other modules) importable for the rest of the session.
sys.path.insert(0, str(EXAMPLES))
try:
    from task_service.accounting import Ledger, account
    from task_service.board import BoardState, TaskBoard
    from task_service.service import CreateTask, TaskFailed, read_effects, read_journal
finally:
    sys.path.remove(str(EXAMPLES))


def _ctx(task_id: str, attempt: int = 1, key: str | None = None) -> TaskContext:
    return TaskContext(
        task_id=task_id,
        name="create-task",
        attempt=attempt,
        max_attempts=3,
        idempotency_key=key or f"tasks/run/{task_id}@1",
        request_offset=1,
        replay=None,
    )


async def test_create_task_is_idempotent_per_run_key(tmp_path: Path) -> None:
    """A re-run of one attempt (same key) finds its effect and stores nothing twice."""
    handler = CreateTask(tmp_path, delay=0)
    args = {"title": "Water the plants", "category": "home"}
    first = await handler(args, _ctx("t1"))
    again = await handler(args, _ctx("t1", attempt=2))
    assert (
        first
        == again
        == {
            "created": True,
            "task_id": "t1",
            "title": "Water the plants",
            "category": "home",
        }
    )
    assert [e.task_id for e in read_effects(tmp_path)] == ["t1"]
    assert [j["outcome"] for j in read_journal(tmp_path)] == ["applied", "existing"]


async def test_create_task_fails_for_its_failing_inputs(tmp_path: Path) -> None:
    """No title always fails; a locked category fails until unlocked; flaky fails attempt 1 only."""
    handler = CreateTask(tmp_path, delay=0)
    with pytest.raises(TaskFailed, match="needs a title"):
        await handler({"title": " ", "category": "home"}, _ctx("t1", attempt=3))
    (tmp_path / "locks" / "archive").touch()
    with pytest.raises(TaskFailed, match='"archive" is locked'):
        await handler({"title": "Old", "category": "archive"}, _ctx("t2"))
    (tmp_path / "locks" / "archive").unlink()
    assert (await handler({"title": "Old", "category": "archive"}, _ctx("t2")))["created"]
    with pytest.raises(TaskFailed, match="busy"):
        await handler({"title": "F", "category": "work", "flaky": True}, _ctx("t3"))
    assert (await handler({"title": "F", "category": "work", "flaky": True}, _ctx("t3", 2)))[
        "created"
    ]
    assert sorted(e.task_id for e in read_effects(tmp_path)) == ["t2", "t3"]


def _succeeded(task_id: str, category: str, request_offset: int = 1) -> dict[str, Any]:
    result = {
        "created": True,
        "task_id": task_id,
        "title": f"title {task_id}",
        "category": category,
    }
    return {
        "type": "task.succeeded",
        "payload": {
            "task_id": task_id,
            "request_offset": request_offset,
            "attempt": 1,
            "result": result,
        },
    }


async def test_board_records_each_created_task_once() -> None:
    """A success is put on the board with one keyed event, however often the effect runs."""
    stream = memory_stream()
    storage = memory_storage()
    engine = ProcessorEngine(TaskBoard(), stream=stream, storage=storage)
    stream.engines.append(engine)
    try:
        request = task_requested_event(
            task_id="a", name="create-task", args={"title": "title a", "category": "work"}
        )
        await stream.append(request)
        await settle()
        assert (await engine.snapshot()).state.queued["a"].category == "work"
        await stream.append(_succeeded("a", "work"))
        # The same success once more (a replay of the log, or a second writer):
        # the board's append returns the event already written.
        await stream.append(_succeeded("a", "work"))
        await settle()
        await engine.wait_until_processed(stream.head)
        created = [e.payload for e in stream.events if e.type == "board.task-created"]
        assert created == [{"task_id": "a", "title": "title a", "category": "work"}]
        state: BoardState = (await engine.snapshot()).state
        assert state.queued == {}
        assert (state.created, state.categories["work"].done) == (1, 1)
    finally:
        await engine.aclose()
        storage.close()


async def test_board_puts_a_batchs_successes_on_the_board_in_one_append() -> None:
    """Successes are owed, then appended together by the at-head pass: one commit, not one each."""
    stream = memory_stream()
    storage = memory_storage()
    engine = ProcessorEngine(TaskBoard(), stream=stream, storage=storage)
    stream.engines.append(engine)
    try:
        ids = [f"t{n}" for n in range(5)]
        await stream.append(
            *(
                task_requested_event(
                    task_id=i, name="create-task", args={"title": i, "category": "work"}
                )
                for i in ids
            )
        )
        (*_, last) = await stream.append(*(_succeeded(i, "work") for i in ids))
        await settle()
        await engine.wait_until_processed(stream.head)
        created = [e for e in stream.events if e.type == "board.task-created"]
        assert [e.payload["task_id"] for e in created] == ids
        # One call, made by the at-head pass of the batch's last event.
        stamps = {e.source["processor"]["while_processing"]["offset"] for e in created}
        assert stamps == {last.offset}
        assert [e.offset for e in created] == list(range(created[0].offset, created[0].offset + 5))
        state: BoardState = (await engine.snapshot()).state
        assert (state.owed, state.created) == ({}, 5)
    finally:
        await engine.aclose()
        storage.close()


async def test_board_counts_dead_letters_per_category() -> None:
    """A dead-lettered task leaves the queue and counts against its category."""
    stream = memory_stream()
    storage = memory_storage()
    engine = ProcessorEngine(TaskBoard(), stream=stream, storage=storage)
    stream.engines.append(engine)
    try:
        (requested,) = await stream.append(
            task_requested_event(
                task_id="b", name="create-task", args={"title": "x", "category": "archive"}
            )
        )
        await stream.append(
            {
                "type": "task.dead-lettered",
                "payload": {
                    "task_id": "b",
                    "request_offset": requested.offset,
                    "attempts": 3,
                    "error": "locked",
                },
            }
        )
        await settle()
        state: BoardState = (await engine.snapshot()).state
        assert state.queued == {}
        assert (state.dead_lettered, state.categories["archive"].dead_lettered) == (1, 1)
    finally:
        await engine.aclose()
        storage.close()


def _run_events(task_id: str, request_offset: int) -> list[dict[str, Any]]:
    """A run that succeeded and got on the board."""
    return [
        _succeeded(task_id, "work", request_offset),
        {
            "type": "board.task-created",
            "payload": {"task_id": task_id, "title": "t", "category": "work"},
        },
    ]


async def test_accounting_balances_a_clean_run_and_catches_duplicates_and_losses() -> None:
    """The books count a clean task once, and flag a doubled success and an unsettled task."""
    stream = memory_stream()
    (a,) = await stream.append(task_requested_event(task_id="a", name="create-task"))
    _, created_a = await stream.append(*_run_events("a", a.offset))
    (b,) = await stream.append(task_requested_event(task_id="b", name="create-task"))
    _, created_b = await stream.append(*_run_events("b", b.offset))
    await stream.append(_succeeded("b", "work", b.offset))  # b succeeds twice
    await stream.append(task_requested_event(task_id="c", name="create-task"))  # c never settles
    for created in (created_a, created_b):
        notified = f"task-created@{created.offset}"
        payload = {"notification_id": notified, "source_offset": created.offset}
        await stream.append({"type": "notification.sent", "payload": payload})
    ledger = Ledger()
    ledger.fold(stream.events)
    producers = {t: {"kind": "ok"} for t in ("a", "b", "c", "d")}  # d never reached the log
    report = account(
        ledger,
        producers=producers,
        effects=[{"task_id": "a"}, {"task_id": "b"}],
        journal=[],
        outbox=[
            {"id": f"task-created@{created_a.offset}", "source_offset": created_a.offset},
            {"id": f"task-created@{created_a.offset}", "source_offset": created_a.offset},
            {"id": f"task-created@{created_b.offset}", "source_offset": created_b.offset},
        ],
        producer_resends=0,
    )
    assert (report.requested, report.succeeded) == (4, 2)
    assert report.duplicate_kinds["succeeded twice"] == 1
    assert report.duplicates == 1
    assert report.lost_kinds["never settled"] == 2  # c and d
    assert report.lost_kinds["not in the log"] == 1  # d
    assert report.lost == 2
    assert report.outbox_resent_lines == 1  # the same id twice is a re-send, not a duplicate
    assert not report.ok
    assert ledger.outstanding(producers, after_replay=False) == [
        "1 requested task(s) not in the log, e.g. d",
        "1 task(s) still running or waiting for a retry",
    ]


@pytest.fixture(params=sorted(BACKENDS))
def drill_db(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """The drill's ``--db``: none (its SQLite file) or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield []
        return
    target = BACKENDS[request.param].fresh()
    try:
        yield ["--db", target.target]
    finally:
        target.remove()


@pytest.mark.slow
def test_drill_run_short_loses_and_duplicates_nothing(tmp_path: Path, drill_db: list[str]) -> None:
    """The drill (5 s, 3 producers, one kill -9, a DLQ replay) exits 0 with 0 duplicates, 0 lost,
    on each backend."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), *filter(None, [env.get("PYTHONPATH")])])
    report_file = tmp_path / "report.json"
    argv = [sys.executable, "-m", "task_service.drill", "--seconds", "5", "--rate", "10"]
    argv += ["--dir", str(tmp_path / "run"), "--report-json", str(report_file)]
    # Generous: a healthy run takes about 20 s; a loaded machine may need far longer, and
    # every wait of the drill names what it waited for when it gives up.
    argv += ["--settle-timeout", "120", *drill_db]
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=480, check=False, cwd=tmp_path
        )
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"the drill ran past 480 s; its output so far:\n{partial[-4000:]}")
    said = f"\n--- the drill said:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert done.returncode == 0, said
    report = json.loads(report_file.read_text())
    checks = {
        "no duplicates, nothing lost": (report["duplicates"], report["lost"], report["ok"])
        == (0, 0, True),
        # The kill happened, mid-run, and a second host finished the job.
        "a second host after the kill": report["hosts_started"] == 2,
        "the kill within the run": 0 < report["kill"]["at"] < 5,
        # Every kind of outcome happened (each producer opens with one of each), and
        # they add up.
        "requests": report["requested"] > 0,
        "every request settled": report["requested"] == report["succeeded"] + report["abandoned"],
        "dead letters": report["dead_lettered"] > 0,
        "each dead letter replayed": report["replayed"] == report["dead_lettered"],
        "successes after the replay": report["succeeded_after_replay"] > 0,
        "abandoned tasks": report["abandoned"] > 0,
        "nothing unexpected": report["unexpected"] == {},
        "the replay report": len(report["replay_report"]["report"]["replayed"])
        == report["replayed"],
        # A client watching the board live across the kill ends with the board's state.
        "the watcher's board": report["watcher"]["matches_snapshot"] is True,
        "the board's count": report["board"]["created"] == report["succeeded"],
        "the result line": "RESULT: OK (duplicates 0, lost 0)" in done.stdout,
        "the kill line": "SIGKILL to host 1" in done.stdout,
    }
    failed = [name for name, held in checks.items() if not held]
    assert not failed, f"{failed} did not hold; report: {json.dumps(report)[:3000]}{said}"

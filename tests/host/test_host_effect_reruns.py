"""What a stop, a hand-off and a crash make a processor with effects run again, measured.

A daemon answers a backlog of questions, one unkeyed ``answer`` appended per
question (so an effect run twice leaves two answers). It is stopped mid
backlog (SIGTERM: the page in flight needs longer than the stop's 5 s for
a batch) or killed (SIGKILL), then started again; the answers are counted
per question.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT
from support.daemon import DaemonRig

from streamkit import open_log
from streamkit.engine._batch import EFFECTS_PER_CHECKPOINT

pytestmark = pytest.mark.slow


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[DaemonRig]:
    shutil.copy(ROOT / "tests" / "support" / "host.py", tmp_path / "hostprocs.py")
    made = DaemonRig(tmp_path, socket_prefix="skr", tmp_on_pythonpath=True)
    try:
        yield made
    finally:
        made.close()


async def answers(db: Path) -> collections.Counter[int]:
    counted: collections.Counter[int] = collections.Counter()
    async with open_log(db, read_only=True) as log:
        after = 0
        while True:
            page = await log.stream("/").read(after, 5000)
            counted.update(e.payload["question"] for e in page.events if e.type == "answer")
            if page.at_head or page.scanned_through_offset <= after:
                return counted
            after = page.scanned_through_offset


async def interrupted_then_restarted(
    rig: DaemonRig, db: Path, sig: signal.Signals, *, questions: int, delay: float, after: int
) -> dict[str, int]:
    """``questions`` answered with ``delay`` s of I/O each; ``sig`` once ``after`` are answered."""
    question = {"type": "question", "payload": {"delay": delay}}
    async with open_log(db) as log:
        for _ in range(0, questions, 500):
            await log.stream("/").append(*(question for _ in range(500)))
    argv = ["--db", str(db), "--processor", "hostprocs:Answerer"]
    first = rig.start_host("a", *argv)
    deadline = time.monotonic() + 60
    while sum((await answers(db)).values()) < after:  # into the backlog
        assert time.monotonic() < deadline, rig.host_log("a")
        await asyncio.sleep(0.02)
    first.send_signal(sig)
    first.wait(60)
    before = sum((await answers(db)).values())
    rig.start_host("b", *argv)
    deadline = time.monotonic() + 120
    while len(counted := await answers(db)) < questions:
        assert time.monotonic() < deadline, rig.host_log("b")
        await asyncio.sleep(0.05)
    twice = sum(1 for n in counted.values() if n > 1)
    return {"answered_before": before, "answered_twice": twice}


async def test_a_stop_mid_backlog_re_runs_no_effect(rig: DaemonRig, tmp_path: Path) -> None:
    """SIGTERM in the middle of a catch-up page: the restart answers no question twice."""
    seen = await interrupted_then_restarted(
        rig, tmp_path / "s.db", signal.SIGTERM, questions=1000, delay=0.02, after=100
    )
    assert 100 <= seen["answered_before"] < 500  # it stopped inside the first page
    assert seen["answered_twice"] == 0, seen


async def test_a_crash_mid_backlog_re_runs_at_most_one_checkpoint_s_worth(
    rig: DaemonRig, tmp_path: Path
) -> None:
    """SIGKILL mid backlog: at most EFFECTS_PER_CHECKPOINT questions are answered twice."""
    seen = await interrupted_then_restarted(
        rig, tmp_path / "k.db", signal.SIGKILL, questions=3000, delay=0.001, after=300
    )
    assert seen["answered_twice"] <= EFFECTS_PER_CHECKPOINT, seen

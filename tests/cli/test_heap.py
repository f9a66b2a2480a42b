"""The daemon freezes its start-up heap out of the collector's full passes, unless told plain.

Each side in a process of its own: a freeze is for the life of the process,
and the switch is read once, at import.
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import gc
from streamkit.cli._heap import freeze_start_up_heap
before = gc.get_freeze_count()
frozen = freeze_start_up_heap()
print(before, frozen, gc.get_freeze_count())
"""


def _run(plain: str) -> list[int]:
    env = dict(os.environ, STREAMKIT_PLAIN=plain)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    return [int(part) for part in done.stdout.split()]


def test_the_start_up_heap_is_frozen_with_the_speed_tricks_on() -> None:
    before, frozen, after = _run("")
    # streamkit, pydantic and structlog are imported: thousands of objects live for good.
    assert before == 0
    assert frozen == after
    assert frozen > 10_000


def test_under_the_plain_switch_nothing_is_frozen() -> None:
    assert _run("1") == [0, 0, 0]

"""A version re-reduce says how far it came: in ``statistics()`` while it runs, and in the log.

A processor restarted under a new contract version re-reduces the log up to
its old cursor before it serves. While it does, its cursor is the old one,
so without this it would look caught up. The re-reduce is held after its
first page here (its second read waits on a gate) to look at it mid-way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
from streamkit.testing import settle
from support.engine import Recorder, Rig, Tally, item, recorder_contract

from streamkit import StreamEvent
from streamkit.engine import _pages, _rebuild
from streamkit.engine._pages import PAGE_SIZE
from streamkit.engine._turns import FIRST_READ


class Doubler(Recorder):
    """Version 2 of the recorder: every item counts double."""

    contract = recorder_contract(version="2")

    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        return Tally(
            total=state.total + 2 * event.payload.n, offsets=[*state.offsets, event.offset]
        )


async def test_a_re_reduce_shows_its_progress_and_logs_start_progress_and_end(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = rig.engine(Recorder())
    items = PAGE_SIZE * 2 + 100
    await rig.stream.append(*(item(1) for _ in range(items)))
    await settle()
    total = rig.checkpoint().reduced_through_offset  # the old cursor: what is re-reduced
    assert total >= items

    gate = asyncio.Event()
    reached_second_page = asyncio.Event()
    read = _pages.PageReader.read

    async def held(self: Any, after: int, limit: int) -> Any:
        if after > 0 and not gate.is_set():
            reached_second_page.set()
            await gate.wait()
        return await read(self, after, limit)

    monkeypatch.setattr(_pages.PageReader, "read", held)
    monkeypatch.setattr(_rebuild, "PROGRESS_EVERY", 0.0)
    with structlog.testing.capture_logs() as logs:
        second = rig.restart(first, Doubler())
        snapshot = asyncio.ensure_future(second.snapshot())
        await asyncio.wait_for(reached_second_page.wait(), 5)
        rebuild = second.statistics().rebuild
        assert rebuild is not None
        assert (rebuild["version"], rebuild["through"], rebuild["target"]) == (
            "2",
            FIRST_READ,  # a rebuild's first read; the next are sized by how long it took
            total,
        )
        assert 0 < rebuild["events"] <= FIRST_READ
        assert rebuild["events_per_second"] > 0
        assert rebuild["eta_seconds"] is not None
        gate.set()
        assert (await snapshot).state.total == 2 * items
    assert second.statistics().rebuild is None
    events = [entry for entry in logs if entry["event"].startswith("processor.rebuild.")]
    assert events[0]["event"] == "processor.rebuild.started"
    assert (events[0]["slug"], events[0]["target"]) == ("recorder", total)
    progress = [entry["through"] for entry in events if entry["event"].endswith("progress")]
    assert progress == sorted(progress)
    assert progress[-1] == total
    assert events[-1]["event"] == "processor.rebuild.done"
    assert events[-1]["through"] == total
    assert events[-1]["events"] >= items


async def test_an_engine_of_the_same_version_does_not_rebuild(rig: Rig) -> None:
    first = rig.engine(Recorder())
    await rig.stream.append(item(1), item(2))
    await settle()
    with structlog.testing.capture_logs() as logs:
        again = rig.restart(first, Recorder())
        await again.snapshot()
    assert not [entry for entry in logs if entry["event"].startswith("processor.rebuild.")]
    assert again.statistics().rebuild is None

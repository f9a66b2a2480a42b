"""The read verbs: snapshot, live_snapshot, wait_until_processed, and when they read the log."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from streamkit.testing import settle
from support.engine import Recorder, Rig, item, ping

from streamkit import ProcessorTimeout, ReadPage, ScannedRange, StorageError


async def test_snapshot_skips_the_log_once_the_pushed_head_is_reduced(rig: Rig) -> None:
    """After a push reached the head, snapshot answers from memory without reading."""
    engine = rig.engine(Recorder())
    await rig.stream.append(item(1), item(2))
    await settle()
    reads = rig.stream.reads
    for _ in range(3):
        snapshot = await engine.snapshot()
    assert (snapshot.offset >= 2, snapshot.state.total) == (True, 3)
    assert rig.stream.reads == reads


async def test_snapshot_reads_when_a_push_is_not_yet_reduced(rig: Rig) -> None:
    """A snapshot right after an append (push shown, not yet run) catches up and sees it."""
    engine = rig.engine(Recorder())
    await engine.snapshot()
    await rig.stream.append(item(5))
    snapshot = await engine.snapshot()
    assert snapshot.state.total == 5


async def test_an_unpushed_engine_reads_on_every_snapshot(rig: Rig) -> None:
    """An engine nothing pushes learns of new events only by reading, so it reads every time."""
    engine = rig.engine(Recorder(), pushed=False)
    await rig.stream.append(item(1))
    assert (await engine.snapshot()).state.total == 1
    reads = rig.stream.reads
    await engine.snapshot()
    assert rig.stream.reads == reads + 1
    await rig.stream.append(item(2))
    assert (await engine.snapshot()).state.total == 3


async def test_fed_by_pushes_trusts_the_head_a_catch_up_reached(rig: Rig) -> None:
    """With fed_by_pushes, one catch-up is enough: later snapshots do not read until a push."""
    rig.stream.drop_pushes = True
    await rig.stream.append(item(1))
    rig.stream.drop_pushes = False
    engine = rig.engine(Recorder(), fed_by_pushes=True)
    assert (await engine.snapshot()).state.total == 1
    reads = rig.stream.reads
    await engine.snapshot()
    await engine.live_snapshot()
    assert rig.stream.reads == reads
    await rig.stream.append(item(2))
    assert (await engine.snapshot()).state.total == 3


async def test_wait_until_processed_returns_when_the_cursor_gets_there(rig: Rig) -> None:
    """A waiter for an offset returns once a push moved the cursor to it."""
    engine = rig.engine(Recorder())
    await engine.snapshot()
    waiting = asyncio.ensure_future(engine.wait_until_processed(2))
    await settle(0)
    assert not waiting.done()
    await rig.stream.append(item(1), item(2))
    await asyncio.wait_for(waiting, 1)
    assert engine.cursor >= 2
    assert engine.statistics().pending_waiters == 0


async def test_wait_until_processed_catches_up_an_unpushed_engine(rig: Rig) -> None:
    """The wait starts a catch-up, so an engine nothing pushes still gets there."""
    engine = rig.engine(Recorder(), pushed=False)
    await rig.stream.append(item(1), item(2), item(3))
    await engine.wait_until_processed(3, timeout=1)
    assert engine.cursor == 3


async def test_an_ephemeral_offset_is_reached_only_by_its_push(rig: Rig) -> None:
    """Waiting for an ephemeral's offset resolves when the push that carried it is processed."""
    engine = rig.engine(Recorder())
    (event,) = await rig.stream.append(ping())
    await engine.wait_until_processed(event.offset, timeout=1)
    assert engine.cursor >= event.offset


async def test_a_timed_out_waiter_leaves_the_list(rig: Rig) -> None:
    """A timeout raises ProcessorTimeout and the waiter is gone from the engine's list."""
    engine = rig.engine(Recorder())
    with pytest.raises(ProcessorTimeout) as caught:
        await engine.wait_until_processed(99, timeout=0.01)
    assert caught.value.code == "PROCESSOR_TIMEOUT"
    assert "99" in str(caught.value)
    assert engine.statistics().pending_waiters == 0


async def test_a_cancelled_waiter_leaves_the_list(rig: Rig) -> None:
    """Cancelling a wait removes its waiter too."""
    engine = rig.engine(Recorder())
    waiting = asyncio.ensure_future(engine.wait_until_processed(50))
    await settle(0.005)
    assert engine.statistics().pending_waiters == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert engine.statistics().pending_waiters == 0


async def test_a_failing_catch_up_rejects_the_waiter_with_the_real_error(rig: Rig) -> None:
    """When the read under the wait's catch-up fails, the wait raises that error at once."""

    async def broken_read(after_offset: int = 0, limit: int = 500, **_: Any) -> ReadPage:
        raise StorageError("disk on fire; nothing was read")

    engine = rig.engine(Recorder())
    rig.stream.read = broken_read  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="disk on fire"):
        await engine.wait_until_processed(1, timeout=5)
    assert engine.statistics().pending_waiters == 0


async def test_live_snapshot_returns_rev_and_projection_together(rig: Rig) -> None:
    """live_snapshot is a named (rev, state) pair caught up like snapshot."""
    engine = rig.engine(Recorder(), pushed=False)
    await rig.stream.append(item(4))
    live = await engine.live_snapshot()
    assert live.rev > 0
    assert live.state.total == 4


async def test_a_batch_awaited_directly_reports_its_outcome(rig: Rig) -> None:
    """Awaiting process_event_batch gives its result; a queued batch runs after the running one."""
    engine = rig.engine(Recorder(), pushed=False)
    await rig.stream.append(item(1))
    events = list(rig.stream.events)
    first = engine.catch_up_from_log()
    second = engine.process_event_batch(events, ScannedRange(0, 1))
    await asyncio.gather(first, second)
    assert (await engine.snapshot()).state.total == 1

"""The engine's five rules, delivery by pushes with a scanned-range proof, and gap repair."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
from streamkit.testing import settle
from support.engine import Recorder, Rig, SkippingRecorder, item, note, ping

from streamkit import ProcessorEngine, ScannedRange, StreamEvent
from streamkit.engine import MAX_CATCH_UP_PAGE, PAGE_SIZE
from streamkit.engine._batch import EFFECTS_PER_CHECKPOINT
from streamkit.processor import ProcessEventArgs


def _event(
    offset: int, etype: str = "item.added", ephemeral: bool = False, n: int = 1
) -> StreamEvent:
    return StreamEvent(
        path="/", offset=offset, type=etype, payload={"n": n, "text": "t"}, ephemeral=ephemeral
    )


# -- rule 1: one serial chain -------------------------------------------------------------


async def test_batches_never_interleave(rig: Rig) -> None:
    """A second push waits until the first batch, blocked on its work, has committed."""
    gate = asyncio.Event()
    trace: list[str] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is None:
            return
        trace.append(f"start {args.event.offset}")
        if args.event.offset == 1:

            async def hold() -> None:
                await gate.wait()
                trace.append("released 1")

            args.block_processor_while(hold)

    engine = rig.engine(Recorder(on_event), pushed=False)
    first = engine.process_event_batch([_event(1)], ScannedRange(0, 1))
    second = engine.process_event_batch([_event(2)], ScannedRange(1, 2))
    await settle(0.01)
    assert trace == ["start 1"]
    gate.set()
    await asyncio.gather(first, second)
    assert trace == ["start 1", "released 1", "start 2"]


# -- rule 2: one event at a time, blockers to a fixed point --------------------------------


async def test_nested_blockers_drain_before_the_next_event(rig: Rig) -> None:
    """Blockers registered by blockers finish, in FIFO order, before the next event starts."""
    trace: list[str] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is None:
            return
        offset = args.event.offset
        trace.append(f"event {offset}")
        if offset != 1:
            return

        async def inner() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            trace.append("inner")

        async def outer() -> None:
            await asyncio.sleep(0)
            trace.append("outer")
            args.block_processor_while(inner)

        async def second() -> None:
            trace.append("second")

        args.block_processor_while(outer)
        args.block_processor_while(second)

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(1), item(2))
    await settle()
    assert trace == ["event 1", "outer", "second", "inner", "event 2"]


async def test_a_blocker_returning_a_plain_value_is_accepted(rig: Rig) -> None:
    """A blocker function that returns a non-awaitable counts as done at once."""
    ran: list[int] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        args.block_processor_while(lambda: ran.append(1))  # type: ignore[arg-type,return-value]

    engine = rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    assert ran == [1]
    assert rig.checkpoint().reduced_through_offset == 1
    assert engine.statistics().batches == 1


# -- rule 4: one durable commit per batch ---------------------------------------------------


async def test_one_checkpoint_write_per_batch(rig: Rig) -> None:
    """A push of three durable events writes one checkpoint row, once."""
    engine = rig.engine(Recorder())
    await rig.stream.append(item(1), item(2), item(3))
    await settle()
    assert rig.storage.writes == 1
    checkpoint = rig.checkpoint()
    assert (checkpoint.reducer_version, checkpoint.reduced_through_offset) == ("1", 3)
    assert '"total":6' in checkpoint.state_json
    assert engine.cursor >= 3  # later offsets went to the live-state delta


async def test_an_ephemeral_flood_writes_nothing(rig: Rig) -> None:
    """A hundred consumed ephemeral events are all delivered and cost zero checkpoint writes."""
    processor = Recorder()
    engine = rig.engine(processor)
    for i in range(100):
        await rig.stream.append(ping(str(i)))
    await settle()
    assert rig.storage.writes == 0
    assert len([c for c in processor.calls if c[0] is not None]) == 100
    assert engine.cursor == 100


async def test_a_stale_re_push_writes_nothing_and_redelivers_nothing(rig: Rig) -> None:
    """The same push twice: the second reduces nothing, delivers nothing durable, writes nothing."""
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    events = [_event(1), _event(2)]
    await engine.process_event_batch(events, ScannedRange(0, 2))
    writes = rig.storage.writes
    calls = list(processor.calls)
    await engine.process_event_batch(events, ScannedRange(0, 2))
    assert rig.storage.writes == writes
    assert processor.delivered == [o for o, _ in calls if o is not None]
    assert (await engine.snapshot()).state.total == 2


async def test_a_batch_of_unconsumed_durables_moves_the_cursor_but_not_the_state(rig: Rig) -> None:
    """Durable events the processor ignores are checkpointed as a cursor move; state stays."""
    rig.engine(Recorder())
    await rig.stream.append(item(5))
    await settle()
    notes = await rig.stream.append(note(), note())
    await settle()
    checkpoint = rig.checkpoint()
    assert checkpoint.reduced_through_offset == notes[-1].offset
    assert '"total":5' in checkpoint.state_json
    assert rig.storage.writes == 2


async def test_the_state_column_is_rewritten_only_when_the_state_changed(rig: Rig) -> None:
    """A batch that leaves the state as it was saves the cursor with state_json=None."""
    saved: list[tuple[int, str | None]] = []

    class Spying:
        async def load(self, slug: str) -> Any:
            return await rig.storage.load(slug)

        async def save(self, slug: str, **kwargs: Any) -> None:
            saved.append((kwargs["reduced_through_offset"], kwargs["state_json"]))
            await rig.storage.save(slug, **kwargs)

    engine = ProcessorEngine(Recorder(), stream=rig.stream, storage=Spying())
    await engine.process_event_batch([_event(1, n=2)], ScannedRange(0, 1))
    await engine.process_event_batch([_event(2, "note.made")], ScannedRange(1, 2))
    assert saved[0][0] == 1
    assert saved[0][1] is not None
    assert saved[1] == (2, None)
    assert '"total":2' in rig.checkpoint().state_json
    await engine.aclose()


async def test_a_failed_batch_persists_nothing_and_is_retried_whole(rig: Rig) -> None:
    """An effect that raises fails the batch: no write, state and cursor as before, error raised."""
    failing = {"on": True}

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if failing["on"] and args.event is not None and args.event.offset == 2:
            raise RuntimeError("effect broke")

    processor = Recorder(on_event)
    engine = rig.engine(processor, pushed=False)
    events = [_event(1, n=1), _event(2, n=2), _event(3, n=3)]
    with pytest.raises(RuntimeError, match="effect broke"):
        await engine.process_event_batch(events, ScannedRange(0, 3))
    assert rig.storage.writes == 0
    assert engine.cursor == 0
    assert engine.statistics().batch_failures == 1
    assert isinstance(engine.statistics().last_error, RuntimeError)
    failing["on"] = False
    await engine.process_event_batch(events, ScannedRange(0, 3))
    assert rig.storage.writes == 1
    snapshot = await engine.snapshot()
    assert (snapshot.offset, snapshot.state.total) == (3, 6)
    # Retried whole: events 1 and 2 ran their effects twice, once per attempt.
    assert processor.delivered == [1, 2, 1, 2, 3]


async def test_a_raising_blocker_fails_the_batch(rig: Rig) -> None:
    """A blocker that raises fails its batch like an effect; nothing is written."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        async def boom() -> None:
            raise ValueError("blocked work failed")

        if args.event is not None:
            args.block_processor_while(boom)

    engine = rig.engine(Recorder(on_event), pushed=False)
    with pytest.raises(ValueError, match="blocked work failed"):
        await engine.process_event_batch([_event(1)], ScannedRange(0, 1))
    assert rig.storage.writes == 0
    assert engine.cursor == 0


async def test_a_checkpoint_is_restored_by_the_next_engine(rig: Rig) -> None:
    """A new engine over the same storage resumes at the checkpoint and redelivers nothing old."""
    first = rig.engine(Recorder())
    await rig.stream.append(item(1), item(2))
    await settle()
    processor = Recorder()
    second = rig.restart(first, processor)
    await second.catch_up_from_log()
    assert processor.calls == []
    (fourth,) = await rig.stream.append(item(4))
    await settle()
    assert processor.delivered == [fourth.offset]
    assert (await second.snapshot()).state.total == 7


# -- rule 5: the at-head pass ----------------------------------------------------------------


async def test_the_last_consumable_event_at_head_is_caught_up(rig: Rig) -> None:
    """Only the last consumable event of a batch that reaches the head is delivered caught up."""
    processor = Recorder()
    rig.engine(processor)
    await rig.stream.append(item(1), item(2), item(3))
    await settle()
    assert processor.calls == [(1, False), (2, False), (3, True)]


async def test_the_last_consumable_is_caught_up_even_if_a_filtered_event_follows(
    rig: Rig,
) -> None:
    """Caught-up goes to the last CONSUMABLE event; a trailing filtered event changes nothing."""
    processor = Recorder()
    rig.engine(processor)
    await rig.stream.append(item(1), note())
    await settle()
    assert processor.calls == [(1, True)]


async def test_an_eventless_pass_when_every_event_is_filtered(rig: Rig) -> None:
    """A batch at head with no consumable event gets one eventless caught-up pass."""
    processor = Recorder()
    rig.engine(processor)
    await rig.stream.append(note(), note())
    await settle()
    assert processor.calls == [(None, True)]


async def test_an_eventless_pass_when_the_last_event_is_malformed(rig: Rig) -> None:
    """With skip chosen, a malformed last event is skipped for reduce and effects; the eventless pass follows."""
    processor = SkippingRecorder()
    engine = rig.engine(processor)
    await rig.stream.append(item(1), {"type": "item.added", "payload": {"n": "not a number"}})
    await settle()
    assert processor.calls == [(1, False), (None, True)]
    assert (await engine.snapshot()).state.total == 1


async def test_a_push_behind_the_shown_head_is_not_caught_up(rig: Rig) -> None:
    """A push older than the head already shown delivers without the caught-up flag."""
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    late = engine.process_event_batch([_event(1)], ScannedRange(0, 1))
    latest = engine.process_event_batch([_event(2)], ScannedRange(1, 2))
    await asyncio.gather(late, latest)
    assert processor.calls == [(1, False), (2, True)]


async def test_catch_up_delivers_caught_up_on_the_last_page_only(rig: Rig) -> None:
    """Catch-up pages of 500, then 1,000; only the page reaching the head is caught up."""
    rig.stream.drop_pushes = True
    for _start in range(0, 1200, 400):
        await rig.stream.append(*(item(1) for _ in range(400)))
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    await engine.catch_up_from_log()
    caught = [offset for offset, caught_up in processor.calls if caught_up]
    assert caught == [1200]
    assert len(processor.calls) == 1200
    # A processor with effects checkpoints every EFFECTS_PER_CHECKPOINT (100) events
    # of a page and at its end: 5 in the page of 500, 7 in the 700 left.
    assert rig.storage.writes == 12
    assert engine.cursor == 1200


class _PlainReads:
    """The rig's stream, reading plain pages whatever ``types`` the engine asks for."""

    def __init__(self, stream: Any, pages: list[int]) -> None:
        self._stream = stream
        self.path = stream.path
        self.pages = pages

    async def append(self, *events: Any, **kwargs: Any) -> Any:
        return await self._stream.append(*events, **kwargs)

    async def read(self, after_offset: int = 0, limit: int = 500, **_: Any) -> Any:
        self.pages.append(limit)
        return await self._stream.read(after_offset, limit)

    async def claim(self, at: float | None) -> None:
        await self._stream.claim(at)


@pytest.mark.parametrize("typed", [True, False], ids=["typed", "plain"])
async def test_catch_up_pages_double_up_to_the_cap_while_a_backlog_lasts(
    rig: Rig, typed: bool
) -> None:
    """A backlog is read in pages of 500 up to 4,000, typed or plain."""
    rig.stream.drop_pushes = True
    for _start in range(0, 12_000, 500):
        await rig.stream.append(*(item(1) for _ in range(500)))
    read: list[int] = []
    if typed:
        real_read = rig.stream.read

        async def counted(after: int, limit: int = 500, **kwargs: Any) -> Any:
            read.append(limit)
            return await real_read(after, limit, **kwargs)

        rig.stream.read = counted  # type: ignore[method-assign]
        engine = rig.engine(Recorder(), pushed=False)
    else:
        engine = ProcessorEngine(
            Recorder(), stream=_PlainReads(rig.stream, read), storage=rig.storage
        )
        rig.built.append(engine)
    await engine.catch_up_from_log()
    assert read == [PAGE_SIZE, 1000, 2000, MAX_CATCH_UP_PAGE, MAX_CATCH_UP_PAGE, MAX_CATCH_UP_PAGE]
    # 500 + 1,000 + 2,000 + 4,000 + 4,000, then the last 500 reach the head; the
    # Recorder has effects, so each page checkpoints every 100 events.
    assert rig.storage.writes == 12_000 // EFFECTS_PER_CHECKPOINT
    assert engine.cursor == 12_000
    assert (await engine.snapshot()).state.total == 12_000


# -- delivery: the scanned-range proof, gap repair -------------------------------------------


async def test_gap_repair_reads_the_missed_prefix_then_processes_the_push(rig: Rig) -> None:
    """A push past the cursor first repairs from the log (never caught up), then runs itself."""
    processor = Recorder()
    engine = rig.engine(processor)
    rig.stream.drop_pushes = True
    await rig.stream.append(item(1), item(2))
    await rig.stream.append(item(3))
    rig.stream.drop_pushes = False
    reads = rig.stream.reads
    await rig.stream.append(item(4))
    await settle()
    assert processor.calls == [(1, False), (2, False), (3, False), (4, True)]
    assert rig.stream.reads > reads
    assert (await engine.snapshot()).state.offsets == [1, 2, 3, 4]


async def test_gap_repair_up_to_the_head_still_never_delivers_caught_up(rig: Rig) -> None:
    """When the repair reaches the log's head, the push (an ephemeral) still decides at-head."""
    processor = Recorder()
    rig.engine(processor)
    rig.stream.drop_pushes = True
    await rig.stream.append(item(1), item(2))
    rig.stream.drop_pushes = False
    await rig.stream.append(ping())
    await settle()
    assert processor.calls == [(1, False), (2, False), (3, True)]


async def test_a_caller_that_knows_more_says_whether_a_range_reached_the_head(rig: Rig) -> None:
    """``at_head=False`` holds the at-head pass back, ``True`` runs it; by default the last range does."""
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    await engine.process_event_batch([_event(1)], ScannedRange(0, 1), at_head=False)
    await engine.process_event_batch([_event(2)], ScannedRange(1, 2), at_head=True)
    await engine.process_event_batch([_event(3)], ScannedRange(2, 3))
    await engine.process_event_batch([_event(4), _event(5)], ScannedRange(3, 5), at_head=False)
    assert processor.calls == [(1, False), (2, True), (3, True), (4, False), (5, False)]


async def test_a_push_is_never_discarded_even_when_behind(rig: Rig) -> None:
    """A push wholly behind the cursor still delivers its ephemerals; its durables are skipped."""
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    await engine.process_event_batch([_event(1), _event(2)], ScannedRange(0, 2))
    processor.calls.clear()
    await engine.process_event_batch(
        [_event(1), _event(2, "ping", ephemeral=True)], ScannedRange(0, 2)
    )
    assert processor.delivered == [2]
    assert engine.cursor == 2


async def test_durables_are_delivered_at_most_once_and_in_order_within_a_batch(rig: Rig) -> None:
    """A push repeating or reordering durable events delivers each once, ascending."""
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    await engine.process_event_batch(
        [_event(1), _event(1), _event(3), _event(2), _event(4)], ScannedRange(0, 4)
    )
    assert processor.delivered == [1, 3, 4]
    assert engine.cursor == 4


async def test_events_outside_the_range_are_not_delivered(rig: Rig) -> None:
    """A durable event past the push's ``through`` is left for the push that proves it."""
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    await engine.process_event_batch([_event(1), _event(2)], ScannedRange(0, 1))
    assert processor.delivered == [1]
    assert engine.cursor == 1


async def test_the_cursor_never_regresses(rig: Rig) -> None:
    """An old push after a newer one leaves the cursor where the newer one put it."""
    engine = rig.engine(Recorder(), pushed=False)
    await engine.process_event_batch([_event(1), _event(2), _event(3)], ScannedRange(0, 3))
    await engine.process_event_batch([_event(1)], ScannedRange(0, 1))
    assert engine.cursor == 3
    assert rig.checkpoint().reduced_through_offset == 3


async def test_ephemerals_in_a_push_are_delivered_even_below_the_cursor(rig: Rig) -> None:
    """An ephemeral rides exactly one push, so it is delivered whatever the cursor says."""
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    await engine.process_event_batch([_event(5)], ScannedRange(0, 5))
    await engine.process_event_batch([_event(3, "ping", ephemeral=True)], ScannedRange(2, 3))
    assert processor.delivered == [5, 3]
    assert engine.cursor == 5


async def test_the_cursor_advances_by_the_range_not_by_counting(rig: Rig) -> None:
    """A push proving (0, 10] with one event in it moves the cursor to 10."""
    engine = rig.engine(Recorder(), pushed=False)
    await engine.process_event_batch([_event(10)], ScannedRange(0, 10))
    assert engine.cursor == 10


async def test_ignored_ephemerals_cause_no_pass(rig: Rig) -> None:
    """An ephemeral nobody consumes is a non-event: no at-head pass once none is owed."""
    processor = Recorder()
    rig.engine(processor)
    await rig.stream.append(item(1))
    await settle()
    processor.calls.clear()
    await rig.stream.append({"type": "cursor.moved", "ephemeral": True})
    await settle()
    assert processor.calls == []


async def test_a_bad_range_is_refused(rig: Rig) -> None:
    """A range with through below after is refused before anything runs."""
    engine = rig.engine(Recorder(), pushed=False)
    with pytest.raises(ValueError, match="scanned range"):
        engine.process_event_batch([], (3, 1))


async def test_process_event_batch_accepts_a_plain_tuple_range(rig: Rig) -> None:
    """The range may be a plain (after, through) tuple."""
    engine = rig.engine(Recorder(), pushed=False)
    await engine.process_event_batch([_event(1)], (0, 1))
    assert engine.cursor == 1


# -- the host's counters and hook ------------------------------------------------------------


async def test_counters_and_the_on_batch_hook(rig: Rig) -> None:
    """The engine counts reduced events and batches and calls on_batch after each commit."""
    infos: list[Any] = []
    engine = rig.engine(Recorder(), on_batch=infos.append)
    await rig.stream.append(item(1), item(2), note())
    await settle()
    assert (engine.slug, engine.version) == ("recorder", "1")
    stats = engine.statistics()
    assert (stats.events_reduced, stats.batches, stats.batch_failures) == (2, 1, 0)
    (info,) = infos
    assert info.range == ScannedRange(0, 3)
    assert (info.delivered, info.wrote_checkpoint, info.at_head) == (2, True, True)
    assert info.finished >= info.started


async def test_a_raising_on_batch_hook_is_reported_and_ignored(rig: Rig) -> None:
    """A failing on_batch hook costs nothing but a report."""

    def hook(info: Any) -> None:
        raise RuntimeError("hook broke")

    engine = rig.engine(Recorder(), on_batch=hook)
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1))
        await settle()
    assert rig.checkpoint().reduced_through_offset == 1
    assert engine.statistics().batches == 1
    assert [entry["event"] for entry in logs] == ["processor.on_batch_failed"]

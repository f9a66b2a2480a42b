"""streamkit.testing: reduce_processor, the memory stream's pump, memory storage, the fixtures."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from streamkit.testing import (
    ManualClock,
    MemoryStorage,
    MemoryStream,
    memory_storage,
    memory_stream,
    reduce_processor,
    settle,
)
from support import ROOT
from support.engine import Item, Recorder, SkippingRecorder, Tally, item, note, ping

from streamkit import (
    EventInput,
    InvalidEvent,
    PayloadMalformed,
    ProcessorEngine,
    ReduceCheckpointTable,
    ReduceFailed,
    ScannedRange,
    StreamEvent,
)
from streamkit.events import prepare_events, replayed_offsets

# -- reduce_processor -------------------------------------------------------------------


def test_reduce_processor_folds_from_the_initial_state() -> None:
    """Inputs fold in order from the initial state; offsets are input order from 1."""
    state = reduce_processor(Recorder(), [item(1), item(2), item(3)])
    assert state == Tally(total=6, offsets=[1, 2, 3])
    assert reduce_processor(Recorder(), []) == Tally()


def test_reduce_processor_stalls_at_a_malformed_payload_by_default() -> None:
    """By default a malformed payload raises PayloadMalformed, as the engine stalls there."""
    with pytest.raises(PayloadMalformed, match="stopped before offset 2"):
        reduce_processor(Recorder(), [item(1), {"type": "item.added", "payload": {"n": "x"}}])


def test_reduce_processor_stalls_at_a_raising_reduce_by_default() -> None:
    """By default a reduce that raises raises ReduceFailed naming the event, with its traceback."""

    class Fussy(Recorder):
        def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
            if event.offset == 2:
                raise KeyError("boom")
            return super().reduce(event, state)

    with pytest.raises(ReduceFailed, match="stopped before offset 2") as caught:
        reduce_processor(Fussy(), [item(1), item(2), item(3)])
    assert caught.value.details["type"] == "item.added"
    assert "raise KeyError" in caught.value.details["traceback"]


def test_reduce_processor_validates_skips_and_normalizes() -> None:
    """With skip chosen, a malformed payload is skipped (reported); a valid one reaches reduce as its model."""
    seen: list[Any] = []

    class Watching(SkippingRecorder):
        def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
            seen.append(event.payload)
            return super().reduce(event, state)

    with structlog.testing.capture_logs() as logs:
        state = reduce_processor(
            Watching(),
            [item(1), {"type": "item.added", "payload": {"n": "x"}}, item("4")],  # type: ignore[arg-type]
        )
    assert state == Tally(total=5, offsets=[1, 3])
    assert seen == [Item(n=1), Item(n=4)]
    assert [e["event"] for e in logs] == ["processor.payload_malformed"]


def test_reduce_processor_applies_the_consumes_rule() -> None:
    """Events the contract does not consume are not reduced; named ephemerals are."""
    seen: list[str] = []

    class Watching(Recorder):
        def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
            seen.append(event.type)
            return super().reduce(event, state)

    reduce_processor(
        Watching(), [item(1), note(), ping(), EventInput(type="item.added", payload={"n": 2})]
    )
    assert seen == ["item.added", "ping", "item.added"]


def test_reduce_processor_keeps_the_offsets_of_committed_events() -> None:
    """StreamEvent inputs keep their own offsets."""
    events = [StreamEvent(path="/", offset=o, type="item.added", payload={"n": 1}) for o in (4, 9)]
    assert reduce_processor(Recorder(), events).offsets == [4, 9]


def test_reduce_processor_guards_a_raising_reduce() -> None:
    """With skip chosen, a reduce that raises keeps the previous state, as in the engine."""

    class Fussy(SkippingRecorder):
        def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
            if event.offset == 2:
                raise KeyError("boom")
            return super().reduce(event, state)

    assert reduce_processor(Fussy(), [item(1), item(2), item(3)]) == Tally(total=4, offsets=[1, 3])


def test_reduce_processor_refuses_malformed_inputs_like_the_log() -> None:
    """An input the log would refuse is refused with the same error."""
    with pytest.raises(InvalidEvent, match="unknown field"):
        reduce_processor(Recorder(), [{"type": "item.added", "colour": "red"}])


# -- memory_stream ------------------------------------------------------------------------


async def test_memory_stream_pumps_every_append_to_its_engines() -> None:
    """Each append is pushed, without waiting, to every engine with its scanned range."""
    pushes: list[tuple[list[int], ScannedRange]] = []

    class Target:
        async def process_event_batch(self, events: Any, range: ScannedRange) -> None:
            pushes.append(([e.offset for e in events], range))

    ms = memory_stream()
    ms.engines.append(Target())
    await ms.append(item(1), item(2))
    await ms.append(ping())
    await ms.append(item(3, idempotency_key="k"))
    await ms.append(item(3, idempotency_key="k"))  # an idempotent retry: nothing new to push
    await settle()
    assert pushes == [
        ([1, 2], ScannedRange(0, 2)),
        ([3], ScannedRange(2, 3)),
        ([4], ScannedRange(3, 4)),
    ]
    assert [e.offset for e in ms.events] == [1, 2, 4]
    assert [e.offset for e in ms.pushed_events] == [1, 2, 3, 4]
    assert (ms.head, ms.last_offset) == (4, 4)


async def test_memory_stream_can_drop_pushes() -> None:
    """With drop_pushes set, appends commit but reach no engine; dropped_pushes counts them."""
    ms = memory_stream()
    with memory_storage() as storage:
        engine = ProcessorEngine(Recorder(), stream=ms, storage=storage)
        ms.engines.append(engine)
        ms.drop_pushes = True
        await ms.append(item(1))
        await settle()
        assert (ms.dropped_pushes, engine.cursor, storage.writes) == (1, 0, 0)
        assert (await engine.snapshot()).state.total == 1
        await engine.aclose()


async def test_memory_stream_records_failed_pushes() -> None:
    """A pushed batch that fails lands in push_errors instead of being lost."""

    class Failing:
        def process_event_batch(self, events: Any, range: ScannedRange) -> Any:
            async def fail() -> None:
                raise RuntimeError("engine down")

            return fail()

    ms = memory_stream()
    ms.engines.append(Failing())
    await ms.append(item(1))
    await settle()
    assert [str(e) for e in ms.push_errors] == ["engine down"]


async def test_memory_stream_counts_reads_and_records_claims() -> None:
    """reads counts every read; claims records each claim's time in order."""
    ms = memory_stream("/a/b")
    assert ms.stream is ms
    assert ms.path == "/a/b"
    await ms.read()
    await ms.read(0, 5)
    await ms.claim(12.5)
    await ms.claim(None)
    assert ms.reads == 2
    assert ms.claims == [12.5, None]


async def test_memory_stream_says_which_events_an_earlier_call_committed() -> None:
    """As the log: an idempotent hit's offset is in replayed_offsets; a new event's is not."""
    stream = memory_stream()
    keyed = {**item(1), "idempotency_key": "k"}
    (first,) = await stream.append(keyed)
    again = await stream.append(keyed, {**item(2), "idempotency_key": "j"})
    assert replayed_offsets(again) == {first.offset}
    assert replayed_offsets(await stream.append(item(3))) == frozenset()


async def test_memory_stream_refuses_like_the_log() -> None:
    """Validation is the log's own, so the same input gets the same error text."""
    bad = {"type": "x", "payload": [1]}
    with pytest.raises(InvalidEvent) as expected:
        prepare_events([bad])
    with pytest.raises(InvalidEvent) as got:
        await memory_stream().append(bad)
    assert str(got.value) == str(expected.value)


async def test_memory_stream_stamps_created_at_from_its_clock() -> None:
    """created_at comes from the clock passed in."""
    ms = memory_stream(clock=ManualClock(0))
    (event,) = await ms.append(item(1))
    assert event.created_at == "1970-01-01T00:00:00.000000Z"


def test_memory_stream_refuses_a_bad_path() -> None:
    """The path follows the log's rule."""
    with pytest.raises(ValueError, match="stream path"):
        memory_stream("no-slash")


# -- memory_storage, settle, the clock ------------------------------------------------------


async def test_memory_storage_is_the_real_table_and_counts_writes() -> None:
    """memory_storage is a ReduceCheckpointTable whose writes are counted; close ends it."""
    storage = memory_storage()
    assert isinstance(storage, ReduceCheckpointTable)
    await storage.save("p", reducer_version="1", reduced_through_offset=3, state_json='{"a":1}')
    await storage.save("p", reducer_version="1", reduced_through_offset=4, state_json=None)
    checkpoint = await storage.load("p")
    assert checkpoint is not None
    assert (checkpoint.reduced_through_offset, checkpoint.state_json) == (4, '{"a":1}')
    assert storage.writes == 2
    storage.close()
    with pytest.raises(Exception, match=r"(?i)closed"):
        storage.read("p")


async def test_settle_lets_fire_and_forget_work_run() -> None:
    """settle yields to the loop long enough for a scheduled task to finish."""
    done: list[int] = []

    async def work() -> None:
        await asyncio.sleep(0)
        done.append(1)

    task = asyncio.ensure_future(work())
    await settle()
    assert done == [1]
    assert task.done()


def test_manual_clock_moves_only_when_told() -> None:
    """ManualClock returns its time and moves by advance."""
    clock = ManualClock(100)
    assert clock() == 100.0
    assert clock.advance(2.5) == 102.5
    assert clock() == 102.5
    assert "102.5" in repr(clock)


# -- one clock ---------------------------------------------------------------------------


class _Stamps(Recorder):
    """Folds the created_at of each item into the offsets list's place: epoch seconds."""

    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        stamp = datetime.fromisoformat(event.created_at).timestamp()
        return Tally(total=state.total, offsets=[*state.offsets, int(stamp)])


def test_reduce_processor_stamps_inputs_by_its_clock_and_by_default_the_fixtures_start() -> None:
    """No clock: the ManualClock start (not 1970); a clock: read once per input as it is prepared."""
    default = reduce_processor(_Stamps(), [item(1)])
    assert default.offsets == [int(ManualClock()())]

    clock = ManualClock(5_000)

    def ticking() -> float:
        return clock.advance(10)

    state = reduce_processor(_Stamps(), [item(1), item(2)], clock=ticking)
    assert state.offsets == [5_010, 5_020]


@pytest.mark.parametrize(
    "created_at",
    [
        datetime(2030, 1, 1, tzinfo=UTC),
        1_893_456_000,
        1_893_456_000.0,
        "2030-01-01T00:00:00Z",
        "2030-01-01T01:00:00+01:00",
    ],
)
def test_reduce_processor_keeps_an_inputs_own_created_at(created_at: object) -> None:
    """A mapping input's created_at (aware datetime, epoch seconds, ISO text with a zone) is kept."""
    state = reduce_processor(_Stamps(), [{**item(1), "created_at": created_at}])
    assert state.offsets == [1_893_456_000]


@pytest.mark.parametrize(
    "created_at", ["yesterday", "2030-01-01T00:00:00", datetime(2030, 1, 1), True]
)
def test_reduce_processor_refuses_a_created_at_it_cannot_place_in_time(created_at: object) -> None:
    """Naive or unreadable times are a coded refusal naming the input, not a guess."""
    with pytest.raises(InvalidEvent, match=r"event #1: created_at must be .*nothing was folded"):
        reduce_processor(_Stamps(), [item(1), {**item(2), "created_at": created_at}])


async def test_the_stream_fixture_stamps_events_by_the_clock_fixture(
    streamkit_stream: MemoryStream, streamkit_clock: ManualClock
) -> None:
    """A time derived from an event's created_at and the clock's time agree, and move together."""
    (first,) = await streamkit_stream.append(item(1))
    streamkit_clock.advance(61)
    (second,) = await streamkit_stream.append(item(2))
    assert datetime.fromisoformat(first.created_at).timestamp() == 1_700_000_000.0
    assert datetime.fromisoformat(second.created_at).timestamp() == 1_700_000_061.0


async def test_process_event_reads_the_engines_clock_as_args_now() -> None:
    """args.now() is the clock given to the engine, in every pass."""
    clock = ManualClock(42)
    nows: list[float] = []
    stream = memory_stream(clock=clock)
    with memory_storage() as storage:
        engine = ProcessorEngine(
            Recorder(on_event=lambda args: nows.append(args.now())),
            stream=stream,
            storage=storage,
            clock=clock,
        )
        stream.engines.append(engine)
        await stream.append(item(1))
        await engine.wait_until_processed(1, timeout=1)
        clock.advance(8)
        await engine.revive()
        await settle()
        await engine.aclose()
    assert nows[0] == 42
    assert nows[-1] == 50


# -- the pytest plugin ----------------------------------------------------------------------


async def test_the_plugin_fixtures_drive_an_engine(
    streamkit_stream: MemoryStream, streamkit_storage: MemoryStorage, streamkit_clock: ManualClock
) -> None:
    """The plugin's fixtures are a fresh stream, storage and clock that work together."""
    engine = ProcessorEngine(
        Recorder(), stream=streamkit_stream, storage=streamkit_storage, clock=streamkit_clock
    )
    streamkit_stream.engines.append(engine)
    await streamkit_stream.append(item(3))
    await engine.wait_until_processed(1, timeout=1)
    assert streamkit_storage.writes == 1
    assert streamkit_clock() == 1_700_000_000.0
    await engine.aclose()


def test_the_storage_fixture_closes_its_database(tmp_path: Path) -> None:
    """After a test, the streamkit_storage fixture has closed its connection (a real pytest run)."""
    (tmp_path / "test_fixture.py").write_text(
        textwrap.dedent(
            """
            import sqlite3
            import pytest

            held = []

            def test_uses(streamkit_storage):
                held.append(streamkit_storage)
                assert streamkit_storage.writes == 0

            def test_closed():
                with pytest.raises(sqlite3.ProgrammingError):
                    held[0].connection.execute("SELECT 1")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_fixture.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


USER_TEST = """
from streamkit.testing import ManualClock, MemoryStorage, MemoryStream


async def test_fixtures_arrive(
    streamkit_stream: MemoryStream, streamkit_storage: MemoryStorage, streamkit_clock: ManualClock
) -> None:
    (event,) = await streamkit_stream.append({"type": "t"})
    assert event.offset == 1
    assert streamkit_clock() == streamkit_clock.now
"""


def test_the_documented_pytest_configuration_runs_a_users_async_test(tmp_path: Path) -> None:
    """docs/testing.md's pyproject lines are enough for a user's async test with the fixtures."""
    page = (ROOT / "docs" / "testing.md").read_text()
    section = page.split("## pytest configuration", 1)[1]
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "pyproject.toml").write_text(toml)
    (tmp_path / "test_user.py").write_text(USER_TEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout

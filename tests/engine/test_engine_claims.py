"""Background work, the claim it holds, revives, and wakeups (SPEC 4 rule 3 and 5.6)."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from streamkit.testing import settle
from support.engine import Recorder, Rig, item

from streamkit import InvalidRequest
from streamkit.engine import REVIVE_AFTER, REVIVE_AFTER_MAX
from streamkit.processor import ProcessEventArgs


def background_on_first(gate: asyncio.Event, done: list[int]) -> Any:
    """A hook that starts one gated background attempt while processing offset 1."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None and args.event.offset == 1:

            async def attempt() -> None:
                await gate.wait()
                done.append(1)

            args.run_in_background(attempt)

    return on_event


async def test_background_work_is_not_awaited_and_holds_a_claim(rig: Rig) -> None:
    """An attempt in flight does not hold the cursor; it claims now+20 s, kept until its revive."""
    gate = asyncio.Event()
    done: list[int] = []
    processor = Recorder(background_on_first(gate, done))
    engine = rig.engine(processor)
    t0 = rig.clock()
    await rig.stream.append(item(1))
    await rig.stream.append(item(2))
    await settle()
    assert processor.delivered == [1, 2]
    assert done == []
    assert engine.statistics().background_in_flight == 1
    assert rig.stream.claims == [t0 + REVIVE_AFTER]
    gate.set()
    await settle()
    assert done == [1]
    assert engine.statistics().background_in_flight == 0
    assert rig.stream.claims == [t0 + REVIVE_AFTER]  # settling writes nothing
    rig.clock.advance(REVIVE_AFTER)
    await engine.revive()
    assert rig.stream.claims == [t0 + REVIVE_AFTER, None]  # the revive finds nothing owed


async def test_overlapping_attempts_claim_once_and_the_revive_releases(rig: Rig) -> None:
    """Two overlapping attempts claim once; settling writes nothing; the revive releases."""
    gates = [asyncio.Event(), asyncio.Event()]

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            gate = gates[args.event.offset - 1]
            args.run_in_background(gate.wait)

    rig.engine(Recorder(on_event), pushed=False)
    engine = rig.built[0]
    await rig.stream.append(item(1), item(2))
    await engine.catch_up_from_log()
    await settle(0)
    assert len(rig.stream.claims) == 1
    gates[1].set()
    await settle()
    assert len(rig.stream.claims) == 1
    gates[0].set()
    await settle()
    assert len(rig.stream.claims) == 1
    await engine.revive()
    assert rig.stream.claims[-1] is None


async def test_failed_background_work_is_reported_and_released_by_the_revive(rig: Rig) -> None:
    """A raising attempt is reported with slug, offset and type; its claim ends at the revive."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:

            async def attempt() -> None:
                raise ConnectionError("smtp down")

            args.run_in_background(attempt)

    engine = rig.engine(Recorder(on_event))
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1))
        await settle()
    (entry,) = [e for e in logs if e["event"] == "processor.background_failed"]
    assert (entry["slug"], entry["offset"], entry["type"]) == ("recorder", 1, "item.added")
    assert "smtp down" in entry["error"]
    assert engine.statistics().batch_failures == 0
    await engine.revive()
    assert rig.stream.claims[-1] is None


async def test_a_revive_finding_work_in_flight_claims_again_doubled_and_capped(rig: Rig) -> None:
    """Each revive with the attempt still running claims 40 s, 80 s, ... capped at 30 minutes."""
    gate = asyncio.Event()
    engine = rig.engine(Recorder(background_on_first(gate, [])))
    await rig.stream.append(item(1))
    await settle()
    delays = []
    for _ in range(9):
        rig.clock.advance(5)
        await engine.revive()
        delays.append(rig.stream.claims[-1] - rig.clock())  # type: ignore[operator]
    assert delays == [40, 80, 160, 320, 640, 1280, REVIVE_AFTER_MAX, REVIVE_AFTER_MAX, 1800]
    gate.set()
    await settle()
    rig.clock.advance(REVIVE_AFTER_MAX)
    await engine.revive()
    assert rig.stream.claims[-1] is None
    # Once released, the next attempt starts from 20 s again.
    assert engine.statistics().claimed_at is None


async def test_revive_runs_the_at_head_pass(rig: Rig) -> None:
    """A revive of a caught-up processor runs one eventless caught-up pass."""
    processor = Recorder()
    engine = rig.engine(processor)
    await rig.stream.append(item(1))
    await settle()
    processor.calls.clear()
    await engine.revive()
    assert processor.calls == [(None, True)]


async def test_revive_catches_up_then_the_last_page_is_the_pass(rig: Rig) -> None:
    """A revive that finds new events delivers them and the last one is the at-head pass."""
    processor = Recorder()
    engine = rig.engine(processor, pushed=False)
    await rig.stream.append(item(1), item(2))
    await engine.revive()
    assert processor.calls == [(1, False), (2, True)]


async def test_a_restarted_host_restarts_owed_work_from_state(rig: Rig) -> None:
    """A dead host's claim revives a new engine whose at-head pass restarts the owed work."""
    gate = asyncio.Event()
    first = rig.engine(Recorder(background_on_first(gate, [])))
    await rig.stream.append(item(1))
    await settle()
    assert rig.stream.claims == [rig.clock() + REVIVE_AFTER]
    await first.aclose()  # the host dies: the attempt is abandoned, the claim stays
    assert rig.stream.claims[-1] is not None
    restarted: list[Any] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.delivery.caught_up and args.state.total:
            restarted.append(args.state.total)

    second = rig.restart(first, Recorder(on_event))
    rig.clock.advance(REVIVE_AFTER)
    await second.revive()
    assert restarted == [1]


async def test_a_failing_claim_is_reported_and_sent_again(rig: Rig) -> None:
    """A claim the stream refuses is reported; the next attempt sends it again, covered or not."""
    gates = [asyncio.Event(), asyncio.Event()]
    attempts: list[float | None] = []

    async def failing_claim(at: float | None) -> None:
        attempts.append(at)
        if len(attempts) == 1:
            raise OSError("alarm store down")

    waiting = list(gates)

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            args.run_in_background(waiting.pop(0).wait)

    rig.stream.claim = failing_claim  # type: ignore[method-assign]
    engine = rig.engine(Recorder(on_event))
    t0 = rig.clock()
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1))
        await settle()
    (entry,) = [e for e in logs if e["event"] == "processor.claim_failed"]
    assert entry["slug"] == "recorder"
    assert "alarm store down" in entry["error"]
    rig.clock.advance(1)
    await rig.stream.append(item(2))
    await settle()
    assert attempts == [t0 + REVIVE_AFTER, t0 + REVIVE_AFTER]
    for gate in gates:
        gate.set()
    await settle()
    await engine.revive()
    assert attempts[-1] is None
    assert engine.statistics().claimed_at is None


async def test_attempts_under_a_standing_claim_write_none(rig: Rig) -> None:
    """Attempts that start before the standing claim falls due write no claim of their own."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            args.run_in_background(lambda: asyncio.sleep(0))

    engine = rig.engine(Recorder(on_event))
    t0 = rig.clock()
    for _ in range(10):
        await rig.stream.append(item(1))
        await settle()
        rig.clock.advance(1)
    assert rig.stream.claims == [t0 + REVIVE_AFTER]
    assert engine.statistics().background_in_flight == 0


async def test_an_attempt_after_the_claim_fell_due_claims_afresh(rig: Rig) -> None:
    """Once the standing deadline has passed, the next attempt claims its own 20 s."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            args.run_in_background(lambda: asyncio.sleep(0))

    rig.engine(Recorder(on_event))
    t0 = rig.clock()
    await rig.stream.append(item(1))
    await settle()
    rig.clock.advance(REVIVE_AFTER + 1)
    await rig.stream.append(item(1))
    await settle()
    assert rig.stream.claims == [t0 + REVIVE_AFTER, t0 + 2 * REVIVE_AFTER + 1]


async def test_an_attempt_under_a_doubled_claim_moves_it_earlier(rig: Rig) -> None:
    """A claim doubled for a long attempt does not cover a new one: it moves to now + 20 s."""
    gate = asyncio.Event()

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None:
            first = args.event.offset == 1
            args.run_in_background(gate.wait if first else lambda: asyncio.sleep(0))

    engine = rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    rig.clock.advance(REVIVE_AFTER)
    await engine.revive()
    assert rig.stream.claims[-1] == rig.clock() + 2 * REVIVE_AFTER
    rig.clock.advance(1)
    await rig.stream.append(item(1))
    await settle()
    assert rig.stream.claims[-1] == rig.clock() + REVIVE_AFTER
    gate.set()
    await settle()


# -- wakeups --------------------------------------------------------------------------------


def waking(at_offsets: dict[int, float]) -> Any:
    """A hook whose at-head pass asks for the wakeup its state's total maps to."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.delivery.caught_up and args.state.total in at_offsets:
            args.schedule_wakeup(at_offsets[args.state.total])

    return on_event


async def test_a_wakeup_becomes_the_claim(rig: Rig) -> None:
    """A wakeup asked for in the at-head pass is claimed; a pass that asks none releases it."""
    t0 = rig.clock()
    engine = rig.engine(Recorder(waking({1: t0 + 60})))
    await rig.stream.append(item(1))
    await settle()
    assert rig.stream.claims == [t0 + 60]
    assert engine.statistics().claimed_at == t0 + 60
    await rig.stream.append(item(1))
    await settle()
    assert rig.stream.claims == [t0 + 60, None]


async def test_wakeups_are_re_derived_at_every_at_head_pass(rig: Rig) -> None:
    """The claim follows what the latest at-head pass asked for, later or earlier."""
    t0 = rig.clock()
    rig.engine(Recorder(waking({1: t0 + 60, 2: t0 + 300, 3: t0 + 10})))
    for _ in range(3):
        await rig.stream.append(item(1))
        await settle()
    assert rig.stream.claims == [t0 + 60, t0 + 300, t0 + 10]


async def test_the_claim_is_the_earliest_of_wakeups_and_background(rig: Rig) -> None:
    """One claim per processor: the earliest of the background deadline and the wakeups."""
    gate = asyncio.Event()
    t0 = rig.clock()

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None and args.event.offset == 1:
            args.run_in_background(gate.wait)
        if args.delivery.caught_up:
            args.schedule_wakeup(t0 + 5)
            args.schedule_wakeup(t0 + 500)

    engine = rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    assert engine.statistics().claimed_at == t0 + 5
    assert rig.stream.claims == [t0 + REVIVE_AFTER, t0 + 5]
    gate.set()
    await settle()
    assert rig.stream.claims[-1] == t0 + 5  # the wakeup outlives the background attempt


async def test_a_due_wakeup_revives_and_the_pass_decides_again(rig: Rig) -> None:
    """Reviving at a wakeup runs the at-head pass, which asks for the next one (or none)."""
    t0 = rig.clock()
    plan = [t0 + 30, t0 + 90]

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.delivery.caught_up and plan:
            args.schedule_wakeup(plan.pop(0))

    engine = rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    rig.clock.advance(30)
    await engine.revive()
    rig.clock.advance(60)
    await engine.revive()
    assert rig.stream.claims == [t0 + 30, t0 + 90, None]


async def test_a_bad_wakeup_time_is_refused(rig: Rig) -> None:
    """schedule_wakeup refuses a value that is not a number of epoch seconds."""
    errors: list[BaseException] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        try:
            args.schedule_wakeup("tomorrow")  # type: ignore[arg-type]
        except ValueError as exc:
            errors.append(exc)

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    assert len(errors) == 1
    assert [at for at in rig.stream.claims if at is not None] == []


async def test_background_verbs_refuse_a_coroutine_object(rig: Rig) -> None:
    """Passing a coroutine instead of a function is refused, and the coroutine is closed."""
    errors: list[str] = []

    async def work() -> None:
        return None

    def on_event(args: ProcessEventArgs[Any]) -> None:
        for verb in (args.run_in_background, args.block_processor_while):
            try:
                verb(work())  # type: ignore[arg-type]
            except ValueError as exc:
                errors.append(str(exc))

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    assert len(errors) == 2
    assert all("function that returns an awaitable" in e for e in errors)


async def test_blocking_after_the_event_finished_is_refused(rig: Rig) -> None:
    """block_processor_while from background work, after the event's delivery, is refused."""
    errors: list[str] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is None:
            return

        async def later() -> None:
            await asyncio.sleep(0.001)
            try:
                args.block_processor_while(
                    asyncio.sleep,
                )  # type: ignore[arg-type]
            except ValueError as exc:
                errors.append(str(exc))

        args.run_in_background(later)

    rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    assert len(errors) == 1
    assert "after the delivery" in errors[0]


async def test_a_wakeup_replaces_the_background_claim_once_the_attempt_settles(rig: Rig) -> None:
    """A wakeup asked while an attempt runs is claimed as soon as the attempt settles."""
    gate = asyncio.Event()
    t0 = rig.clock()

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None and args.event.offset == 1:
            args.run_in_background(gate.wait)
        if args.delivery.caught_up:
            args.schedule_wakeup(t0 + 60)

    engine = rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    assert rig.stream.claims == [t0 + REVIVE_AFTER]
    gate.set()
    await settle()
    assert rig.stream.claims == [t0 + REVIVE_AFTER, t0 + 60]
    assert engine.statistics().claim_held == engine.statistics().claimed_at == t0 + 60


async def test_no_background_work_starts_once_the_engine_is_closing(rig: Rig) -> None:
    """An attempt that settles during a close's grace cannot start another: it is refused."""
    gate = asyncio.Event()
    refused: list[Exception] = []
    second: list[int] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None and args.event.offset == 1:

            async def attempt() -> None:
                await gate.wait()

                async def more() -> None:
                    second.append(1)

                try:
                    args.run_in_background(more)
                except InvalidRequest as exc:
                    refused.append(exc)

            args.run_in_background(attempt)

    engine = rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await settle()
    closing = asyncio.ensure_future(engine.aclose(grace=5))
    await settle()
    gate.set()
    await closing
    await settle()
    assert second == []
    (error,) = refused
    assert "nothing was started" in str(error)
    assert engine.statistics().background_in_flight == 0

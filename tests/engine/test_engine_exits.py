"""An exit raised in a processor's code is that code's failure, never the host's exit.

``SystemExit`` and ``KeyboardInterrupt`` leave an asyncio event loop from the
task they are raised in, stopping every processor of the host mid-batch. The
engine holds them as :class:`~streamkit.processor.ExitRefused` failures of
the code that raised them, each where that code's other failures go.
"""

from __future__ import annotations

from typing import Any

import structlog
from streamkit.testing import settle
from support.engine import Recorder, Rig, SkippingRecorder, Tally, item

from streamkit import StreamEvent
from streamkit.processor import ExitRefused, ProcessEventArgs


class ExitsInReduce(SkippingRecorder):
    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        if event.payload.n == 13:
            raise SystemExit(13)
        return super().reduce(event, state)


async def test_a_reduce_that_exits_is_a_reduce_failure_and_the_fold_goes_on(rig: Rig) -> None:
    """With skip chosen, the event's reduce is counted failed (state kept); the next events fold."""
    engine = rig.engine(ExitsInReduce())
    await rig.stream.append(item(1), item(13), item(2))
    await engine.wait_until_processed(3)
    incidents = engine.statistics().incidents
    assert incidents["reduce_failures"] == 1
    assert "raised SystemExit(13)" in incidents["last_reduce_failure"]["error"]
    assert (await engine.snapshot())[1].total == 3


async def test_blocking_work_that_exits_fails_its_batch_which_is_retried(rig: Rig) -> None:
    """A blocker raising SystemExit fails the batch (nothing persisted); the retry passes."""
    raised: list[int] = []

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None and not raised:

            async def exits() -> None:
                raised.append(1)
                raise SystemExit(2)

            args.block_processor_while(exits)

    engine = rig.engine(Recorder(on_event))
    await rig.stream.append(item(1))
    await engine.wait_until_processed(1, timeout=30)
    assert engine.statistics().batch_failures == 1
    assert isinstance(engine.statistics().last_error, ExitRefused)
    assert "process_event or its blocking work raised SystemExit(2)" in str(
        engine.statistics().last_error
    )


async def test_background_work_that_exits_is_reported_like_any_failure(rig: Rig) -> None:
    """run_in_background work raising KeyboardInterrupt: reported, the engine goes on."""

    def on_event(args: ProcessEventArgs[Any]) -> None:
        if args.event is not None and args.event.offset == 1:

            async def interrupts() -> None:
                raise KeyboardInterrupt

            args.run_in_background(interrupts)

    engine = rig.engine(Recorder(on_event))
    with structlog.testing.capture_logs() as logs:
        await rig.stream.append(item(1))
        await settle()
        await rig.stream.append(item(2))
        await engine.wait_until_processed(2)
    (entry,) = [e for e in logs if e["event"] == "processor.background_failed"]
    assert "run_in_background work raised KeyboardInterrupt()" in entry["error"]
    assert engine.statistics().background_in_flight == 0

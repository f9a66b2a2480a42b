"""Processors for the host tests; the subprocess tests copy this file into tmp_path.

Plain module, importable by a ``streamkit host`` child process as ``hostprocs``
(the tests copy it there and put it on PYTHONPATH).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pydantic import BaseModel, Field

from streamkit import EventDefinition, StreamEvent, StreamProcessor, define_processor_contract
from streamkit.processor import ProcessEventArgs


class Offsets(BaseModel):
    offsets: list[int] = Field(default_factory=list)
    pings: int = 0


class Tally(StreamProcessor[Offsets]):
    """Records the offset of every ``item`` it reduces: the exactly-once witness."""

    contract = define_processor_contract(
        slug="tally",
        version="1",
        description="records reduced item offsets",
        state_schema=Offsets,
        consumes=["item"],
        emits=[],
    )

    def reduce(self, event: StreamEvent, state: Offsets) -> Offsets | None:
        return state.model_copy(update={"offsets": [*state.offsets, event.offset]})


class Second(Tally):
    """A second slug over the same events (several processors on one path)."""

    contract = define_processor_contract(
        slug="second",
        version="1",
        description="records reduced item offsets too",
        state_schema=Offsets,
        consumes=["item"],
        emits=[],
    )


class Third(Tally):
    """A third slug over the same events (hosts sharing several processors)."""

    contract = define_processor_contract(
        slug="third",
        version="1",
        description="records reduced item offsets as well",
        state_schema=Offsets,
        consumes=["item"],
        emits=[],
    )


class Fourth(Tally):
    """A fourth slug over the same events."""

    contract = define_processor_contract(
        slug="fourth",
        version="1",
        description="records reduced item offsets again",
        state_schema=Offsets,
        consumes=["item"],
        emits=[],
    )


class Pinged(StreamProcessor[Offsets]):
    """Counts ephemeral ``ping`` events it is pushed (they are never written)."""

    contract = define_processor_contract(
        slug="pinged",
        version="1",
        description="counts pings",
        state_schema=Offsets,
        consumes=["ping"],
        emits=[],
    )

    def __init__(self) -> None:
        self.pings = 0

    def reduce(self, event: StreamEvent, state: Offsets) -> Offsets | None:
        return state.model_copy(update={"pings": state.pings + 1})


class Fragile(StreamProcessor[Offsets]):
    """Its effect raises on every ``item`` whose payload says ``boom``: a poison event."""

    contract = define_processor_contract(
        slug="fragile",
        version="1",
        description="fails on poison items",
        state_schema=Offsets,
        consumes=["item"],
        emits=[],
    )

    def __init__(self) -> None:
        self.attempts: dict[int, int] = {}

    def reduce(self, event: StreamEvent, state: Offsets) -> Offsets | None:
        return state.model_copy(update={"offsets": [*state.offsets, event.offset]})

    def process_event(self, args: ProcessEventArgs[Offsets]) -> None:
        event = args.event
        if event is None or not event.payload.get("boom"):
            return
        self.attempts[event.offset] = self.attempts.get(event.offset, 0) + 1

        async def explode() -> None:
            raise RuntimeError(f"poison at {event.offset}")

        args.block_processor_while(explode)


class Gated(StreamProcessor[Offsets]):
    """Records item offsets; its first delivery waits for ``gate``; counts caught-up passes."""

    contract = define_processor_contract(
        slug="gated",
        version="1",
        description="holds its first event until released",
        state_schema=Offsets,
        consumes=["item"],
        emits=[],
    )

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.caught_up: list[int | None] = []

    def reduce(self, event: StreamEvent, state: Offsets) -> Offsets | None:
        return state.model_copy(update={"offsets": [*state.offsets, event.offset]})

    def process_event(self, args: ProcessEventArgs[Offsets]) -> None:
        if args.delivery.caught_up:
            self.caught_up.append(None if args.event is None else args.event.offset)
        if args.event is not None and not self.gate.is_set():
            args.block_processor_while(self.gate.wait)


class WakeState(BaseModel):
    wake_at: float | None = None


class Sleeper(StreamProcessor[WakeState]):
    """Asks for a wakeup at the time an ``alarm`` event names, until that time has come."""

    contract = define_processor_contract(
        slug="sleeper",
        version="1",
        description="wakes up when told",
        state_schema=WakeState,
        consumes=["alarm"],
        emits=[],
    )

    def __init__(self) -> None:
        self.eventless = asyncio.Event()
        self.woke = asyncio.Event()

    def reduce(self, event: StreamEvent, state: WakeState) -> WakeState | None:
        return WakeState(wake_at=event.payload.get("at"))

    def process_event(self, args: ProcessEventArgs[WakeState]) -> None:
        if not args.delivery.caught_up:
            return
        if args.event is None:
            self.eventless.set()
        at = args.state.wake_at
        if at is None:
            return
        if time.time() >= at:
            self.woke.set()
        else:
            args.schedule_wakeup(at)


class Lingering(StreamProcessor[Offsets]):
    """Starts background work per item that never ends by itself (holds the claim)."""

    contract = define_processor_contract(
        slug="lingering",
        version="1",
        description="background work that outlives its event",
        state_schema=Offsets,
        consumes=["item"],
        emits=[],
    )

    def __init__(self) -> None:
        self.cancelled = 0

    def process_event(self, args: ProcessEventArgs[Any]) -> None:
        if args.event is None:
            return

        async def forever() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

        args.run_in_background(forever)


class Blob(BaseModel):
    blob: str = ""
    offsets: list[int] = Field(default_factory=list)


class Hoarder(StreamProcessor[Blob]):
    """A ``big`` event makes its state too large to checkpoint (the engine latches that)."""

    contract = define_processor_contract(
        slug="hoarder",
        version="1",
        description="keeps too much",
        state_schema=Blob,
        consumes=["item", "big"],
        emits=[],
    )

    def reduce(self, event: StreamEvent, state: Blob) -> Blob | None:
        blob = "x" * 3_000_000 if event.type == "big" else ""
        return Blob(blob=blob, offsets=[*state.offsets, event.offset])


class Jobs(BaseModel):
    done: int = 0


class Echo(StreamProcessor[Jobs]):
    """Answers each ``job`` with an ``echo`` after a 0.3 s blocker: the stale-effect witness."""

    contract = define_processor_contract(
        slug="echo",
        version="1",
        description="echoes each job after a slow effect",
        state_schema=Jobs,
        consumes=["job"],
        emits=["echo"],
    )

    def reduce(self, event: StreamEvent, state: Jobs) -> Jobs | None:
        return state.model_copy(update={"done": state.done + 1})

    def process_event(self, args: ProcessEventArgs[Jobs]) -> None:
        event = args.event
        if event is None:
            return

        async def answer() -> None:
            await asyncio.sleep(0.3)
            await args.append(
                {"type": "echo", "payload": {"job": event.offset, "pid": os.getpid()}}
            )

        args.block_processor_while(answer)


class Grinder(StreamProcessor[Jobs]):
    """Holds the event loop with CPU work for ``seconds`` (payload) per ``grind``: a long batch."""

    contract = define_processor_contract(
        slug="grinder",
        version="1",
        description="burns CPU on the event loop",
        state_schema=Jobs,
        consumes=["grind"],
        emits=[],
    )

    def reduce(self, event: StreamEvent, state: Jobs) -> Jobs | None:
        payload = event.payload if isinstance(event.payload, dict) else {}
        until = time.monotonic() + float(payload.get("seconds", 0.0))
        spins = 0
        while time.monotonic() < until:  # no await: nothing else runs on the loop meanwhile
            spins += 1
        return state.model_copy(update={"done": state.done + 1})


class Order(BaseModel):
    order: int


class Typed(StreamProcessor[Offsets]):
    """Reduces ``order`` events (payload schema ``Order``); its reduce raises on order 13."""

    contract = define_processor_contract(
        slug="typed",
        version="1",
        description="orders by offset",
        state_schema=Offsets,
        events={"order": EventDefinition(description="an order", payload_schema=Order)},
        consumes=["order"],
        emits=[],
    )

    def reduce(self, event: StreamEvent, state: Offsets) -> Offsets | None:
        if event.payload.order == 13:
            raise ValueError("unlucky order")
        return state.model_copy(update={"offsets": [*state.offsets, event.offset]})


class Answerer(StreamProcessor[Jobs]):
    """Answers each ``question`` with one unkeyed ``answer``: every re-run effect shows as a twin."""

    contract = define_processor_contract(
        slug="answerer",
        version="1",
        description="one answer per question, appended without an idempotency key",
        state_schema=Jobs,
        consumes=["question"],
        emits=["answer"],
    )

    def reduce(self, event: StreamEvent, state: Jobs) -> Jobs | None:
        return state.model_copy(update={"done": state.done + 1})

    def process_event(self, args: ProcessEventArgs[Jobs]) -> None:
        event = args.event
        if event is None:
            return

        payload = event.payload if isinstance(event.payload, dict) else {}
        delay = float(payload.get("delay", 0.001))  # the effect's I/O: a backlog takes seconds

        async def answer() -> None:
            await asyncio.sleep(delay)
            await args.append({"type": "answer", "payload": {"question": event.offset}})

        args.block_processor_while(answer)


class Sums(BaseModel):
    total: int = 0
    items: int = 0


class Effector(StreamProcessor[Sums]):
    """Version 1: sums each item's ``n``; one keyed ``effect`` per item, naming who ran it.

    The effect's idempotency key holds the slug and the source offset only, so
    an effect run again (by any version) stays one event in the log; the
    ``version`` in its payload says which version's append landed. An item
    with ``"quiet": true`` has no effect (bulk for a rebuild to read). Each
    instance records the offsets it delivered (``delivered``).
    """

    factor = 1
    contract = define_processor_contract(
        slug="effector",
        version="1",
        description="sums items, one effect per item",
        state_schema=Sums,
        consumes=["item"],
        emits=["effect"],
    )

    def __init__(self) -> None:
        self.delivered: list[int] = []

    def reduce(self, event: StreamEvent, state: Sums) -> Sums | None:
        n = int(event.payload.get("n", 1)) if isinstance(event.payload, dict) else 1
        return Sums(total=state.total + self.factor * n, items=state.items + 1)

    def process_event(self, args: ProcessEventArgs[Sums]) -> None:
        event = args.event
        if event is None:
            return
        self.delivered.append(event.offset)
        if isinstance(event.payload, dict) and event.payload.get("quiet"):
            return
        args.append(
            {
                "type": "effect",
                "payload": {"source": event.offset, "version": self.contract.version},
                "idempotency_key": self.idempotency_key("effect", event),
            }
        )


class EffectorV2(Effector):
    """Version 2 of :class:`Effector`: every item counts ten times."""

    factor = 10
    contract = define_processor_contract(
        slug="effector",
        version="2",
        description="sums items times ten, one effect per item",
        state_schema=Sums,
        consumes=["item"],
        emits=["effect"],
    )


class ManualEffectorV2(EffectorV2):
    """:class:`EffectorV2` with a manual cutover: built, it waits for an operator."""

    contract = define_processor_contract(
        slug="effector",
        version="2",
        description="sums items times ten, one effect per item",
        state_schema=Sums,
        consumes=["item"],
        emits=["effect"],
        cutover="manual",
    )


class SlowEffectorV2(EffectorV2):
    """:class:`EffectorV2` whose reduce takes a fifth of a millisecond: a rebuild to watch."""

    def reduce(self, event: StreamEvent, state: Sums) -> Sums | None:
        time.sleep(0.0002)
        return super().reduce(event, state)


# -- schedules (the schedule drills) -------------------------------------------------------

from streamkit.processors.schedules import SchedulesProcessor  # noqa: E402
from streamkit.processors.tasks import TaskContext, TasksProcessor  # noqa: E402


class Schedules(SchedulesProcessor):
    """The schedules processor as a daemon runs it: the engine's clock."""


async def _ping(args: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"pid": os.getpid()}


class ScheduledTasks(TasksProcessor):
    """The tasks processor with the ``ping`` handler the schedule drills' slots request."""

    def __init__(self) -> None:
        super().__init__(handlers={"ping": _ping}, backoff_base=0.2, backoff_max=1.0)

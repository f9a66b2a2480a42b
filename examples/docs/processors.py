"""The code of docs/processors.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/processors.py
"""

import asyncio


async def main() -> None:
    # --- docs/processors.md:45
    from pydantic import BaseModel, Field

    from streamkit import EventDefinition, StreamProcessor, define_processor_contract


    class TaskCreated(BaseModel):
        task_id: str
        category: str


    class TaskClosed(BaseModel):
        task_id: str


    class BoardChanged(BaseModel):
        open: int


    class BoardState(BaseModel):
        open: dict[str, str] = Field(default_factory=dict)  # task id -> category
        closed: int = 0


    BOARD = define_processor_contract(
        slug="task-board",
        version="1",
        description="open tasks by category",
        state_schema=BoardState,
        events={
            "task.created": EventDefinition(
                description="a task was opened", payload_schema=TaskCreated
            ),
            "task.closed": EventDefinition(description="a task was closed", payload_schema=TaskClosed),
            "board.changed": EventDefinition(
                description="how many are open", payload_schema=BoardChanged
            ),
        },
        consumes=["task.created", "task.closed"],
        emits=["board.changed"],
    )
    assert BOARD.initial_state() == BoardState()
    assert BOARD.payload_schema_for("task.created") is TaskCreated
    # --- docs/processors.md:104
    from streamkit import InvalidContract

    try:
        define_processor_contract(
            slug="task-board",
            version="1",
            state_schema=BoardState,
            events={},
            consumes=["task.deleted"],
        )
    except InvalidContract as error:
        assert error.code == "INVALID_CONTRACT"
        assert "task.deleted" in str(error)
    else:
        raise AssertionError("an unknown consumed type must be refused")
    # --- docs/processors.md:127
    from streamkit import consumes_event

    assert consumes_event(["*"], {"type": "task.created"})
    assert not consumes_event(["*"], {"type": "cursor.moved", "ephemeral": True})
    assert consumes_event(["cursor.moved"], {"type": "cursor.moved", "ephemeral": True})
    # --- docs/processors.md:250
    from streamkit import ProcessorEngine, StreamEvent
    from streamkit.processor import ProcessEventArgs
    from streamkit.testing import memory_storage, memory_stream, settle


    class Board(StreamProcessor[BoardState]):
        contract = BOARD

        def reduce(self, event: StreamEvent, state: BoardState) -> BoardState | None:
            if event.type == "task.created":
                return BoardState(
                    open={**state.open, event.payload.task_id: event.payload.category},
                    closed=state.closed,
                )
            if event.type == "task.closed" and event.payload.task_id in state.open:
                remaining = {k: v for k, v in state.open.items() if k != event.payload.task_id}
                return BoardState(open=remaining, closed=state.closed + 1)
            return None

        def process_event(self, args: ProcessEventArgs[BoardState]) -> None:
            # Once caught up, publish the count if it moved since the last pass.
            if args.delivery.caught_up and args.event is not None:
                args.append(
                    {
                        "type": "board.changed",
                        "payload": {"open": len(args.state.open)},
                        "idempotency_key": self.idempotency_key("changed", args.event),
                    }
                )


    stream = memory_stream()
    storage = memory_storage()
    engine = ProcessorEngine(Board(), stream=stream, storage=storage)
    stream.engines.append(engine)  # the memory stream pushes every append to its engines

    await stream.append(
        {"type": "task.created", "payload": {"task_id": "t1", "category": "home"}},
        {"type": "task.created", "payload": {"task_id": "t2", "category": "work"}},
    )
    await settle()  # let the push land: this batch reaches the head
    (closed,) = await stream.append({"type": "task.closed", "payload": {"task_id": "t1"}})
    await settle()

    offset, state = await engine.snapshot()
    assert state == BoardState(open={"t2": "work"}, closed=1)
    changed = [e for e in stream.events if e.type == "board.changed"]
    assert [e.payload for e in changed] == [{"open": 2}, {"open": 1}]
    assert changed[-1].source["processor"] == {
        "slug": "task-board",
        "version": "1",
        "while_processing": {"offset": closed.offset, "type": "task.closed"},
    }
    # --- docs/processors.md:308
    checkpoint = storage.read("task-board")
    assert checkpoint.reducer_version == "1"
    assert checkpoint.reduced_through_offset >= closed.offset
    assert BoardState.model_validate_json(checkpoint.state_json) == state
    # --- docs/processors.md:349
    class Slot(BaseModel):
        name: str
        tries: int = 0


    class Slots(BaseModel):
        slots: dict[str, Slot] = Field(default_factory=dict)


    SLOTS = define_processor_contract(slug="slots", version="1", state_schema=Slots, compact_state=True)
    assert SLOTS.dump_state(Slots(slots={"a": Slot(name="a")})) == '{"slots":{"a":{"name":"a"}}}'
    # --- docs/processors.md:397
    class Page(BaseModel):
        text: str = ""
        edits: int = 0


    class Written(BaseModel):
        text: str


    class Pages(StreamProcessor[Page]):
        contract = define_processor_contract(
            slug="pages",
            version="1",
            state_schema=Page,
            events={"page.written": EventDefinition(description="new text", payload_schema=Written)},
            consumes=["page.written"],
        )

        def reduce(self, event: StreamEvent, state: Page) -> Page:
            return Page(text=event.payload.text, edits=state.edits + 1)


    pages_stream, pages_storage = memory_stream(), memory_storage()
    pages = ProcessorEngine(Pages(), stream=pages_stream, storage=pages_storage)
    pages_stream.engines.append(pages)
    (first,) = await pages_stream.append({"type": "page.written", "payload": {"text": "x" * 100_000}})
    await settle()  # the first write: the state is measured at 100 KB
    for _ in range(3):
        (last,) = await pages_stream.append(
            {"type": "page.written", "payload": {"text": "y" * 100_000}}
        )
        await settle()
    row = pages_storage.read("pages")
    assert row.reduced_through_offset >= last.offset
    assert row.state_offset == first.offset  # the state lags: the last 3 events are not in it
    assert (await pages.snapshot()).state.edits == 4

    # A crash now: the next engine restores the state of `first` and reduces the 3 after again.
    pages_stream.engines.remove(pages)
    again = ProcessorEngine(Pages(), stream=pages_stream, storage=pages_storage)
    assert (await again.snapshot()).state.edits == 4
    await again.aclose()  # a clean close writes the state it held
    assert pages_storage.read("pages").state_offset is None  # current: the cursor's
    # --- docs/processors.md:462
    from streamkit import SharedMap


    class Seat(BaseModel):
        holder: str


    class Hall(BaseModel):
        seats: SharedMap[str, Seat] = Field(default_factory=SharedMap)


    class Booked(BaseModel):
        seat: str
        holder: str


    class Bookings(StreamProcessor[Hall]):
        contract = define_processor_contract(
            slug="bookings",
            version="1",
            state_schema=Hall,
            events={"seat.booked": EventDefinition(description="a seat", payload_schema=Booked)},
            consumes=["seat.booked"],
        )

        def reduce(self, event: StreamEvent, state: Hall) -> Hall:
            booked = event.payload
            return Hall(seats=state.seats.set(booked.seat, Seat(holder=booked.holder)))


    hall_stream, hall_storage = memory_stream(), memory_storage()
    bookings = ProcessorEngine(Bookings(), stream=hall_stream, storage=hall_storage)
    hall_stream.engines.append(bookings)
    await hall_stream.append(
        *(
            {"type": "seat.booked", "payload": {"seat": f"r{n}", "holder": "box office"}}
            for n in range(1_000)
        )
    )
    await hall_stream.append({"type": "seat.booked", "payload": {"seat": "r7", "holder": "ada"}})
    await settle()
    after = (await bookings.snapshot()).state
    assert after.seats["r7"].holder == "ada"
    assert len(after.seats) == 1_000

    seats = after.seats
    moved = seats.set("r8", Seat(holder="grace"))
    assert seats["r8"].holder == "box office"  # the old map is untouched
    assert sum(a is b for a, b in zip(moved.buckets, seats.buckets)) == 63  # one bucket copied
    assert "r9" not in moved.delete("r9")
    assert Hall.model_validate_json(after.model_dump_json()).seats == after.seats
    await bookings.aclose()
    # --- docs/processors.md:545
    class BoardV2(Board):
        contract = define_processor_contract(
            slug="task-board",
            version="2",
            description="closed tasks no longer counted",
            state_schema=BoardState,
            events=BOARD.events,
            consumes=["task.created", "task.closed"],
            emits=["board.changed"],
        )

        def reduce(self, event: StreamEvent, state: BoardState) -> BoardState | None:
            next_state = super().reduce(event, state)
            return None if next_state is None else BoardState(open=next_state.open)


    stream.engines.remove(engine)
    upgraded = ProcessorEngine(BoardV2(), stream=stream, storage=storage)
    offset, state = await upgraded.snapshot()
    assert state == BoardState(open={"t2": "work"}, closed=0)
    serving = storage.read("task-board")  # the serving version's row
    assert (serving.reducer_version, serving.cutover_offset) == ("2", offset)
    assert not storage.read("task-board", "1").serving  # kept, for a way back
    # --- docs/processors.md:594
    from streamkit import apply_delta

    quiet_stream = memory_stream("/quiet")
    watchers = []
    quiet = ProcessorEngine(
        Board(), stream=quiet_stream, storage=memory_storage(), publish_live=lambda: bool(watchers)
    )
    quiet_stream.engines.append(quiet)
    await quiet_stream.append(
        {"type": "task.created", "payload": {"task_id": "q1", "category": "home"}}
    )
    await settle()
    assert quiet.live_behind
    assert not [e for e in quiet_stream.pushed_events if e.type == "streamkit.live-state-changed"]

    watchers.append("a client")
    rev, seed = await quiet.live_snapshot()  # the present, as a new revision
    held = seed.model_dump(mode="json")
    await quiet_stream.append(
        {"type": "task.created", "payload": {"task_id": "q2", "category": "work"}}
    )
    await settle()
    (delta,) = [
        e.payload for e in quiet_stream.pushed_events if e.type == "streamkit.live-state-changed"
    ]
    assert delta["from"] == rev
    held = apply_delta(held, delta["patch"])
    assert held == (await quiet.live_snapshot()).state.model_dump(mode="json")
    # --- docs/processors.md:625
    from streamkit import apply_delta

    rev, seed = await upgraded.live_snapshot()
    held = seed.model_dump(mode="json")
    await stream.append({"type": "task.created", "payload": {"task_id": "t3", "category": "home"}})
    stream.engines.append(upgraded)
    await stream.append({"type": "task.closed", "payload": {"task_id": "t2"}})
    await settle()
    for event in stream.pushed_events:
        if event.type == "streamkit.live-state-changed" and event.payload["from"] == rev:
            held = apply_delta(held, event.payload["patch"])
            rev = event.payload["to"]
    assert held == (await upgraded.live_snapshot()).state.model_dump(mode="json")
    # --- docs/processors.md:651
    from streamkit.testing import memory_storage as summary_storage
    from streamkit.testing import memory_stream as summary_stream


    class Ticks(BaseModel):
        count: int = 0


    class Summarized(StreamProcessor[Ticks]):
        contract = define_processor_contract(
            slug="summarized", version="1", state_schema=Ticks, consumes=["tick"]
        )

        def reduce(self, event, state):
            return Ticks(count=state.count + 1)

        def status_summary(self, state):
            return {"ticks": state.count}


    ticking = summary_stream()
    summarized = ProcessorEngine(Summarized(), stream=ticking.stream, storage=summary_storage())
    await ticking.stream.append({"type": "tick"}, {"type": "tick"})
    await summarized.catch_up_from_log()
    assert summarized.status_summary() == {"ticks": 2}
    # --- docs/processors.md:726
    from streamkit.testing import ManualClock


    class Reminder(StreamProcessor[BoardState]):
        contract = BOARD

        def reduce(self, event: StreamEvent, state: BoardState) -> BoardState | None:
            return Board().reduce(event, state)

        def process_event(self, args: ProcessEventArgs[BoardState]) -> None:
            if args.delivery.caught_up and args.state.open:
                args.schedule_wakeup(args.now() + 3600)  # nag in an hour while tasks are open


    clock = ManualClock(1_700_000_000)
    reminders = memory_stream()
    reminder = ProcessorEngine(Reminder(), stream=reminders, storage=memory_storage(), clock=clock)
    reminders.engines.append(reminder)
    await reminders.append({"type": "task.created", "payload": {"task_id": "t9", "category": "home"}})
    await settle()
    assert reminders.claims == [1_700_003_600]
    await reminders.append({"type": "task.closed", "payload": {"task_id": "t9"}})
    await settle()
    assert reminders.claims[-1] is None  # nothing open: no wakeup asked, the claim is released
    # --- docs/processors.md:766
    for built in (engine, upgraded, reminder):
        await built.aclose()
    storage.close()


if __name__ == "__main__":
    asyncio.run(main())

"""The code of docs/testing.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/testing.py
"""

import asyncio


async def main() -> None:
    # --- docs/testing.md:30
    from pydantic import BaseModel, Field

    from streamkit import EventDefinition, StreamEvent, StreamProcessor, define_processor_contract
    from streamkit.processor import ProcessEventArgs


    class OrderPlaced(BaseModel):
        customer: str
        due_at: float


    class Orders(BaseModel):
        per_customer: dict[str, int] = Field(default_factory=dict)
        next_due: float | None = None


    class OrderBook(StreamProcessor[Orders]):
        contract = define_processor_contract(
            slug="order-book",
            version="1",
            state_schema=Orders,
            events={
                "order.placed": EventDefinition(description="an order", payload_schema=OrderPlaced)
            },
            consumes=["order.placed"],
        )

        def reduce(self, event: StreamEvent, state: Orders) -> Orders:
            customer = event.payload.customer
            due = event.payload.due_at
            return Orders(
                per_customer={**state.per_customer, customer: state.per_customer.get(customer, 0) + 1},
                next_due=due if state.next_due is None else min(state.next_due, due),
            )

        def process_event(self, args: ProcessEventArgs[Orders]) -> None:
            if args.delivery.caught_up and args.state.next_due is not None:
                args.schedule_wakeup(args.state.next_due)
    # --- docs/testing.md:89
    from streamkit import PayloadMalformed
    from streamkit.testing import reduce_processor

    state = reduce_processor(
        OrderBook(),
        [
            {"type": "order.placed", "payload": {"customer": "ada", "due_at": 50}},
            {"type": "order.placed", "payload": {"customer": "ada", "due_at": "20"}},  # coerced
            {"type": "order.shipped", "payload": {}},  # not consumed
        ],
    )
    assert state == Orders(per_customer={"ada": 2}, next_due=20.0)
    try:
        reduce_processor(OrderBook(), [{"type": "order.placed", "payload": {"customer": "bob"}}])
    except PayloadMalformed as exc:  # the engine would stall there
        assert exc.details["offset"] == 1
    else:
        raise AssertionError("a malformed payload never passes unseen")
    # --- docs/testing.md:121
    from streamkit import ProcessorEngine
    from streamkit.testing import ManualClock, memory_storage, memory_stream, settle

    stream = memory_stream()
    storage = memory_storage()
    clock = ManualClock(1_000)
    engine = ProcessorEngine(OrderBook(), stream=stream, storage=storage, clock=clock)
    stream.engines.append(engine)

    await stream.append({"type": "order.placed", "payload": {"customer": "ada", "due_at": 1_300}})
    await settle()
    assert storage.writes == 1  # one checkpoint per batch
    assert stream.claims == [1_300.0]  # the wakeup became the processor's claim

    stream.drop_pushes = True  # this push is lost...
    await stream.append({"type": "order.placed", "payload": {"customer": "bob", "due_at": 1_200}})
    stream.drop_pushes = False
    await stream.append({"type": "order.placed", "payload": {"customer": "ada", "due_at": 1_900}})
    await settle()
    offset, state = await engine.snapshot()  # ...and repaired from the log by the next one
    assert state.per_customer == {"ada": 2, "bob": 1}
    assert stream.claims[-1] == 1_200.0
    await engine.aclose()
    storage.close()
    # --- docs/testing.md:172
    from streamkit import ProcessorEngine
    from streamkit.testing import ManualClock, MemoryStorage, MemoryStream, reduce_processor, settle


    async def test_order_book_counts_and_wakes(
        streamkit_stream: MemoryStream, streamkit_storage: MemoryStorage, streamkit_clock: ManualClock
    ) -> None:
        """Orders are counted per customer and the earliest due time is claimed as a wakeup."""
        engine = ProcessorEngine(
            OrderBook(), stream=streamkit_stream, storage=streamkit_storage, clock=streamkit_clock
        )
        streamkit_stream.engines.append(engine)
        due = streamkit_clock() + 60
        (placed,) = await streamkit_stream.append(
            {"type": "order.placed", "payload": {"customer": "ada", "due_at": due}}
        )
        await engine.wait_until_processed(placed.offset, timeout=1)

        offset, state = await engine.snapshot()
        assert state == reduce_processor(OrderBook(), streamkit_stream.events)
        assert state.per_customer == {"ada": 1}
        assert streamkit_stream.claims == [due]
        assert streamkit_storage.writes == 1

        # A restarted engine resumes from the checkpoint and redelivers nothing.
        streamkit_stream.engines.remove(engine)
        again = ProcessorEngine(
            OrderBook(), stream=streamkit_stream, storage=streamkit_storage, clock=streamkit_clock
        )
        assert (await again.snapshot()).state == state
        await engine.aclose()
        await again.aclose()


    with MemoryStorage() as storage:
        await test_order_book_counts_and_wakes(MemoryStream("/"), storage, ManualClock())
    # --- docs/testing.md:228
    from datetime import datetime

    from streamkit.testing import ManualClock


    class SeatHeld(BaseModel):
        seat: str


    class Holds(BaseModel):
        until: dict[str, float] = Field(default_factory=dict)


    class SeatHolds(StreamProcessor[Holds]):
        contract = define_processor_contract(
            slug="seat-holds",
            version="1",
            state_schema=Holds,
            events={
                "seat.held": EventDefinition(description="a seat held", payload_schema=SeatHeld),
                "seat.released": EventDefinition(description="a hold ran out", payload_schema=SeatHeld),
            },
            consumes=["seat.held", "seat.released"],
            emits=["seat.released"],
        )

        def reduce(self, event: StreamEvent, state: Holds) -> Holds:
            until = dict(state.until)
            if event.type == "seat.held":
                until[event.payload.seat] = datetime.fromisoformat(event.created_at).timestamp() + 60
            else:
                until.pop(event.payload.seat, None)
            return Holds(until=until)

        def process_event(self, args: ProcessEventArgs[Holds]) -> None:
            if not args.delivery.caught_up:
                return
            for seat, until in args.state.until.items():
                if until <= args.now():
                    args.append(
                        {
                            "type": "seat.released",
                            "payload": {"seat": seat},
                            "idempotency_key": f"released:{seat}:{until}",
                        }
                    )
                else:
                    args.schedule_wakeup(until)


    clock = ManualClock()
    stream = memory_stream(clock=clock)
    storage = memory_storage()
    engine = ProcessorEngine(SeatHolds(), stream=stream, storage=storage, clock=clock)
    stream.engines.append(engine)

    (held,) = await stream.append({"type": "seat.held", "payload": {"seat": "12A"}})
    await engine.wait_until_processed(held.offset, timeout=1)
    assert stream.claims[-1] == clock() + 60  # held from the event's created_at, by the same clock

    clock.advance(61)
    await engine.revive()  # what the host does when the claim falls due
    await settle()
    assert [e.type for e in stream.events] == ["seat.held", "seat.released"]
    assert (await engine.snapshot()).state.until == {}
    await engine.aclose()
    storage.close()

    # The fold alone, with a created_at the test chooses:
    state = reduce_processor(
        SeatHolds(),
        [{"type": "seat.held", "payload": {"seat": "3C"}, "created_at": "2030-01-01T00:00:00Z"}],
    )
    assert state.until == {"3C": datetime.fromisoformat("2030-01-01T00:01:00Z").timestamp()}


if __name__ == "__main__":
    asyncio.run(main())

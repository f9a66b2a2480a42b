"""The code of docs/rebuilds.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/rebuilds.py
"""

import asyncio


async def main() -> None:
    # --- docs/rebuilds.md:55
    from pydantic import BaseModel

    from streamkit import ProcessorEngine, StreamEvent, StreamProcessor, define_processor_contract
    from streamkit.testing import memory_storage, memory_stream, settle


    class Total(BaseModel):
        total: int = 0


    class Adder(StreamProcessor[Total]):
        contract = define_processor_contract(
            slug="adder",
            version="1",
            description="adds the amounts",
            state_schema=Total,
            consumes=["amount"],
            emits=[],
        )

        def __init__(self) -> None:
            self.acted_on: list[int] = []

        def reduce(self, event: StreamEvent, state: Total) -> Total | None:
            return Total(total=state.total + event.payload["n"])

        def process_event(self, args) -> None:  # type: ignore[no-untyped-def]
            if args.event is not None:
                self.acted_on.append(args.event.offset)


    class Doubler(Adder):
        contract = define_processor_contract(
            slug="adder",
            version="2",
            description="adds the amounts, twice",
            state_schema=Total,
            consumes=["amount"],
            emits=[],
        )

        def reduce(self, event: StreamEvent, state: Total) -> Total | None:
            return Total(total=state.total + 2 * event.payload["n"])


    stream, storage = memory_stream("/"), memory_storage()
    first = Adder()
    v1 = ProcessorEngine(first, stream=stream, storage=storage)
    stream.engines.append(v1)
    await stream.append(*({"type": "amount", "payload": {"n": n}} for n in (1, 2, 3)))
    await settle()
    assert storage.read("adder").reducer_version == "1"

    stream.engines.remove(v1)
    second = Doubler()
    v2 = ProcessorEngine(second, stream=stream, storage=storage)
    stream.engines.append(v2)
    cut, state = await v2.snapshot()  # built in the shadow, then cut over
    assert state.total == 12
    assert second.acted_on == []  # every event so far had its effects under version 1
    assert (storage.read("adder").reducer_version, storage.read("adder").cutover_offset) == ("2", cut)
    retired = storage.read("adder", "1")
    assert (retired.serving, retired.retired_at) == (False, cut)

    [later] = await stream.append({"type": "amount", "payload": {"n": 10}})
    await settle()
    assert later.offset > cut
    assert second.acted_on == [later.offset]  # the events after the cutover offset only
    # --- docs/rebuilds.md:251
    import asyncio


    class CarefulDoubler(Doubler):
        contract = define_processor_contract(
            slug="adder",
            version="2",
            description="adds the amounts, twice, cut over by hand",
            state_schema=Total,
            consumes=["amount"],
            emits=[],
            cutover="manual",
        )


    own_stream, own_storage = memory_stream("/"), memory_storage()
    serving_engine = ProcessorEngine(Adder(), stream=own_stream, storage=own_storage)
    own_stream.engines.append(serving_engine)
    await own_stream.append(*({"type": "amount", "payload": {"n": n}} for n in (1, 2, 3)))
    await settle()

    careful = CarefulDoubler()
    built = ProcessorEngine(careful, stream=own_stream, storage=own_storage)
    building = built.catch_up_from_log()
    while not (built.statistics().rebuild or {}).get("awaiting_cutover"):
        await asyncio.sleep(0.01)
    assert own_storage.read("adder").reducer_version == "1"  # version 1 still serves

    own_stream.engines.remove(serving_engine)  # on a host, the cutover fences it
    cut = await built.cut_over()  # what `streamkit processor cutover adder` asks the host
    await building
    assert (own_storage.read("adder").reducer_version, own_storage.read("adder").cutover_offset) == (
        "2",
        cut,
    )
    assert (await built.snapshot()).state.total == 12
    assert careful.acted_on == []
    # --- docs/rebuilds.md:308
    assert storage.reinstate("adder", "1")  # what `processor rollback --to 1` does
    stream.engines.remove(v2)
    back = Adder()
    again = ProcessorEngine(back, stream=stream, storage=storage)
    stream.engines.append(again)
    offset, state = await again.snapshot()
    assert state.total == 16  # version 1's sum, built on from its kept row
    assert back.acted_on == []  # version 2 acted on everything up to here
    assert storage.read("adder").reducer_version == "1"
    assert storage.read("adder", "2").retired_at == offset


if __name__ == "__main__":
    asyncio.run(main())

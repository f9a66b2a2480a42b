"""The code of docs/retention.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/retention.py
"""

import asyncio


async def main() -> None:
    # --- docs/retention.md:58
    from pydantic import BaseModel

    from streamkit import ProcessorHost, StreamEvent, StreamProcessor, define_processor_contract
    from streamkit.config import HostConfig


    class Open(BaseModel):
        """Orders placed and not yet shipped, by order id: where each was placed."""

        placed: dict[str, int] = {}


    class Shipping(StreamProcessor[Open]):
        contract = define_processor_contract(
            slug="shipping",
            version="1",
            state_schema=Open,
            consumes=["order.placed", "order.shipped"],
        )

        def reduce(self, event: StreamEvent, state: Open) -> Open:
            order = str(event.payload["order"])
            if event.type == "order.placed":
                return Open(placed={**state.placed, order: event.offset})
            return Open(placed={k: v for k, v in state.placed.items() if k != order})

        def retain_from(self, state: Open) -> int | None:
            # The packing slip is printed from the order's own event: keep the oldest open one.
            return min(state.placed.values(), default=None)


    host = ProcessorHost(HostConfig(db="shop.db"), processors=[Shipping()])
    await host.start()
    placed = await host.append(
        "/", [{"type": "order.placed", "payload": {"order": n}} for n in (1, 2, 3)]
    )
    shipped = await host.append("/", [{"type": "order.shipped", "payload": {"order": 1}}])
    await host.wait_until_processed("shipping", shipped[-1].offset)

    (orders,) = (await host.status())["retention"]
    assert (orders["path"], orders["head"], orders["horizon"]) == ("/", 4, 2)
    assert orders["held_by"] == [
        {"kind": "processor", "name": "shipping@1", "from": 2, "why": "retain_from", "state": "serving"}
    ]
    await host.stop()


if __name__ == "__main__":
    asyncio.run(main())

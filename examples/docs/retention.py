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
    # --- docs/retention.md:328
    import asyncio
    from pathlib import Path

    from streamkit.config import load_config

    policy = ["[[retention]]", 'path = "/clicks"', "keep_last = 3", "delete = true"]
    Path("streamkit.toml").write_text(
        "\n".join(['db = "kept.db"', "retention_interval = 0.2", *policy]) + "\n"
    )
    clicks = ProcessorHost(load_config("streamkit.toml"))
    await clicks.start()
    await clicks.append("/clicks", [{"type": "click", "payload": {"n": n}} for n in range(10)])
    while (await clicks.status())["retention_job"]["policies"][0]["events_taken"] < 7:
        await asyncio.sleep(0.05)
    status = await clicks.status()
    (ran,) = status["retention_job"]["policies"]
    assert (ran["runs"] >= 1, ran["failures"], ran["last_error"]) == (True, 0, None)
    assert ran["last_run"]["stopped_by"] == "keep_last"
    (kept,) = status["retention"]
    assert (kept["path"], kept["start"]) == ("/clicks", 8)
    await clicks.stop()
    # --- docs/retention.md:431
    from streamkit import StreamEvent, StreamProcessor, define_processor_contract


    class Recent(BaseModel):
        orders: list[int] = []


    class RecentOrders(StreamProcessor[Recent]):
        contract = define_processor_contract(
            slug="recent-orders",
            version="1",
            state_schema=Recent,
            consumes=["order.placed"],
            start="head",  # the newest orders only: what came before is not its business
        )

        def reduce(self, event: StreamEvent, state: Recent) -> Recent:
            return Recent(orders=[*state.orders[-9:], int(event.payload["order"])])


    recent = ProcessorHost(HostConfig(db="shop.db"), processors=[RecentOrders()])
    await recent.start()
    while (await recent.status())["processors"][0]["began"] is None:
        await asyncio.sleep(0.05)
    (placed,) = await recent.append("/", [{"type": "order.placed", "payload": {"order": 4}}])
    await recent.wait_until_processed("recent-orders", placed.offset)
    assert (await recent.snapshot("recent-orders"))["state"] == {"orders": [4]}
    (row,) = (await recent.status())["processors"]
    assert (row["began"]["start"], row["began"]["skipped"]) == ("head", placed.offset - 2)
    await recent.stop()


if __name__ == "__main__":
    asyncio.run(main())

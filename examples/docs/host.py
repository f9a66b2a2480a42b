"""The code of docs/host.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/host.py
"""

import asyncio


async def main() -> None:
    # --- docs/host.md:713
    from pydantic import BaseModel

    from streamkit import ProcessorHost, StreamEvent, StreamProcessor, define_processor_contract
    from streamkit.config import HostConfig
    from streamkit.control import ControlClient


    class Count(BaseModel):
        ticks: int = 0


    class Counter(StreamProcessor[Count]):
        contract = define_processor_contract(
            slug="counter", version="1", state_schema=Count, consumes=["tick"]
        )

        def reduce(self, event: StreamEvent, state: Count) -> Count:
            return Count(ticks=state.ticks + 1)


    config = HostConfig(db="app.db")
    host = ProcessorHost(config, processors=[Counter()])
    await host.start()
    committed = await host.append("/", [{"type": "tick"}, {"type": "tick"}])
    await host.wait_until_processed("counter", committed[-1].offset)
    assert (await host.snapshot("counter"))["state"] == {"ticks": 2}
    # --- docs/host.md:744
    async with ControlClient(config.socket_path, timeout=5) as client:
        await client.request("append", events=[{"type": "tick"}])
        status = await client.request("status")
    (row,) = status["processors"]
    assert (row["slug"], row["state"], row["lease_held_here"]) == ("counter", "running", True)
    await host.stop()


if __name__ == "__main__":
    asyncio.run(main())

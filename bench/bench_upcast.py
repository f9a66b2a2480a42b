"""What lifting old events costs a catch-up: every event two upcasts old, against none.

Two logs of the same N events: one stored at version 1 of its payload (each
event then needs two upcasts, 1 -> 2 -> 3, before its model validates), one
stored at version 3, the current one. A fresh ProcessorEngine catches a
trivial processor up from offset 0 on each, alternating, best of --repeat;
the ratio is the upcast catch-up's rate over the current-version one's, in
the same run (the issue's bar: >= 0.7x).

Usage: python bench/bench_upcast.py [--events N] [--repeat N]
Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from streamkit.testing import memory_storage

from streamkit import (
    EventDefinition,
    ProcessorEngine,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
    open_log,
)

PATH = "/bench"


class Tick(BaseModel):  # version 3
    n: int
    label: str
    weight: int


def v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "weight": 1}


def v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in payload.items() if k != "name"}
    return {**rest, "label": payload.get("name", "")}


class Count(BaseModel):
    count: int = 0
    total: int = 0


class Counter(StreamProcessor[Count]):
    contract = define_processor_contract(
        slug="bench-upcast",
        version="1",
        state_schema=Count,
        events={
            "tick": EventDefinition(
                description="one tick",
                payload_schema=Tick,
                version=3,
                upcasters={1: v1_to_v2, 2: v2_to_v3},
            )
        },
        consumes=["tick"],
    )

    def reduce(self, event: StreamEvent, state: Count) -> Count:
        return Count(
            count=state.count + 1, total=state.total + event.payload.n * event.payload.weight
        )


async def fill(path: Path, events: int, version: int) -> None:
    async with open_log(path, synchronous="NORMAL") as log:
        stream = log.stream(PATH)
        batch = 1000
        for start in range(0, events, batch):
            if version == 1:
                items = [
                    {"type": "tick", "payload": {"n": i, "name": f"t{i}"}}
                    for i in range(start, min(events, start + batch))
                ]
            else:
                items = [
                    {
                        "type": "tick",
                        "payload": {"n": i, "label": f"t{i}", "weight": 1},
                        "payload_version": 3,
                    }
                    for i in range(start, min(events, start + batch))
                ]
            await stream.append(*items)


async def catch_up(path: Path, events: int) -> float:
    async with open_log(path, synchronous="NORMAL") as log:
        engine = ProcessorEngine(
            Counter(),
            stream=log.stream(PATH).for_processor("bench-upcast"),
            storage=memory_storage(),
        )
        began = time.perf_counter()
        await engine.catch_up_from_log()
        seconds = time.perf_counter() - began
        state = (await engine.snapshot()).state
        await engine.aclose()
    assert state.count == events, state
    assert state.total == events * (events - 1) // 2, state
    return events / seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="streamkit-bench-upcast-"))
    old, current = directory / "old.db", directory / "current.db"
    await fill(old, args.events, 1)
    await fill(current, args.events, 3)
    rates: dict[str, list[float]] = {"old": [], "current": []}
    for _ in range(args.repeat):
        rates["current"].append(await catch_up(current, args.events))
        rates["old"].append(await catch_up(old, args.events))
    best = {name: max(values) for name, values in rates.items()}
    print(f"events: {args.events:,}; Python {sys.version.split()[0]}")
    print()
    print(f"| catch-up | events/s (best of {args.repeat}) |")
    print("| --- | ---: |")
    print(f"| stored at the current version (3) | {best['current']:,.0f} |")
    print(f"| stored at version 1 (two upcasts each) | {best['old']:,.0f} |")
    print(f"| ratio | {best['old'] / best['current']:.2f}x (goal >= 0.7x) |")


if __name__ == "__main__":
    asyncio.run(main())

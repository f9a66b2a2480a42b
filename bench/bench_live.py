"""What one batch costs as the state grows: a watched processor whose batch changes one entry.

A :class:`~streamkit.ProcessorHost` over a SQLite file (``synchronous=FULL``)
runs one processor whose state is a dict of N small pydantic entries; a
client watches its live state (``host.subscribe``), so every batch publishes
a delta. Each of the timed events changes one entry. For N = 10 and N = 10,000
it reports:

- **event**: append one event and wait until the processor has processed and
  checkpointed it (median over the timed events);
- **live set**: ``LiveState.set`` of the next projection, alone (what the
  delta costs the batch);
- **checkpoint JSON**: ``contract.dump_state`` of the state, alone (what the
  checkpoint's encoding costs when it is written: from 64 KiB of state, once
  every so many events rather than every batch).

The ratio of the 10,000-entry row to the 10-entry row is what "cost that
follows the change, not the state" is measured by.

Usage: ``.venv/bin/python bench/bench_live.py [--events N] [--sizes 10,10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from streamkit import (
    HostConfig,
    LiveState,
    ProcessorHost,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
)


class Entry(BaseModel):
    name: str
    count: int = 0


class Entries(BaseModel):
    entries: dict[str, Entry] = Field(default_factory=dict)


class Counter(StreamProcessor[Entries]):
    """Seeded with N entries by one ``seed`` event; each ``bump`` changes one entry."""

    contract = define_processor_contract(
        slug="entries", version="1", state_schema=Entries, consumes=["seed", "bump"]
    )

    def reduce(self, event: StreamEvent, state: Entries) -> Entries:
        payload = event.payload
        assert isinstance(payload, dict)
        if event.type == "seed":
            size = int(payload["n"])
            return Entries(entries={f"e{i}": Entry(name=f"entry {i}") for i in range(size)})
        key = str(payload["key"])
        old = state.entries[key]
        changed = Entry(name=old.name, count=old.count + 1)
        return Entries.model_construct(entries={**state.entries, key: changed})


async def measure(size: int, events: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        config = HostConfig(db=Path(directory) / "live.db")
        host = ProcessorHost(config, processors=[Counter()], serve_control=False)
        await host.start()
        try:
            watcher = host.subscribe("/", "entries")
            (seed,) = await host.append("/", [{"type": "seed", "payload": {"n": size}}])
            await host.wait_until_processed("entries", seed.offset)
            spans = []
            for i in range(events + 20):
                key = f"e{i % size}"
                started = time.perf_counter()
                (event,) = await host.append("/", [{"type": "bump", "payload": {"key": key}}])
                await host.wait_until_processed("entries", event.offset)
                if i >= 20:  # the first ones warm up
                    spans.append(time.perf_counter() - started)
                await watcher.get()
            host.unsubscribe(watcher)
            engine = host.runner("entries").engine
            assert engine is not None
            _, state = await engine.snapshot()
        finally:
            await host.stop()
    return {
        "event_ms": statistics.median(spans) * 1000,
        "live_set_ms": _live_set(state) * 1000,
        "checkpoint_ms": _dump(state) * 1000,
    }


def _live_set(state: Entries) -> float:
    class Sink:
        def append(self, *events: object) -> None:
            return None

    live = LiveState(Sink(), "entries", state)
    samples = []
    for i in range(30):
        key = f"e{i % len(state.entries)}"
        old = state.entries[key]
        state = Entries.model_construct(
            entries={**state.entries, key: Entry(name=old.name, count=old.count + 1)}
        )
        started = time.perf_counter()
        live.set(state)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _dump(state: Entries) -> float:
    contract = Counter.contract
    samples = []
    for _ in range(30):
        started = time.perf_counter()
        contract.dump_state(state)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--sizes", default="10,10000")
    opts = parser.parse_args()
    rows = {size: await measure(size, opts.events) for size in map(int, opts.sizes.split(","))}
    print("| entries | event (ms, median) | live set (ms) | checkpoint JSON (ms) |")
    print("| ---: | ---: | ---: | ---: |")
    for size, row in rows.items():
        print(
            f"| {size:,} | {row['event_ms']:.3f} | {row['live_set_ms']:.3f} | "
            f"{row['checkpoint_ms']:.3f} |"
        )
    small, large = rows[min(rows)], rows[max(rows)]
    print(
        f"\nlargest / smallest: event {large['event_ms'] / small['event_ms']:.2f}x, "
        f"live set {large['live_set_ms'] / small['live_set_ms']:.0f}x"
    )


if __name__ == "__main__":
    asyncio.run(main())

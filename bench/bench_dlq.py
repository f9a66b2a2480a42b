"""DLQ replay at scale over a real SQLite log: time, peak memory, checkpoint size.

Dead-letters N records, then replays them all (a no-op replay handler, so the
numbers are the DLQ's own cost: scanning the log backwards page by page and
appending a marker and an outcome per record, one commit per page), then
lists them. Prints a Markdown table; the peak memory is Python's traced
allocations during the replay (a separate run: tracing slows it down).

    .venv/bin/python bench/bench_dlq.py [N ...]     # default: 10000 100000
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from streamkit.processors.dlq import (
    REPLAY_COMPLETED,
    DlqProcessor,
    DlqRecord,
    ReplayContext,
    dead_lettered_event,
    iter_records,
    replay_requested_event,
)

from streamkit import ProcessorEngine, ReduceCheckpointTable, open_log


async def _noop(record: DlqRecord, ctx: ReplayContext) -> None:
    return None


async def run(n: int, directory: Path, *, trace: bool) -> dict[str, float]:
    """One dead-letter + replay + list run; ``trace`` measures memory (and slows it down)."""
    name = f"{n}-{'traced' if trace else 'timed'}"
    db = directory / f"dlq-{name}.db"
    connection = sqlite3.connect(directory / f"checkpoints-{name}.db")
    try:
        async with open_log(db, synchronous="NORMAL") as log:
            stream = log.stream("/")
            started = time.perf_counter()
            for start in range(0, n, 500):
                await stream.append(
                    *(
                        dead_lettered_event(
                            record_id=f"rec-{i}",
                            origin="bench",
                            operation="op",
                            payload={"order": i, "note": "x" * 60},
                            error="it broke",
                            attempts=3,
                        )
                        for i in range(start, min(n, start + 500))
                    )
                )
            dead_lettering = time.perf_counter() - started

            storage = ReduceCheckpointTable(connection)
            engine = ProcessorEngine(
                DlqProcessor(stream=stream, handlers={"op": _noop}),
                stream=stream.for_processor("dlq"),
                storage=storage,
            )
            await engine.catch_up_from_log()
            (request,) = await stream.append(replay_requested_event())
            if trace:
                tracemalloc.start()
            started = time.perf_counter()
            report: dict[str, object] | None = None
            after = request.offset
            while report is None:
                # Drive the engine as a host would (it is not fed pushes here).
                await engine.catch_up_from_log()
                page = await stream.read(after, 500)
                for event in page.events:
                    if event.type == REPLAY_COMPLETED:
                        report = event.to_dict()["payload"]["report"]
                after = page.scanned_through_offset
                if report is None and page.at_head:
                    await asyncio.sleep(0.01)
            replaying = time.perf_counter() - started
            peak = 0
            if trace:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
            await engine.catch_up_from_log()
            _, state = await engine.snapshot()
            checkpoint = len(state.model_dump_json())
            await engine.aclose(grace=5)

            started = time.perf_counter()
            listed = sum([1 async for _ in iter_records(stream)])
            listing = time.perf_counter() - started
            assert listed == n, listed
            counts = report["counts"]  # type: ignore[index]
            assert counts["replayed"] == n, counts  # type: ignore[index]
    finally:
        connection.close()
    return {
        "records": n,
        "dead_letter_s": dead_lettering,
        "replay_s": replaying,
        "replay_per_s": n / replaying,
        "peak_mib": peak / 2**20,
        "checkpoint_bytes": checkpoint,
        "list_s": listing,
    }


async def main(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        rows = []
        for n in sizes:
            # Timing and memory come from separate runs: tracemalloc slows Python down.
            timed = await run(n, Path(directory), trace=False)
            traced = await run(n, Path(directory), trace=True)
            rows.append({**timed, "peak_mib": traced["peak_mib"]})
    print(
        "| records | dead-letter (s) | replay (s) | replayed/s | peak traced memory during "
        "replay (MiB) | DLQ checkpoint (bytes) | list all (s) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['records']:,.0f} | {r['dead_letter_s']:.1f} | {r['replay_s']:.1f} | "
            f"{r['replay_per_s']:,.0f} | {r['peak_mib']:.1f} | {r['checkpoint_bytes']:,.0f} | "
            f"{r['list_s']:.1f} |"
        )


if __name__ == "__main__":
    asyncio.run(main([int(a) for a in sys.argv[1:]] or [10_000, 100_000]))

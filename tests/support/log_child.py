"""A child process for the multi-process log tests (run as ``python tests/log_child.py ...``).

    log_child.py append DB TAG COUNT EPHEMERAL_EVERY GO_FILE
        waits for GO_FILE to exist, then appends COUNT durable events, one per
        call, and after every EPHEMERAL_EVERY-th (0: never) one ephemeral event.
    log_child.py forever DB
        appends a durable event then an ephemeral one, again and again, until killed.

Each acknowledged append prints one line, flushed at once:
``D <offset> <i> <created_at>`` or ``E <offset> <created_at>``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from streamkit import open_log


def wait_for(go: str) -> None:
    while not Path(go).exists():
        time.sleep(0.001)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def append(db: str, tag: str, count: int, ephemeral_every: int, go: str) -> None:
    async with open_log(db, busy_timeout=30.0) as log:
        stream = log.stream("/shared")
        await asyncio.to_thread(wait_for, go)
        for i in range(count):
            (event,) = await stream.append(
                {"type": "child.appended", "payload": {"tag": tag, "i": i}}
            )
            say(f"D {event.offset} {i} {event.created_at}")
            if ephemeral_every and (i + 1) % ephemeral_every == 0:
                (tick,) = await stream.append({"type": "child.tick", "ephemeral": True})
                say(f"E {tick.offset} {tick.created_at}")


async def forever(db: str) -> None:
    async with open_log(db) as log:
        stream = log.stream("/shared")
        i = 0
        while True:
            (event,) = await stream.append({"type": "child.appended", "payload": {"i": i}})
            say(f"D {event.offset} {i} {event.created_at}")
            (tick,) = await stream.append({"type": "child.tick", "ephemeral": True})
            say(f"E {tick.offset} {tick.created_at}")
            i += 1


def main(argv: list[str]) -> None:
    if argv[0] == "append":
        db, tag, count, every, go = argv[1:6]
        asyncio.run(append(db, tag, int(count), int(every), go))
    elif argv[0] == "forever":
        asyncio.run(forever(argv[1]))
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

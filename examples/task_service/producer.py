"""A producer of the drill: requests tasks through the host until told to stop.

Run as ``python -m task_service.producer --socket S --name p1 --rate 15 --stop FILE --out FILE``.
It requests ``create-task`` tasks at ``rate`` per second through the host's
control socket, one at a time. Each request carries an idempotency key made
from its task id, so when the host is unreachable (killed, restarting) or a
reply is lost, the producer sends the *same* request again until the host
acknowledges it, and the log keeps one event however many times it was sent.

For every request it writes one JSON line to ``--out`` once acknowledged:
``{"task_id", "kind", "category", "title", "offset", "sends"}``, and at the end
a ``{"summary": ...}`` line. It exits 0 once the stop file exists and its last
request is acknowledged, or 2 if a request stays unacknowledged past
``--give-up`` seconds (that request is then written with ``"offset": null``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from streamkit.processors.tasks import task_requested_event

from streamkit import StreamkitError
from streamkit.control import ControlClient

CATEGORIES = ("work", "home", "errands")
LOCKED_CATEGORY = "archive"


OPENING = ("invalid", "locked", "flaky")
"""The kinds of each producer's first requests: every run, however short or slow, has
each failing path (abandoned, replayed after the unlock, retried) at least once."""


def choose(rng: random.Random, name: str, seq: int) -> dict[str, Any]:
    """The request ``seq`` of producer ``name``: mostly fine, some flaky, locked or invalid."""
    roll = rng.random()
    category = rng.choice(CATEGORIES)
    title = f"{name} task {seq}"
    kind = "ok"
    opening = OPENING[seq - 1] if seq <= len(OPENING) else None
    if opening == "invalid" or (opening is None and roll < 0.04):
        kind, title = "invalid", ""
    elif opening == "locked" or (opening is None and roll < 0.10):
        kind, category = "locked", LOCKED_CATEGORY
    elif opening == "flaky" or (opening is None and roll < 0.25):
        kind = "flaky"
    return {
        "task_id": f"{name}-{seq:05d}",
        "kind": kind,
        "args": {"title": title, "category": category, "flaky": kind == "flaky"},
    }


async def send(
    client: ControlClient, event: dict[str, Any], give_up: float
) -> tuple[int | None, int]:
    """Append ``event`` through the host, resending until acknowledged: (offset, sends)."""
    deadline = time.monotonic() + give_up
    sends = 0
    while True:
        sends += 1
        try:
            (committed,) = await client.request("append", path="/", events=[event])
            return int(committed["offset"]), sends
        except StreamkitError as exc:
            if not exc.retryable:
                raise
            if time.monotonic() >= deadline:
                return None, sends
            await asyncio.sleep(0.1)


async def produce(args: argparse.Namespace, out: TextIO) -> int:
    rng = random.Random(f"{args.seed}/{args.name}")
    stop = Path(args.stop)
    interval = 1.0 / args.rate
    requested = resent = 0
    status = 0
    client = ControlClient(args.socket, timeout=5.0)
    try:
        next_at = time.monotonic()
        seq = 0
        while not stop.exists():  # noqa: ASYNC240 - a stat, between requests
            seq += 1
            chosen = choose(rng, args.name, seq)
            event = task_requested_event(
                task_id=chosen["task_id"],
                name="create-task",
                args=chosen["args"],
                max_attempts=3,
                timeout_s=10.0,
            )
            offset, sends = await send(client, event, args.give_up)
            requested += 1
            resent += sends - 1
            line = {
                "task_id": chosen["task_id"],
                "kind": chosen["kind"],
                "category": chosen["args"]["category"],
                "title": chosen["args"]["title"],
                "offset": offset,
                "sends": sends,
            }
            out.write(json.dumps(line) + "\n")
            out.flush()
            if offset is None:
                print(
                    f"producer {args.name}: request {chosen['task_id']} was not acknowledged "
                    f"within {args.give_up} s; giving up",
                    file=sys.stderr,
                )
                status = 2
                break
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - interval)  # no burst after a stall
    finally:
        await client.close()
        summary = {"name": args.name, "requested": requested, "resent": resent}
        out.write(json.dumps({"summary": summary}) + "\n")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m task_service.producer")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--rate", type=float, default=15.0, help="requests per second")
    parser.add_argument("--stop", required=True, help="stop once this file exists")
    parser.add_argument("--out", required=True, help="JSON lines: one per acknowledged request")
    parser.add_argument("--seed", default="drill")
    parser.add_argument("--give-up", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be positive")
    with open(args.out, "a", encoding="utf-8") as out:
        return asyncio.run(produce(args, out))


if __name__ == "__main__":
    sys.exit(main())

"""``streamkit dlq list|show|replay``: the dead-letter queue's commands, a CLI plugin.

Registered through the ``streamkit.commands`` entry-point group; the core
command line never imports this package.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any, TextIO

from streamkit.processors._cli_support import (
    Sub,
    add_common_flags,
    append_event,
    json_line,
    payload_of,
    requested_by,
    write_traceback,
)
from streamkit.processors.dlq import ReplayFilter, iter_records, replay_requested_event

from streamkit import InvalidRequest
from streamkit.cli import existing_log, positive_int, positive_seconds

__all__ = ["add_dlq"]

_STATUSES = ("pending", "replaying", "succeeded", "abandoned")


def add_dlq(sub: Sub) -> None:
    """``streamkit dlq list|show|replay``."""
    p = sub.add_parser(
        "dlq",
        help="list, show and replay dead-lettered records",
        description="Inspect the dead-letter queue of streamkit.processors.dlq and request "
        "replays. Records are read from the log (the DLQ keeps only counters in its state).",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", parser_class=type(p))
    verbs.required = True

    q = verbs.add_parser(
        "list",
        help="records, newest first",
        description="Print dead-letter records with their status, newest first, read from the "
        "log page by page.",
    )
    q.add_argument(
        "--status",
        action="append",
        choices=_STATUSES,
        help="only records in this status (repeatable; default: all)",
    )
    q.add_argument("--origin", help="only records from this origin (e.g. tasks)")
    q.add_argument("--operation", help="only records of this operation (e.g. a task name)")
    q.add_argument(
        "--limit", type=positive_int, default=None, help="print at most this many records"
    )
    add_common_flags(q, json_help="print one JSON record per line")
    q.set_defaults(handler=_dlq_list)

    q = verbs.add_parser(
        "show",
        help="one record",
        description="Print one dead-letter record: status, origin, operation, error, replays "
        "and the original payload.",
    )
    q.add_argument("record_id", help="the record id")
    add_common_flags(q, json_help="print the record as JSON")
    q.set_defaults(handler=_dlq_show)

    q = verbs.add_parser(
        "replay",
        help="request a replay of pending records",
        description="Append dlq.replay-requested for the given ids, or for the pending records "
        "of an origin/operation, or for every pending record. The DLQ processor replays them "
        "and appends dlq.replay-completed with the report; --wait prints it.",
    )
    q.add_argument("--id", dest="ids", action="append", help="a record id to replay (repeatable)")
    q.add_argument("--origin", help="replay the pending records of this origin")
    q.add_argument("--operation", help="replay the pending records of this operation")
    q.add_argument("--by", help="who asked (default: user@hostname)")
    q.add_argument("--wait", action="store_true", help="wait for the replay's report and print it")
    q.add_argument(
        "--timeout", type=positive_seconds, default=60.0, help="seconds --wait waits (default: 60)"
    )
    add_common_flags(q, json_help="print the request (and, with --wait, the report) as JSON")
    q.set_defaults(handler=_dlq_replay)


def _record_line(record: dict[str, Any]) -> str:
    return "  ".join(
        [
            record["record_id"],
            record["status"],
            f"{record['origin']}/{record['operation']}",
            f"replays={record['replays']}",
            f"error: {record['error']}",
        ]
    )


def _dlq_list(args: argparse.Namespace, out: TextIO) -> int:

    async def run() -> None:
        printed = 0
        async with existing_log(args.db) as log:
            selection = ReplayFilter(origin=args.origin, operation=args.operation)
            async for record in iter_records(
                log.stream(args.path), status=args.status, selection=selection
            ):
                data = record.model_dump(mode="json")
                out.write((json_line(data) if args.json else _record_line(data)) + "\n")
                printed += 1
                if args.limit is not None and printed >= args.limit:
                    return
        if not printed and not args.json:
            out.write("no records\n")

    asyncio.run(run())
    return 0


def _dlq_show(args: argparse.Namespace, out: TextIO) -> int:

    async def run() -> dict[str, Any] | None:
        async with existing_log(args.db) as log:
            selection = ReplayFilter(record_ids=[args.record_id])
            async for record in iter_records(log.stream(args.path), selection=selection):
                found: dict[str, Any] = record.model_dump(mode="json")
                return found
        return None

    record = asyncio.run(run())
    if record is None:
        raise InvalidRequest(
            f"no dead-letter record {args.record_id!r} in {args.db!r} (path {args.path}); "
            "nothing was shown; `streamkit dlq list` shows the ids",
            details={"record_id": args.record_id},
        )
    if args.json:
        out.write(json_line(record) + "\n")
        return 0
    out.write(_record_line(record) + "\n")
    for key in ("attempts", "resource_id", "actor", "request_type", "offset", "dead_lettered_at"):
        if record.get(key) is not None:
            out.write(f"  {key}: {record[key]}\n")
    out.write(f"  payload: {json_line(record['payload'])}\n")
    write_traceback(out, record.get("traceback"))
    return 0


def _dlq_replay(args: argparse.Namespace, out: TextIO) -> int:
    event = replay_requested_event(
        record_ids=args.ids,
        origin=args.origin,
        operation=args.operation,
        requested_by=requested_by(args),
    )
    committed = append_event(args, event)
    if not args.wait:
        if args.json:
            out.write(json_line(committed.to_dict()) + "\n")
        else:
            out.write(
                f"replay requested at offset {committed.offset}; the DLQ processor appends "
                "dlq.replay-completed with the report\n"
            )
        return 0
    report = asyncio.run(_wait_report(args, committed.offset))
    if args.json:
        out.write(json_line(report) + "\n")
        return 0
    out.write(f"replay at offset {committed.offset} completed\n")
    if report.get("error"):
        out.write(f"  refused: {report['error']}\n")
    counts = report["report"]["counts"]
    for kind in ("replayed", "retried", "abandoned", "skipped"):
        ids = report["report"][kind]
        more = counts.get(kind, 0) - len(ids)
        listed = ", ".join(ids) + (f" (+{more} more)" if more > 0 else "")
        out.write(f"  {kind}: {counts.get(kind, 0)}" + (f"  {listed}" if ids else "") + "\n")
    return 0


async def _wait_report(args: argparse.Namespace, request_offset: int) -> dict[str, Any]:
    deadline = time.monotonic() + args.timeout
    after = request_offset
    async with existing_log(args.db) as log:
        stream = log.stream(args.path)
        while True:
            page = await stream.read(after, 500)
            for event in page.events:
                payload = payload_of(event)
                if (
                    event.type == "dlq.replay-completed"
                    and payload.get("request_offset") == request_offset
                ):
                    return payload
            after = page.scanned_through_offset
            if page.at_head:
                if time.monotonic() > deadline:
                    raise InvalidRequest(
                        f"no report for the replay requested at offset {request_offset} within "
                        f"{args.timeout} s; the request stays queued (is the DLQ processor "
                        "running in a host?); `streamkit dlq list` shows the records",
                        details={"request_offset": request_offset},
                    )
                await asyncio.sleep(0.1)

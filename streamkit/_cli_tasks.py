"""The ``streamkit tasks`` and ``streamkit dlq`` commands (internal to the command line).

They drive the first-party processors ``streamkit.processors.tasks`` and
``streamkit.processors.dlq`` the way a user would: by appending their request
events (``task.cancel-requested``, ``dlq.replay-requested``) and by reading
their state and the log. An append goes through the running host's control
socket when one answers on ``--db`` (so its engines see it at once), else to
the file directly; a read of the log uses the file (SQLite readers never block
the host). The processors are imported lazily: the core never depends on them.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import importlib
import json
import os
import platform
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from streamkit._cli_args import existing_log, host_socket_for, positive_int, positive_seconds
from streamkit.control import request_sync
from streamkit.errors import InvalidRequest
from streamkit.events import StreamEvent, format_timestamp
from streamkit.log import Log

__all__ = ["add_dlq", "add_tasks"]

_TASK_TYPES = (
    "task.requested",
    "task.attempt-started",
    "task.succeeded",
    "task.attempt-failed",
    "task.dead-lettered",
    "task.cancel-requested",
    "task.cancelled",
    "task.rejected",
)
_STATUSES = ("pending", "replaying", "succeeded", "abandoned")

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def _processors(name: str) -> Any:
    # Imported by name: the first-party processors sit above the core, which
    # must not import them (and they type-check as a separate package).
    return importlib.import_module(f"streamkit.processors.{name}")


def _socket(args: argparse.Namespace, slug: str | None = None) -> str | None:
    return host_socket_for(args.db, args.socket, slug)


def _common(p: argparse.ArgumentParser, *, json_help: str) -> None:
    p.add_argument(
        "--db", help="the SQLite log file (must exist); default: the db of ./streamkit.toml"
    )
    p.add_argument("--path", default="/", help="the stream path (default: /)")
    p.add_argument("--socket", help="the host's control socket (default: the db path + .sock)")
    p.add_argument("--json", action="store_true", help=json_help)


def _append(args: argparse.Namespace, event: dict[str, Any]) -> StreamEvent:
    socket = _socket(args)
    if socket is not None:
        (data,) = request_sync(
            socket, "append", path=args.path, events=[event], db=os.path.realpath(args.db)
        )
        return StreamEvent(**data)

    async def run() -> StreamEvent:
        async with existing_log(args.db) as log:
            (committed,) = await log.stream(args.path).append(event)
            return committed

    return asyncio.run(run())


def _snapshot(args: argparse.Namespace, slug: str) -> dict[str, Any] | None:
    """The processor's state from the host, else its checkpoint; None if it never ran."""
    socket = _socket(args, slug)
    if socket is not None:
        try:
            return dict(
                request_sync(
                    socket, "snapshot", slug=slug, path=args.path, db=os.path.realpath(args.db)
                )
            )
        except Exception:
            return None
    from streamkit._host_status import checkpoint_snapshot

    async def run() -> dict[str, Any] | None:
        async with existing_log(args.db) as log:
            try:
                return await checkpoint_snapshot(log, slug)
            except InvalidRequest:
                return None

    return asyncio.run(run())


def _payload(event: StreamEvent) -> dict[str, Any]:
    payload = event.to_dict()["payload"]
    return payload if isinstance(payload, dict) else {}


def _by(args: argparse.Namespace) -> str:
    by: str | None = args.by
    return by or f"{getpass.getuser()}@{platform.node()}"


def _line(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


# -- tasks --------------------------------------------------------------------------


def add_tasks(sub: Sub) -> None:
    """``streamkit tasks list|show|cancel``."""
    p = sub.add_parser(
        "tasks",
        help="list, show and cancel durable tasks",
        description="Inspect and cancel the durable tasks of streamkit.processors.tasks.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", parser_class=type(p))
    verbs.required = True

    q = verbs.add_parser(
        "list",
        help="live tasks and counters",
        description="Print the live tasks (waiting, running, retrying) and the counters, from "
        "the running host, else from the tasks processor's checkpoint.",
    )
    _common(q, json_help="print {offset, tasks, counts} as JSON")
    q.set_defaults(handler=_tasks_list)

    q = verbs.add_parser(
        "show",
        help="one task: its live state and its history",
        description="Print a task's live state (if it is live) and every task event about it in "
        "the log, oldest first.",
    )
    q.add_argument("task_id", help="the task id")
    _common(q, json_help="print {task_id, live, events} as JSON")
    q.set_defaults(handler=_tasks_show)

    q = verbs.add_parser(
        "cancel",
        help="cancel a live task",
        description="Append task.cancel-requested: the tasks processor cancels the attempt in "
        "flight (or the wait for the next one) and records task.cancelled; a task that is not "
        "live gets task.rejected.",
    )
    q.add_argument("task_id", help="the task id")
    q.add_argument("--reason", help="why, for the record")
    q.add_argument("--by", help="who asked (default: user@hostname)")
    _common(q, json_help="print the appended event as JSON")
    q.set_defaults(handler=_tasks_cancel)


def _need_tasks_state(args: argparse.Namespace) -> dict[str, Any]:
    snapshot = _snapshot(args, "tasks")
    if snapshot is None:
        raise InvalidRequest(
            f"the tasks processor has no state in {args.db!r} yet (no running host answers and "
            "it has no checkpoint there); nothing was read; run it in `streamkit host` first",
            details={"db": args.db},
        )
    return snapshot


def _task_line(task: dict[str, Any]) -> str:
    if task.get("cancel_requested"):
        status = "cancelling"
    elif task.get("running"):
        status = "running"
    elif task.get("attempt"):
        status = f"retry at {format_timestamp(task['due'])}"
    elif task.get("due"):
        status = f"scheduled at {format_timestamp(task['due'])}"
    else:
        status = "waiting"
    parts = [
        task["task_id"],
        task["name"],
        f"attempt {task.get('attempt', 0)}/{task['max_attempts']}",
        status,
    ]
    if task.get("last_error"):
        parts.append(f"last error: {task['last_error']}")
    return "  ".join(parts)


def _tasks_list(args: argparse.Namespace, out: TextIO) -> int:
    snapshot = _need_tasks_state(args)
    state = snapshot["state"] or {}
    tasks = list((state.get("tasks") or {}).values())
    counts = state.get("counts") or {}
    if args.json:
        out.write(_line({"offset": snapshot["offset"], "tasks": tasks, "counts": counts}) + "\n")
        return 0
    summary = ", ".join(f"{k}={v}" for k, v in counts.items())
    out.write(f"{len(tasks)} live task(s) at offset {snapshot['offset']} ({summary})\n")
    for task in tasks:
        out.write(_task_line(task) + "\n")
    return 0


async def _events_about(
    log: Log, path: str, types: Iterable[str], key: str, value: str
) -> list[StreamEvent]:
    wanted = set(types)
    found: list[StreamEvent] = []
    after = 0
    stream = log.stream(path)
    while True:
        page = await stream.read(after, 500)
        found += [e for e in page.events if e.type in wanted and _payload(e).get(key) == value]
        after = page.scanned_through_offset
        if page.at_head:
            return found


def _tasks_show(args: argparse.Namespace, out: TextIO) -> int:
    snapshot = _snapshot(args, "tasks")
    live = None
    if snapshot is not None and snapshot.get("state"):
        live = (snapshot["state"].get("tasks") or {}).get(args.task_id)

    async def run() -> list[StreamEvent]:
        async with existing_log(args.db) as log:
            return await _events_about(log, args.path, _TASK_TYPES, "task_id", args.task_id)

    events = asyncio.run(run())
    if live is None and not events:
        raise InvalidRequest(
            f"no task {args.task_id!r} in {args.db!r} (path {args.path}); nothing was shown",
            details={"task_id": args.task_id},
        )
    if args.json:
        out.write(
            _line({"task_id": args.task_id, "live": live, "events": [e.to_dict() for e in events]})
            + "\n"
        )
        return 0
    if live is not None:
        status = "live"
    elif snapshot is None:
        status = "live state unknown (the tasks processor has not run on this log)"
    else:
        status = "not live"
    out.write(f"task {args.task_id}: {status}\n")
    if live is not None:
        out.write("  " + _task_line(live) + "\n")
    for event in events:
        payload = {k: v for k, v in _payload(event).items() if k != "task_id"}
        out.write(f"  {event.offset}  {event.type}  {_line(payload)}\n")
    return 0


def _tasks_cancel(args: argparse.Namespace, out: TextIO) -> int:
    tasks = _processors("tasks")
    event = tasks.cancel_requested_event(args.task_id, reason=args.reason, requested_by=_by(args))
    committed = _append(args, event)
    if args.json:
        out.write(_line(committed.to_dict()) + "\n")
    else:
        out.write(
            f"cancel requested for task {args.task_id} (offset {committed.offset}); the tasks "
            "processor records task.cancelled, or task.rejected if it is not live\n"
        )
    return 0


# -- dlq ------------------------------------------------------------------------------


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
    _common(q, json_help="print one JSON record per line")
    q.set_defaults(handler=_dlq_list)

    q = verbs.add_parser(
        "show",
        help="one record",
        description="Print one dead-letter record: status, origin, operation, error, replays "
        "and the original payload.",
    )
    q.add_argument("record_id", help="the record id")
    _common(q, json_help="print the record as JSON")
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
    _common(q, json_help="print the request (and, with --wait, the report) as JSON")
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
    dlq = _processors("dlq")

    async def run() -> None:
        printed = 0
        async with existing_log(args.db) as log:
            selection = dlq.ReplayFilter(origin=args.origin, operation=args.operation)
            async for record in dlq.iter_records(
                log.stream(args.path), status=args.status, selection=selection
            ):
                data = record.model_dump(mode="json")
                out.write((_line(data) if args.json else _record_line(data)) + "\n")
                printed += 1
                if args.limit is not None and printed >= args.limit:
                    return
        if not printed and not args.json:
            out.write("no records\n")

    asyncio.run(run())
    return 0


def _dlq_show(args: argparse.Namespace, out: TextIO) -> int:
    dlq = _processors("dlq")

    async def run() -> dict[str, Any] | None:
        async with existing_log(args.db) as log:
            selection = dlq.ReplayFilter(record_ids=[args.record_id])
            async for record in dlq.iter_records(log.stream(args.path), selection=selection):
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
        out.write(_line(record) + "\n")
        return 0
    out.write(_record_line(record) + "\n")
    for key in ("attempts", "resource_id", "actor", "request_type", "offset", "dead_lettered_at"):
        if record.get(key) is not None:
            out.write(f"  {key}: {record[key]}\n")
    out.write(f"  payload: {_line(record['payload'])}\n")
    return 0


def _dlq_replay(args: argparse.Namespace, out: TextIO) -> int:
    dlq = _processors("dlq")
    event = dlq.replay_requested_event(
        record_ids=args.ids, origin=args.origin, operation=args.operation, requested_by=_by(args)
    )
    committed = _append(args, event)
    if not args.wait:
        if args.json:
            out.write(_line(committed.to_dict()) + "\n")
        else:
            out.write(
                f"replay requested at offset {committed.offset}; the DLQ processor appends "
                "dlq.replay-completed with the report\n"
            )
        return 0
    report = asyncio.run(_wait_report(args, committed.offset))
    if args.json:
        out.write(_line(report) + "\n")
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
                payload = _payload(event)
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

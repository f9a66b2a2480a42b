"""``streamkit tasks list|show|cancel``: the tasks processor's commands, a CLI plugin.

Registered through the ``streamkit.commands`` entry-point group; the core
command line never imports this package.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, TextIO

from streamkit.processors._cli_support import (
    Sub,
    add_common_flags,
    append_event,
    events_about,
    json_line,
    payload_of,
    read_snapshot,
    requested_by,
    write_traceback,
)
from streamkit.processors.tasks._events import TASK_EVENT_TYPES, cancel_requested_event
from streamkit.processors.tasks._processor import TasksProcessor

from streamkit import InvalidRequest, StreamEvent
from streamkit.cli import existing_log
from streamkit.events import format_timestamp

__all__ = ["add_tasks"]


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
    add_common_flags(q, json_help="print {offset, tasks, counts} as JSON")
    q.set_defaults(handler=_tasks_list)

    q = verbs.add_parser(
        "show",
        help="one task: its live state and its history",
        description="Print a task's live state (if it is live) and every task event about it in "
        "the log, oldest first.",
    )
    q.add_argument("task_id", help="the task id")
    add_common_flags(q, json_help="print {task_id, live, events} as JSON")
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
    add_common_flags(q, json_help="print the appended event as JSON")
    q.set_defaults(handler=_tasks_cancel)


def _need_tasks_state(args: argparse.Namespace) -> dict[str, Any]:
    snapshot = read_snapshot(args, "tasks", TasksProcessor.contract)
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
    # In request order (the state keeps its live tasks in a SharedMap's order).
    tasks = sorted((state.get("tasks") or {}).values(), key=lambda t: t.get("request_offset", 0))
    counts = state.get("counts") or {}
    if args.json:
        out.write(
            json_line({"offset": snapshot["offset"], "tasks": tasks, "counts": counts}) + "\n"
        )
        return 0
    summary = ", ".join(f"{k}={v}" for k, v in counts.items())
    out.write(f"{len(tasks)} live task(s) at offset {snapshot['offset']} ({summary})\n")
    for task in tasks:
        out.write(_task_line(task) + "\n")
    return 0


def _tasks_show(args: argparse.Namespace, out: TextIO) -> int:
    snapshot = read_snapshot(args, "tasks", TasksProcessor.contract)
    live = None
    if snapshot is not None and snapshot.get("state"):
        live = (snapshot["state"].get("tasks") or {}).get(args.task_id)

    async def run() -> list[StreamEvent]:
        async with existing_log(args.db) as log:
            return await events_about(log, args.path, TASK_EVENT_TYPES, "task_id", args.task_id)

    events = asyncio.run(run())
    if live is None and not events:
        raise InvalidRequest(
            f"no task {args.task_id!r} in {args.db!r} (path {args.path}); nothing was shown",
            details={"task_id": args.task_id},
        )
    if args.json:
        out.write(
            json_line(
                {"task_id": args.task_id, "live": live, "events": [e.to_dict() for e in events]}
            )
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
        payload = {k: v for k, v in payload_of(event).items() if k not in ("task_id", "traceback")}
        out.write(f"  {event.offset}  {event.type}  {json_line(payload)}\n")
        write_traceback(out, payload_of(event).get("traceback"))
    return 0


def _tasks_cancel(args: argparse.Namespace, out: TextIO) -> int:
    event = cancel_requested_event(
        args.task_id, reason=args.reason, requested_by=requested_by(args)
    )
    committed = append_event(args, event)
    if args.json:
        out.write(json_line(committed.to_dict()) + "\n")
    else:
        out.write(
            f"cancel requested for task {args.task_id} (offset {committed.offset}); the tasks "
            "processor records task.cancelled, or task.rejected if it is not live\n"
        )
    return 0

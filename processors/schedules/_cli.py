"""``streamkit schedules list|add|pause|resume|delete``: the schedules processor's commands.

Registered through the ``streamkit.commands`` entry-point group; the core
command line never imports this package. Every change is an event appended
through the running host when one answers (else to the log directly), so
the log records who changed what.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from streamkit.processors._cli_support import (
    Sub,
    add_common_flags,
    append_event,
    json_line,
    read_snapshot,
    requested_by,
)
from streamkit.processors.schedules._events import SCHEDULES_CONTRACT, ScheduleDefined
from streamkit.processors.schedules._requests import (
    Synced,
    backfill_event,
    defined_event,
    definitions,
    deleted_event,
    instant_of,
    paused_event,
    resumed_event,
    schedule_from_request,
    sync,
)
from streamkit.processors.schedules._rows import schedule_rows
from streamkit.processors.schedules._schedule import schedule_of

from streamkit import InvalidRequest, open_log
from streamkit.cli import existing_log
from streamkit.config import find_config, load_config

__all__ = ["add_schedules"]


def add_schedules(sub: Sub) -> None:
    """``streamkit schedules list|add|pause|resume|delete``."""
    p = sub.add_parser(
        "schedules",
        help="list, add, pause, resume and delete recurring schedules",
        description="Inspect and change the recurring schedules of streamkit.processors.schedules.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", parser_class=type(p))
    verbs.required = True

    q = verbs.add_parser(
        "list",
        help="each schedule: timing, next and last slot, fired and missed counts",
        description="Print every schedule with its timing, whether it is paused, the next slot, "
        "the last slot fired and how many slots fired and were missed, from the running host, "
        "else from the schedules processor's checkpoint.",
    )
    add_common_flags(q, json_help="print {offset, schedules} as JSON")
    q.set_defaults(handler=_list)

    q = verbs.add_parser(
        "add",
        help="define a schedule (or change the one of that name)",
        description="Append schedule.defined: the schedule fires its task at each slot from now "
        "on. A name already defined is changed (its record of fired and missed slots stays).",
    )
    q.add_argument("name", help="the schedule's name (letters, digits, ._:-)")
    timing = q.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", help='a cron expression, e.g. "0 3 * * *" or @daily')
    timing.add_argument("--every", help='an interval, e.g. "5m", "1h30m"')
    q.add_argument("--tz", default="UTC", help="the zone a --cron reads (default: UTC)")
    q.add_argument(
        "--gap",
        choices=["shift", "skip"],
        default="shift",
        help="a --cron wall time the clocks skip: fire at the gap's end (shift) or not (skip)",
    )
    q.add_argument(
        "--fold",
        choices=["first", "last"],
        default="first",
        help="a --cron wall time the clocks repeat: fire at its first or last occurrence",
    )
    action = q.add_mutually_exclusive_group(required=True)
    action.add_argument("--task", help="the task each slot requests")
    action.add_argument("--event", help="the type of the event each slot appends instead")
    q.add_argument("--args", default="{}", help="the task's arguments, a JSON object")
    q.add_argument("--payload", default="{}", help="--event: the event's payload, a JSON object")
    q.add_argument(
        "--catchup",
        choices=["skip", "latest", "all"],
        default="skip",
        help="slots that came due while nothing ran: skip them (default), run the latest, "
        "or run all",
    )
    q.add_argument("--window", help="how old a slot may be and still fire (policy default)")
    q.add_argument("--max-runs", type=int, default=100, help="the most slots fired at once")
    q.add_argument("--jitter", default="0s", help="a delay up to this, fixed per slot")
    q.add_argument(
        "--overlap",
        choices=["skip", "buffer_one", "buffer_all", "allow_all", "cancel_other"],
        default="skip",
        help="a slot while the last slot's task runs: miss it (skip, default), let it wait "
        "(buffer_one, buffer_all), fire anyway (allow_all), or cancel the running task",
    )
    q.add_argument(
        "--max-buffered", type=int, default=100, help="buffer_all: the most slots waiting"
    )
    q.add_argument("--by", help="who changed it (default: user@hostname)")
    add_common_flags(q, json_help="print the appended event as JSON")
    q.set_defaults(handler=_add)

    q = verbs.add_parser(
        "sync",
        help="define the [[schedules]] of streamkit.toml (at deploy)",
        description="Make the log define the [[schedules]] tables of the config file: append "
        "schedule.defined only for a schedule that is new or differs, and delete the ones the "
        "file does not name only with --prune. Run it once per deploy, from the deploy step: "
        "hosts never sync, so an older host of a rolling deploy cannot undo it.",
    )
    q.add_argument("--config", help="the config file (default: ./streamkit.toml)")
    q.add_argument(
        "--prune", action="store_true", help="delete the schedules the file does not name"
    )
    q.add_argument("--dry-run", action="store_true", help="append nothing; say what would change")
    q.add_argument("--by", help="who synced (default: user@hostname)")
    add_common_flags(q, json_help="print {added, changed, deleted, unchanged} as JSON")
    q.set_defaults(handler=_sync)

    q = verbs.add_parser(
        "backfill",
        help="fire the slots of a past range that did not fire",
        description="Append schedule.backfill-requested: the schedules processor fires each "
        "slot from --from to --to that did not fire (a slot that fired keeps its first "
        "firing), whatever runs, then records schedule.backfilled. At most 1,000 slots.",
    )
    q.add_argument("name", help="the schedule's name")
    q.add_argument("--from", dest="first", required=True, help="ISO 8601, e.g. 2026-05-01T00:00Z")
    q.add_argument("--to", dest="last", required=True, help="ISO 8601, at most now")
    q.add_argument("--by", help="who asked (default: user@hostname)")
    add_common_flags(q, json_help="print the appended event as JSON")
    q.set_defaults(handler=_backfill)

    for verb, what, maker in (
        ("pause", "its slots are recorded as missed until it is resumed", paused_event),
        ("resume", "slots after now fire again", resumed_event),
        ("delete", "it fires no more; its history stays on the log", deleted_event),
    ):
        q = verbs.add_parser(verb, help=f"{verb} a schedule", description=f"{verb}: {what}.")
        q.add_argument("name", help="the schedule's name")
        q.add_argument("--by", help="who changed it (default: user@hostname)")
        add_common_flags(q, json_help="print the appended event as JSON")
        q.set_defaults(handler=_change, maker=maker)


def _instant(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _timing_text(timing: dict[str, Any]) -> str:
    if "cron" in timing:
        return f"cron {timing['cron']!r} {timing.get('tz', 'UTC')}"
    return f"every {timing['every_seconds']:g}s"


def _action_text(definition: dict[str, Any]) -> str:
    action = definition["action"]
    if action.get("kind") == "append_event":
        return f"event {action.get('type')}"
    return f"task {action.get('name')}"


def _list(args: argparse.Namespace, out: TextIO) -> int:
    snapshot = read_snapshot(args, "schedules", SCHEDULES_CONTRACT)
    if snapshot is None:
        raise InvalidRequest(
            f"the schedules processor has no state in {args.db!r} yet (no running host answers "
            "and it has no checkpoint there); nothing was read; run it in `streamkit host` first",
            details={"db": args.db},
        )
    rows = schedule_rows(snapshot.get("state"))
    if args.json:
        out.write(json_line({"offset": snapshot["offset"], "schedules": rows}) + "\n")
        return 0
    out.write(f"{len(rows)} schedule(s) at offset {snapshot['offset']}\n")
    for row in rows:
        definition = row["definition"]
        state = "paused" if row.get("paused") else f"next {_instant(row['next_slot'])}"
        line = (
            f"{row['name']}  {_timing_text(definition['timing'])}  {_action_text(definition)}"
            f"  {state}  last {_instant(row.get('last_slot'))}"
            f"  fired {row.get('fired', 0)}  missed {row.get('missed', 0)}"
        )
        if row.get("running"):
            line += f"  running {len(row['running'])}"
        if row.get("buffered"):
            line += f"  waiting {len(row['buffered'])}"
        out.write(line + "\n")
    return 0


def _add(args: argparse.Namespace, out: TextIO) -> int:
    parsed: dict[str, Any] = {}
    for flag in ("args", "payload"):
        try:
            parsed[flag] = json.loads(getattr(args, flag))
        except json.JSONDecodeError as exc:
            raise InvalidRequest(
                f"--{flag} is not JSON ({exc}); nothing was appended", details={"field": flag}
            ) from exc
    fields: dict[str, Any] = {
        "name": args.name,
        "catchup": args.catchup,
        "max_runs": args.max_runs,
        "jitter": args.jitter,
        "overlap": args.overlap,
        "max_buffered": args.max_buffered,
    }
    if args.task is not None:
        fields.update(task=args.task, args=parsed["args"])
    else:
        fields.update(event=args.event, payload=parsed["payload"])
    if args.window is not None:
        fields["window"] = args.window
    if args.every is not None:
        fields["every"] = args.every
    else:
        fields.update(cron=args.cron, tz=args.tz, gap=args.gap, fold=args.fold)
    schedule = schedule_from_request(fields)
    committed = append_event(args, defined_event(schedule, by=requested_by(args)))
    if args.json:
        out.write(json_line(committed.to_dict()) + "\n")
    else:
        body = ScheduleDefined.model_validate(committed.to_dict()["payload"])
        out.write(
            f"schedule {body.name} defined (offset {committed.offset}): "
            f"{_timing_text(body.timing)}, "
            f"{f'task {args.task}' if args.task else f'event {args.event}'}, "
            f"catch-up {args.catchup}\n"
        )
    return 0


def _sync(args: argparse.Namespace, out: TextIO) -> int:
    found = Path(args.config) if args.config is not None else find_config(Path.cwd())
    if found is None:
        raise InvalidRequest(
            "no --config was given and there is no streamkit.toml in this directory; nothing "
            "was appended",
            details={"config": None},
        )
    config = load_config(found)
    schedules = []
    for index, fields in enumerate(config.schedules):
        try:
            schedules.append(schedule_from_request(fields))
        except InvalidRequest as exc:
            raise InvalidRequest(
                f"{found}: schedules[{index}] is refused: {exc.message}; nothing was appended",
                details={"config": str(found), "index": index},
            ) from exc
    db = args.db if args.db is not None else str(config.db)

    # On a fresh deploy sync may come first: it creates the log as an append would (a dry
    # run of a log not made yet reads an empty one and creates nothing).
    missing = db != ":memory:" and "://" not in db and not Path(db).exists()
    target = ":memory:" if missing and args.dry_run else db

    async def run() -> Synced:
        async with open_log(target) as log:
            return await sync(
                log.stream(args.path),
                schedules,
                prune=args.prune,
                dry_run=args.dry_run,
                by=requested_by(args),
            )

    synced = asyncio.run(run())
    if args.json:
        out.write(json_line(dataclasses.asdict(synced)) + "\n")
        return 0
    verb = "would be" if args.dry_run else "were"
    for label, names in (
        ("added", synced.added),
        ("changed", synced.changed),
        ("deleted", synced.deleted),
    ):
        out.write(f"{len(names)} {verb} {label}{': ' + ', '.join(names) if names else ''}\n")
    out.write(f"{len(synced.unchanged)} unchanged\n")
    return 0


def _backfill(args: argparse.Namespace, out: TextIO) -> int:
    async def defined() -> dict[str, ScheduleDefined]:
        async with existing_log(args.db) as log:
            return await definitions(log.stream(args.path))

    found = asyncio.run(defined())
    if args.name not in found:
        raise InvalidRequest(
            f"no schedule {args.name!r} is defined in {args.db!r} (path {args.path}); nothing "
            f"was appended; defined: {', '.join(sorted(found)) or 'none'}",
            details={"name": args.name},
        )
    schedule = schedule_of(found[args.name].model_dump(mode="json"))
    event = backfill_event(
        schedule,
        instant_of(args.first, "--from"),
        instant_of(args.last, "--to"),
        by=requested_by(args),
    )
    committed = append_event(args, event)
    if args.json:
        out.write(json_line(committed.to_dict()) + "\n")
    else:
        out.write(
            f"backfill of schedule {args.name} requested (offset {committed.offset}); the "
            "schedules processor records schedule.backfilled when it is done\n"
        )
    return 0


def _change(args: argparse.Namespace, out: TextIO) -> int:
    async def known() -> set[str]:
        async with existing_log(args.db) as log:
            return set(await definitions(log.stream(args.path)))

    names = asyncio.run(known())
    if args.name not in names:
        raise InvalidRequest(
            f"no schedule {args.name!r} is defined in {args.db!r} (path {args.path}); nothing "
            f"was appended; defined: {', '.join(sorted(names)) or 'none'}",
            details={"name": args.name},
        )
    committed = append_event(args, args.maker(args.name, by=requested_by(args)))
    if args.json:
        out.write(json_line(committed.to_dict()) + "\n")
    else:
        out.write(f"schedule {args.name}: {args.verb} recorded (offset {committed.offset})\n")
    return 0

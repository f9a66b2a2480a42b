"""``streamkit processor versions``, ``cutover``, ``rollback`` and ``forget``: a processor's versions.

Checkpoints are kept per contract version, one serving (see
:mod:`streamkit.checkpoint`). ``versions`` lists them from the database,
side by side with what the running hosts count for each (malformed
payloads, failures) and how the built version's state differs from the
serving one's; ``cutover`` asks the host that built a version in the shadow
(a manual cutover) to cut it over now; ``rollback`` lifts the retirement
of a version a cutover replaced, so that hosts running its code build it
from its kept checkpoint up to the serving cursor and cut back over (the
same fenced cutover as any). ``versions`` and ``rollback`` work on the
database directly, whether or not a host runs; ``cutover`` needs the host
that holds the built version. ``forget`` deletes the checkpoints of a
processor removed for good (or of one version), which otherwise hold its
path's history back from retention forever, with a control event in the log
saying who and why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any, TextIO

from streamkit.backends import host_store
from streamkit.checkpoint import ReduceCheckpoint, check_rollback
from streamkit.cli._args import existing_log, live_host_sockets
from streamkit.cli._common import add_db_flag, add_socket_flag, served
from streamkit.cli._retention_commands import operator
from streamkit.config import LeaseSettings
from streamkit.control import request_sync
from streamkit.engine import shown_tally
from streamkit.errors import InvalidRequest

__all__ = ["add_processor"]


def add_processor(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "processor",
        help="a processor's contract versions: list them, roll back to one",
        description="Each contract version of a processor keeps its own checkpoint; one "
        "serves. A new version builds in the shadow and cuts over; the version it replaced is "
        "kept, retired, and `rollback` makes it serve again.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    versions = verbs.add_parser(
        "versions",
        help="list a processor's versions: which serves, each cursor, which are retired",
        description="One line per contract version with a checkpoint: serving, building (in "
        "the shadow) or retired (replaced by a cutover), its cursor, where it became serving "
        "and where it was replaced. With a running host, also what each host counts for the "
        "version it runs (malformed payloads, reduce failures, failed batches, dropped "
        "events) and how each version's state differs from the serving one's (a JSON patch): "
        "what to compare before a manual cutover.",
    )
    versions.add_argument("slug", help="the processor's contract slug")
    add_db_flag(versions, required=True)
    add_socket_flag(versions)
    versions.add_argument(
        "--json",
        action="store_true",
        help="print JSON: the list of rows, or with a running host the whole comparison",
    )
    versions.set_defaults(handler=_cmd_versions)
    rollback = verbs.add_parser(
        "rollback",
        help="make a replaced version serve again",
        description="Lift the retirement of a version a cutover replaced. Hosts running its "
        "code then build it from its kept checkpoint up to the serving cursor (reduce only) "
        "and cut back over; the version serving now is retired in turn. Until a host running "
        "that version's code does so, the serving version keeps serving.",
    )
    rollback.add_argument("slug", help="the processor's contract slug")
    rollback.add_argument("--to", required=True, metavar="VERSION", help="the version to serve")
    add_db_flag(rollback, required=True)
    rollback.set_defaults(handler=_cmd_rollback)
    cutover = verbs.add_parser(
        "cutover",
        help="cut a version built in the shadow over now (a manual cutover)",
        description="For a processor whose new version waits for an operator's cutover "
        '(cutover = "manual"): the host that built it fences the serving version, reduces '
        "what it served since and makes the new version serving, in the same fenced "
        "transaction as an automatic cutover. Answers once committed, with the cutover "
        "offset. Asked while the build still runs, it cuts over as soon as it is built.",
    )
    cutover.add_argument("slug", help="the processor's contract slug")
    add_db_flag(cutover, required=True)
    cutover.add_argument("--path", help="the stream path (default: the host's)")
    cutover.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the cutover to commit (default 60)",
    )
    add_socket_flag(cutover)
    cutover.add_argument("--json", action="store_true", help="print the outcome as JSON")
    cutover.set_defaults(handler=_cmd_cutover)
    forget = verbs.add_parser(
        "forget",
        help="delete the checkpoints of a processor removed for good, so they hold no history",
        description="A processor's checkpoint rows hold its path's history back from "
        "retention (its cursor, its state's needs) whether it runs or not: an offline "
        "processor loses nothing. Once it is removed for good, forget it: its rows (or one "
        "version's) are deleted with a streamkit.processor-forgotten event on its path (who, "
        "why, what each version needed). Refused while a live host runs it.",
    )
    forget.add_argument("slug", help="the processor's contract slug")
    add_db_flag(forget, required=True)
    forget.add_argument("--version", help="forget this version only (default: every version)")
    forget.add_argument("--reason", required=True, help="why, for the record")
    forget.add_argument("--by", help="who decided (default: user@hostname)")
    forget.add_argument("--json", action="store_true", help="print the control event as JSON")
    forget.set_defaults(handler=_cmd_forget)


def _cmd_cutover(args: argparse.Namespace, out: TextIO) -> int:
    refusals: list[InvalidRequest] = []
    for socket in live_host_sockets(args.db, args.socket):
        try:
            done = request_sync(
                socket,
                "cutover",
                timeout=args.timeout + 10.0,
                slug=args.slug,
                path=args.path,
                within=args.timeout,
                db=served(args),
            )
        except InvalidRequest as exc:
            if exc.details.get("reason") != "not_building_here":
                raise
            refusals.append(exc)  # another host may hold the built version
            continue
        if args.json:
            out.write(json.dumps(done, separators=(",", ":")) + "\n")
        else:
            out.write(
                f"{args.slug}: version {done['version']} serves from offset {done['offset']} on "
                f"(version {done['from_version']} is retired; `streamkit processor rollback "
                f"{args.slug} --to {done['from_version']}` switches back)\n"
            )
        return 0
    raise InvalidRequest(
        f"processor {args.slug!r}: no running host builds a version of it in the shadow "
        f"({len(refusals)} host(s) asked); nothing was cut over; `streamkit status` shows "
        "which host rebuilds it, and whether it waits for a cutover",
        details={"slug": args.slug, "hosts_asked": len(refusals)},
    )


def _row(checkpoint: ReduceCheckpoint, tally: dict[str, Any] | None) -> dict[str, Any]:
    role = "serving" if checkpoint.serving else "retired" if checkpoint.retired_at else "building"
    return {
        "version": checkpoint.reducer_version,
        "role": role,
        "cursor": checkpoint.reduced_through_offset,
        "cutover_offset": checkpoint.cutover_offset,
        "retired_at": checkpoint.retired_at,
        "skipped": shown_tally(tally),
    }


def _cmd_versions(args: argparse.Namespace, out: TextIO) -> int:
    compared = _compared(args)
    if compared is not None:
        rows = compared["versions"]
    else:

        async def run() -> list[dict[str, Any]]:
            async with existing_log(args.db, read_only=True) as log:
                store = host_store(log)
                tallies = await store.version_incidents(args.slug)
                return [
                    _row(checkpoint, tallies.get(checkpoint.reducer_version))
                    for checkpoint in await store.checkpoint_versions(args.slug)
                ]

        rows = asyncio.run(run())
    if args.json:
        shown: Any = rows if compared is None else compared
        out.write(json.dumps(shown, separators=(",", ":")) + "\n")
        return 0
    if not rows:
        out.write(f"{args.slug}: no checkpoint in this log\n")
    for row in rows:
        line = f"{args.slug}  v{row['version']}  {row['role']}  cursor={row['cursor']}"
        if row["role"] == "serving":
            line += f"  since offset {row['cutover_offset']}"
        if row["retired_at"] is not None:
            line += f"  replaced at offset {row['retired_at']}"
        skipped = row["skipped"]
        line += "  skipped: " + " ".join(f"{name}={skipped[name]}" for name in _KEPT_COUNTS)
        out.write(line + "\n")
        _write_skipped(skipped, out)
    if compared is None:
        return 0
    out.write("counted by the running hosts:\n")
    for host in compared["hosts"]:
        if not host.get("reachable", True):
            out.write(f"  {host.get('socket')}  unreachable: {host.get('error')}\n")
            continue
        counts = "  ".join(f"{name}={host.get(name) or 0}" for name in _SHOWN_COUNTS)
        out.write(f"  {host['owner']}  v{host['version']}  {host['phase']}  {counts}\n")
    for row in rows:
        if "differences" not in row:
            continue
        out.write(
            f"v{row['version']}'s state differs from the serving one's in "
            f"{row['differences']} place(s)" + (":\n" if row["differences"] else "\n")
        )
        for operation in row["patch"]:
            value = json.dumps(operation.get("value"), separators=(",", ":"))
            shown_value = "" if operation["op"] == "remove" else f" {value[:120]}"
            out.write(f"  {operation['op']} {operation['path']}{shown_value}\n")
    return 0


def _write_skipped(skipped: dict[str, Any], out: TextIO) -> None:
    """Each skipped kind of a version's kept tally under its line, with its first offsets."""
    for kind in skipped["malformed_by_type"]:
        out.write(
            f"    malformed {kind['type']} v{kind['version']}: {kind['count']} "
            f"(first at {', '.join(map(str, kind['first_offsets']))})\n"
        )
    for kind in skipped["reduce_failures_by_type"]:
        out.write(
            f"    reduce raised on {kind['type']}: {kind['count']} "
            f"(first at {', '.join(map(str, kind['first_offsets']))})\n"
        )


_KEPT_COUNTS = ("malformed_payloads", "reduce_failures", "dropped_events")

_SHOWN_COUNTS = ("malformed_payloads", "reduce_failures", "batch_failures", "events_dropped")


def _compared(args: argparse.Namespace) -> dict[str, Any] | None:
    """The side-by-side view from a running host, or None if no host answers."""
    for socket in live_host_sockets(args.db, getattr(args, "socket", None)):
        try:
            compared: dict[str, Any] = request_sync(
                socket, "versions", slug=args.slug, db=served(args)
            )
        except InvalidRequest:
            continue  # a host that does not run the processor
        return compared
    return None


def _cmd_rollback(args: argparse.Namespace, out: TextIO) -> int:
    async def run() -> ReduceCheckpoint:
        async with existing_log(args.db) as log:
            store = host_store(log)
            serving, own = await store.version_rows(args.slug, args.to)
            check_rollback(args.slug, args.to, serving, own)
            await store.reinstate(args.slug, args.to)
            assert serving is not None  # a retired version was replaced by a serving one
            return serving

    serving = asyncio.run(run())
    out.write(
        f"version {args.to} of {args.slug} is reinstated: hosts running its code build it from "
        f"its checkpoint up to version {serving.reducer_version}'s cursor and cut over; version "
        f"{serving.reducer_version} serves until then\n"
    )
    return 0


def _cmd_forget(args: argparse.Namespace, out: TextIO) -> int:
    async def run() -> Any:
        async with existing_log(args.db) as log:
            return await host_store(log).retention.forget_processor(
                args.slug,
                args.version,
                by=operator(args),
                reason=args.reason,
                now=time.time(),
                ttl=LeaseSettings().ttl,
            )

    event = asyncio.run(run())
    if args.json:
        out.write(json.dumps(event.to_dict(), separators=(",", ":")) + "\n")
        return 0
    versions = ", ".join(v["version"] for v in event.payload["versions"])
    out.write(
        f"forgot {args.slug} (version {versions}): its checkpoints hold no history any more "
        f"(recorded at offset {event.offset} of {event.path})\n"
    )
    return 0

"""``streamkit retention horizon``, ``hold`` and ``release``: what a path's history must keep.

``horizon`` prints, per path, the lowest offset retention must keep and what
holds it there (a processor's cursor, its state's offset, its
``retain_from``, a hold, a processor with no checkpoint yet). ``hold`` and
``release`` place and end an operator's hold, each with a control event in
the log saying who and why. All three work on the database directly,
whether or not a host runs.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import platform
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from streamkit.backends import host_store
from streamkit.cli._args import existing_log, positive_int
from streamkit.cli._common import add_db_flag
from streamkit.errors import InvalidRequest
from streamkit.events import StreamEvent
from streamkit.history import RETENTION_CHUNK
from streamkit.holds import check_hold
from streamkit.horizon import Horizon, Need
from streamkit.records import RetentionRun

__all__ = ["add_retention", "add_verify", "operator", "retention_lines", "shown_need"]


def operator(args: argparse.Namespace) -> str:
    """Who runs the command, for the record: ``--by`` or ``user@hostname``."""
    by: str | None = getattr(args, "by", None)
    return by or f"{getpass.getuser()}@{platform.node()}"


def add_retention(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "retention",
        help="what each path's history must keep, and operators' holds on it",
        description="Events of a path may go only below its horizon: the least of what every "
        "processor known on the path still needs (running or not, shadow and retired "
        "versions too) and of every operator hold. See docs/retention.md.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    horizon = verbs.add_parser(
        "horizon",
        help="print each path's horizon and what holds it",
        description="One block per path: its head, its horizon (the lowest offset that must "
        "be kept) and every need on it, lowest first, the ones at the horizon marked.",
    )
    add_db_flag(horizon)
    horizon.add_argument("--path", help="one path only")
    horizon.add_argument("--json", action="store_true", help="print JSON")
    horizon.set_defaults(handler=_cmd_horizon)
    hold = verbs.add_parser(
        "hold",
        help="keep a path's history from an offset on, until released (or --until)",
        description="Place a named hold: retention keeps every event of PATH from --from on. "
        "Recorded as a streamkit.hold-placed event on the path (who, why).",
    )
    hold.add_argument("path", help="the stream path")
    hold.add_argument("name", help="the hold's name (unique on the path)")
    add_db_flag(hold)
    hold.add_argument("--from", dest="from_offset", type=positive_int, required=True)
    hold.add_argument(
        "--until", help="when it ends by itself: an ISO-8601 time (UTC if no zone is given)"
    )
    hold.add_argument("--reason", required=True, help="why, for the record")
    hold.add_argument("--by", help="who decided (default: user@hostname)")
    hold.add_argument("--json", action="store_true", help="print the control event as JSON")
    hold.set_defaults(handler=_cmd_hold)
    release = verbs.add_parser(
        "release",
        help="end a hold",
        description="Release a named hold; recorded as a streamkit.hold-released event.",
    )
    release.add_argument("path", help="the stream path")
    release.add_argument("name", help="the hold's name")
    add_db_flag(release)
    release.add_argument("--reason", required=True, help="why, for the record")
    release.add_argument("--by", help="who decided (default: user@hostname)")
    release.add_argument("--json", action="store_true", help="print the control event as JSON")
    release.set_defaults(handler=_cmd_release)
    run = verbs.add_parser(
        "run",
        help="take a path's history below its horizon: archived to segment files, or deleted",
        description="Take PATH's oldest events, through --through (default: all below the "
        "horizon), never at or past the horizon, in chunks that let appends go on between "
        "them. With --archive each chunk is written to a segment file in DIR (synced, read "
        "back and hashed, chained to the one before) before one transaction records it, "
        "deletes the rows and appends streamkit.truncated; with --delete the rows go with "
        "no archive. A read below the path's new start is refused with HISTORY_TRUNCATED.",
    )
    run.add_argument("path", help="the stream path")
    add_db_flag(run)
    mode = run.add_mutually_exclusive_group(required=True)
    mode.add_argument("--archive", metavar="DIR", help="the directory of the segment files")
    mode.add_argument("--delete", action="store_true", help="delete, keeping no archive")
    run.add_argument("--through", type=positive_int, help="take at most through this offset")
    run.add_argument(
        "--chunk", type=positive_int, default=RETENTION_CHUNK, help="events per transaction"
    )
    run.add_argument("--json", action="store_true", help="print what the run did as JSON")
    run.set_defaults(handler=_cmd_run)


def add_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="prove the archive: every segment file against its record, and the hash chain",
        description="With --archive: each path's recorded segments must follow on and name "
        "the one before by its SHA-256, and each file must be there, of its recorded size and "
        "hash (every byte is read) and say in its manifest what its record says. Prints each "
        "problem and exits 1 if there is one.",
    )
    add_db_flag(p)
    p.add_argument("--archive", action="store_true", required=True, help="verify the archive")
    p.add_argument("--path", help="one path's segments only")
    p.add_argument("--json", action="store_true", help='print {"segments": N, "problems": [...]}')
    p.set_defaults(handler=_cmd_verify)


def _cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    async def run() -> tuple[int, list[str]]:
        async with existing_log(args.db, read_only=True) as log:
            store = host_store(log)
            segments = await store.archive_segments(args.path)
            return len(segments), await store.verify_archive(args.path)

    count, problems = asyncio.run(run())
    if args.json:
        out.write(json.dumps({"segments": count, "problems": problems}) + "\n")
    else:
        for problem in problems:
            out.write(f"DAMAGED: {problem}\n")
        out.write(
            f"{count} segment(s) checked: "
            + (f"{len(problems)} problem(s)\n" if problems else "every byte as recorded\n")
        )
    return 1 if problems else 0


def shown_need(need: Need) -> str:
    """One need in words: ``processor tally@1 (serving): cursor, from 42``."""
    state = f" ({need.state})" if need.state else ""
    return f"{need.kind} {need.name}{state}: {need.why}, from {need.from_offset}"


def retention_lines(rows: list[dict[str, Any]] | None) -> list[str]:
    """``status``'s retention lines: per path its horizon and what holds it there."""
    if rows is None:
        return ["retention: unknown (the database did not answer)"]
    lines = ["retention:"] if rows else []
    for row in rows:
        held = "; ".join(
            f"{n['kind']} {n['name']}"
            + (f" ({n['state']})" if n.get("state") else "")
            + f": {n['why']}"
            for n in row["held_by"]
        )
        behind = row["head"] + 1 - row["horizon"]
        start = f"start {row['start']}, " if row.get("start", 1) > 1 else ""
        archived = (
            f"; archived {row['archived_segments']} segment(s), {row['archived_bytes']} bytes"
            if row.get("archived_segments")
            else ""
        )
        lines.append(
            f"  {row['path']}  {start}horizon {row['horizon']} of head {row['head']}"
            + (f", {behind} offsets kept, held by {held}" if held else ", nothing held")
            + archived
        )
    return lines


def _block(horizon: Horizon) -> str:
    taken = horizon.start > 1
    below = horizon.offset - horizon.start
    lines = [
        f"{horizon.path}  head {horizon.head}"
        + (f"  start {horizon.start}" if taken else "")
        + f"  horizon {horizon.offset}"
        + (f"  ({below} offsets below it may go)" if below > 0 else "  (nothing may go)")
        + (
            f"  archived {horizon.archived_segments} segment(s), {horizon.archived_bytes} bytes"
            if horizon.archived_segments
            else ""
        )
    ]
    holding = set(horizon.held_by)
    for need in horizon.needs:
        mark = "*" if need in holding else " "
        lines.append(f"  {mark} {shown_need(need)}")
    if not horizon.needs:
        lines.append("    nothing known on this path holds its history")
    return "\n".join(lines)


def _cmd_horizon(args: argparse.Namespace, out: TextIO) -> int:
    async def run() -> list[Horizon]:
        async with existing_log(args.db, read_only=True) as log:
            return await host_store(log).horizons(time.time(), args.path)

    found = asyncio.run(run())
    if args.json:
        out.write(json.dumps([h.to_dict() for h in found], separators=(",", ":")) + "\n")
    elif not found:
        out.write("no path holds events or checkpoints yet\n")
    else:
        out.write("\n".join(_block(h) for h in found) + "\n")
    return 0


def _until(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidRequest(
            f"--until {text!r} is not an ISO-8601 time (such as 2027-01-31T12:00:00Z); "
            "nothing was written",
            details={"until": text},
        ) from exc
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp()


def _said(event: StreamEvent, args: argparse.Namespace, out: TextIO, text: str) -> int:
    if args.json:
        out.write(json.dumps(event.to_dict(), separators=(",", ":")) + "\n")
    else:
        out.write(f"{text} (recorded at offset {event.offset} of {event.path})\n")
    return 0


def _cmd_hold(args: argparse.Namespace, out: TextIO) -> int:
    now = time.time()
    hold = check_hold(
        args.path, args.name, args.from_offset, _until(args.until), operator(args), args.reason, now
    )

    async def run() -> StreamEvent:
        async with existing_log(args.db) as log:
            return await host_store(log).place_hold(hold)

    event = asyncio.run(run())
    until = "" if hold.until is None else f" until {args.until}"
    return _said(
        event,
        args,
        out,
        f"hold {hold.name!r} keeps {hold.path} from offset {hold.from_offset}{until}",
    )


def _cmd_release(args: argparse.Namespace, out: TextIO) -> int:
    async def run() -> StreamEvent:
        async with existing_log(args.db) as log:
            return await host_store(log).release_hold(
                args.path, args.name, by=operator(args), reason=args.reason
            )

    event = asyncio.run(run())
    return _said(event, args, out, f"hold {args.name!r} on {args.path} is released")


def _cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    archive = None if args.archive is None else os.path.abspath(args.archive)

    async def run() -> RetentionRun:
        async with existing_log(args.db) as log:
            return await host_store(log).run_retention(
                args.path, through=args.through, archive=archive, chunk=args.chunk
            )

    done = asyncio.run(run())
    if args.json:
        out.write(json.dumps(done.to_dict(), separators=(",", ":")) + "\n")
        return 0
    taken = "archived" if done.mode == "archive" else "deleted"
    out.write(
        f"{done.path}: {taken} {done.events} events in {done.chunks} chunk(s); it starts at "
        f"offset {done.start_after} (horizon {done.horizon})"
        + (f", {len(done.segments)} segment(s), {done.bytes} bytes" if done.segments else "")
        + (
            f"; gave {done.pages_reclaimed} page(s) back to the file system"
            if done.pages_reclaimed
            else ""
        )
        + "\n"
    )
    for orphan in done.orphans_removed:
        out.write(f"removed {orphan}: a segment no row recorded (an interrupted run's)\n")
    return 0

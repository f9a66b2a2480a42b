"""``streamkit retention`` and ``verify --archive``: what a path's history must keep, and taking it.

``horizon`` prints, per path, the lowest offset retention must keep and what
holds it there (a processor's cursor, its state's offset, its
``retain_from``, a hold, a processor with no checkpoint yet). ``hold`` and
``release`` place and end an operator's hold, and ``keys`` shows or sets how
long a path's idempotency keys answer once their events are taken, each
change with a control event in the log saying who and why. ``run`` takes
history below the horizon. All work on the database directly, whether or not
a host runs.
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
from pathlib import Path
from typing import Any, TextIO

from streamkit.backends import host_store
from streamkit.cli._args import existing_log, non_negative_int, positive_int
from streamkit.cli._common import add_db_flag, db_from_config
from streamkit.config import RetentionPolicy, config_from_args, find_config, seconds_of
from streamkit.errors import InvalidRequest
from streamkit.events import StreamEvent
from streamkit.history import RETENTION_CHUNK
from streamkit.holds import check_hold
from streamkit.horizon import Horizon, Need
from streamkit.key_window import KeyWindow
from streamkit.records import RetentionRun

__all__ = [
    "add_retention",
    "add_verify",
    "kept_for_words",
    "operator",
    "policy_lines",
    "retention_lines",
    "shown_need",
]


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
    keys = verbs.add_parser(
        "keys",
        help="show or set how long a path's idempotency keys answer after their events go",
        description="A key answers retries as long as its event is in the log, and after "
        "retention takes the event: forever by default. --keep-for gives PATH a key window "
        "instead: keys of taken events older than it are forgotten by the path's next "
        "retention run, and a retry after that appends anew. --forever restores the default. "
        "Recorded as a streamkit.key-window-set event on the path (who, why). Without "
        "--keep-for or --forever, prints the window.",
    )
    keys.add_argument("path", help="the stream path")
    add_db_flag(keys)
    window = keys.add_mutually_exclusive_group()
    window.add_argument(
        "--keep-for",
        metavar="DURATION",
        help='remember keys of taken events this long ("30d", "12h", or seconds; at least 1h)',
    )
    window.add_argument("--forever", action="store_true", help="remember them forever")
    keys.add_argument("--reason", help="why, for the record (required to set)")
    keys.add_argument("--by", help="who decided (default: user@hostname)")
    keys.add_argument("--json", action="store_true", help="print JSON")
    keys.set_defaults(handler=_cmd_keys)
    run = verbs.add_parser(
        "run",
        help="take a path's history below its horizon: archived to segment files, or deleted",
        description="Take PATH's oldest events, through --through (default: all below the "
        "horizon), never at or past the horizon, and keeping what --keep-for and --keep-last "
        "say, in chunks that let appends go on between them. With --archive each chunk is "
        "written to a segment file in DIR (synced, read back and hashed, chained to the one "
        "before) before one transaction records it, deletes the rows and appends "
        "streamkit.truncated; with --delete the rows go with no archive. A read below the "
        "path's new start is refused with HISTORY_TRUNCATED. Without PATH, every "
        "[[retention]] policy of the config (./streamkit.toml, or --config) runs once.",
    )
    run.add_argument("path", nargs="?", help="the stream path (default: the config's policies)")
    run.add_argument(
        "--db", help="the log: a SQLite file or a postgresql:// URL; default: the db of the config"
    )
    run.add_argument("--config", metavar="FILE", help="the streamkit.toml of the policies")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--archive", metavar="DIR", help="the directory of the segment files")
    mode.add_argument("--delete", action="store_true", help="delete, keeping no archive")
    run.add_argument("--through", type=positive_int, help="take at most through this offset")
    run.add_argument(
        "--keep-for",
        metavar="DURATION",
        help='keep the events younger than this ("90d", "12h", "30m", or seconds)',
    )
    run.add_argument(
        "--keep-last", type=non_negative_int, metavar="N", help="keep the newest N offsets"
    )
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
            segments = await store.retention.segments(args.path)
            return len(segments), await store.retention.verify_archive(args.path)

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
        if row.get("keys_kept_for") is not None:
            archived += f"; keys kept {kept_for_words(row['keys_kept_for'])}"
        below = row["horizon"] - row.get("start", 1)
        may = (
            f"{below} offset(s) below the horizon may be taken"
            if below > 0
            else "nothing may be taken yet: every event is at or above the horizon"
        )
        lines.append(
            f"  {row['path']}  {start}horizon {row['horizon']} of head {row['head']}: {may}"
            + (f"; {behind} offsets kept, held by {held}" if held else "; nothing held")
            + archived
        )
    return lines


def policy_lines(job: dict[str, Any] | None) -> list[str]:
    """``status``'s lines of the ``[[retention]]`` policies: who runs them, each one's last run."""
    if job is None:
        return []
    holder = job["holder"]
    lines = [
        f"retention policies: run every {job['interval']:g} s by "
        + (holder if holder is not None else "nobody yet (no host holds the retention lease)")
    ]
    for record in job["policies"]:
        keep = []
        if record["keep_for"] is not None:
            keep.append(f"keep {record['keep_for']:g} s")
        if record["keep_last"] is not None:
            keep.append(f"keep last {record['keep_last']}")
        where = f"archive to {record['archive']}" if record["mode"] == "archive" else "delete"
        run = record["last_run"]
        last = (
            "not run yet"
            if run is None
            else f"last run took {run['events']} (stopped by {run['stopped_by']})"
        )
        error = record["last_error"]
        failed = (
            f"; FAILING ({record['failures']} failure(s)): {error['message']} [{error['code']}]"
            if error is not None
            else ""
        )
        lines.append(
            f"  {record['path']}  {', '.join(keep)}, {where}; {record['runs']} run(s), "
            f"{record['events_taken']} events taken; {last}{failed}"
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
        + (
            f"  keys kept {kept_for_words(horizon.keys_kept_for)}"
            if horizon.keys_kept_for is not None
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
            return await host_store(log).retention.horizons(time.time(), args.path)

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
            return await host_store(log).retention.place_hold(hold)

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
            return await host_store(log).retention.release_hold(
                args.path, args.name, by=operator(args), reason=args.reason
            )

    event = asyncio.run(run())
    return _said(event, args, out, f"hold {args.name!r} on {args.path} is released")


def kept_for_words(keep_for: float | None) -> str:
    """A key window in words: ``forever`` or ``30d`` / ``12h`` / ``3600 s``."""
    if keep_for is None:
        return "forever"
    for unit, seconds in (("d", 86_400), ("h", 3_600)):
        if keep_for % seconds == 0:
            return f"{keep_for / seconds:g}{unit}"
    return f"{keep_for:g} s"


def _duration(flag: str, text: str) -> float:
    try:
        return seconds_of(text)
    except ValueError as exc:  # pydantic's refusal of the text, in words
        raise InvalidRequest(
            f"{flag} {text!r} is not a duration: write a number of seconds or one with a unit "
            '("45s", "30m", "12h", "90d", "2w"); nothing was written'
        ) from exc


def _cmd_keys(args: argparse.Namespace, out: TextIO) -> int:
    setting = args.forever or args.keep_for is not None
    if setting and not args.reason:
        raise InvalidRequest(
            "setting a key window needs --reason (it goes into the log with who set it); "
            "nothing was written"
        )
    keep_for = None if args.keep_for is None else _duration("--keep-for", args.keep_for)

    async def run() -> StreamEvent | KeyWindow | None:
        async with existing_log(args.db, read_only=not setting) as log:
            retention = host_store(log).retention
            if not setting:
                return await retention.key_window(args.path)
            return await retention.set_key_window(
                args.path, keep_for, by=operator(args), reason=args.reason, now=time.time()
            )

    found = asyncio.run(run())
    if isinstance(found, StreamEvent):
        words = kept_for_words(keep_for)
        return _said(found, args, out, f"keys of taken events of {args.path} answer {words}")
    if args.json:
        shown = {"path": args.path, "keep_for": None} if found is None else found.to_dict()
        out.write(json.dumps(shown, separators=(",", ":")) + "\n")
    elif found is None:
        out.write(f"{args.path}: keys answer forever (no key window set)\n")
    else:
        out.write(
            f"{args.path}: keys of taken events answer {kept_for_words(found.keep_for)}, then "
            f"a retention run forgets them (set by {found.set_by}: {found.reason!r})\n"
        )
    return 0


def _policies(args: argparse.Namespace) -> tuple[str, list[RetentionPolicy]]:
    """The log and the policies a run takes: PATH's from the flags, or the config's."""
    if args.path is not None:
        if not args.archive and not args.delete:
            raise InvalidRequest(
                "retention run PATH needs --archive DIR or --delete; nothing was written"
            )
        keep_for = None if args.keep_for is None else _duration("--keep-for", args.keep_for)
        policy = RetentionPolicy.model_construct(
            path=args.path,
            keep_for=keep_for,
            keep_last=args.keep_last,
            archive=None if args.archive is None else Path(os.path.abspath(args.archive)),
            delete=bool(args.delete),
            chunk=args.chunk,
        )
        return args.db or db_from_config(args.config), [policy]
    flags = [
        flag
        for flag, given in (
            ("--archive", args.archive),
            ("--delete", args.delete),
            ("--through", args.through),
            ("--keep-for", args.keep_for),
            ("--keep-last", args.keep_last),
        )
        if given
    ]
    if flags:
        raise InvalidRequest(
            f"{', '.join(flags)} need a PATH: without one the config's [[retention]] policies "
            "run as written; nothing was written"
        )
    found = Path(args.config) if args.config is not None else find_config(Path.cwd())
    if found is None:
        raise InvalidRequest(
            "retention run without PATH runs the config's [[retention]] policies, and there is "
            "no streamkit.toml here; pass PATH with --archive or --delete, or --config FILE; "
            "nothing was written"
        )
    config = config_from_args(config=found, db=args.db)
    if not config.retention:
        raise InvalidRequest(
            f"{str(found)!r} has no [[retention]] policy; nothing was written",
            details={"config": str(found)},
        )
    return str(config.db), list(config.retention)


def _cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    db, policies = _policies(args)

    async def run() -> list[RetentionRun]:
        async with existing_log(db) as log:
            store = host_store(log)
            # No pauses (share 1): this process has no appends of its own to leave the
            # writer to, and it cannot see another process's (docs/retention.md).
            return [
                await store.retention.run(policy.ask(through=args.through, share=1.0))
                for policy in policies
            ]

    for done in asyncio.run(run()):
        _said_run(done, args, out)
    return 0


def _said_run(done: RetentionRun, args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        out.write(json.dumps(done.to_dict(), separators=(",", ":")) + "\n")
        return
    taken = "archived" if done.mode == "archive" else "deleted"
    out.write(
        f"{done.path}: {taken} {done.events} events in {done.chunks} chunk(s); it starts at "
        f"offset {done.start_after} (horizon {done.horizon}, stopped by {done.stopped_by})"
        + (f", {len(done.segments)} segment(s), {done.bytes} bytes" if done.segments else "")
        + (f"; forgot {done.keys_forgotten} key(s)" if done.keys_forgotten else "")
        + (
            f"; gave {done.pages_reclaimed} page(s) back to the file system"
            if done.pages_reclaimed
            else ""
        )
        + "\n"
    )
    for orphan in done.orphans_removed:
        out.write(f"removed {orphan}: a segment no row recorded (an interrupted run's)\n")

"""The ``streamkit`` command line: a thin layer over the Python API.

Every command maps to one API call, prints data as text or, with ``--json``,
as JSON (one object per line for streams of events), and on failure prints
``Error: ...`` to stderr and exits 1. Nothing is written when a command is
refused. Commands:

- ``streamkit append``: append one event to a stream of a log file.
- ``streamkit read``: read a stream's events, optionally following new ones.
- ``streamkit host``: run processors over a log file (the daemon).
- ``streamkit status``: where each processor is (cursor, head, lag, lease, claim, errors).
- ``streamkit snapshot``: a processor's reduced state.
- ``streamkit watch``: a processor's live state, as a seed and then patches.
- ``streamkit skip``: move a stalled processor past one event.
- commands that packages register in the ``streamkit.commands`` entry-point group
  (``streamkit tasks`` and ``streamkit dlq`` come from the first-party processors).

When a host is running on the log (its control socket answers), ``append``
and ``read --follow`` go through it, so ephemeral events reach live
subscribers; otherwise they use the file directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import platform
import shlex
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from streamkit import __version__
from streamkit._targets import sqlite_target
from streamkit.backends import host_store, open_log
from streamkit.cli._args import (
    existing_log,
    host_socket_for,
    json_object,
    live_host_sockets,
    non_negative_int,
    positive_int,
    positive_seconds,
)
from streamkit.cli._plugins import add_plugin_commands
from streamkit.config import add_host_arguments, config_from_namespace, find_config, load_config
from streamkit.control._control import ControlClient, request_sync
from streamkit.errors import (
    ControlUnavailable,
    InvalidConfig,
    InvalidRequest,
    SlowConsumer,
    StreamkitError,
)
from streamkit.events import StreamEvent, format_timestamp
from streamkit.host._host import ProcessorHost
from streamkit.host._logging import configure_logging
from streamkit.live_state import LIVE_STATE_CHANGED

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace, TextIO], int]


def _socket_of(args: argparse.Namespace) -> str:
    socket: str | None = getattr(args, "socket", None)
    return socket if socket is not None else args.db + ".sock"


def _db_from_config() -> str:
    """The ``db`` of ``./streamkit.toml`` (as the host reads it), for a command given no --db."""
    found = find_config(Path.cwd())
    if found is None:
        raise InvalidRequest(
            "no --db was given and there is no streamkit.toml in this directory to name one; "
            "pass --db FILE; nothing was done"
        )
    return str(load_config(found).db)


def _served(args: argparse.Namespace) -> str:
    """The database a request to a host means: a host on another one refuses it."""
    return os.path.realpath(str(args.db))


def _live_socket(args: argparse.Namespace, slug: str | None = None) -> str | None:
    """The checked control socket of a host running on ``--db`` (the one running ``slug``)."""
    return host_socket_for(args.db, getattr(args, "socket", None), slug)


def _add_socket_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--socket",
        help="the host's control socket (default: the db path + .sock)",
    )


def _format_event(event: StreamEvent) -> str:
    payload = event.to_dict()["payload"]
    tag = " (ephemeral)" if event.ephemeral else ""
    return f"{event.offset}  {event.type}{tag}  {json.dumps(payload, separators=(',', ':'))}"


def _emit(event: StreamEvent, args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        out.write(json.dumps(event.to_dict(), separators=(",", ":")) + "\n")
    else:
        out.write(_format_event(event) + "\n")
    out.flush()


# -- append -----------------------------------------------------------------


def _add_append(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "append",
        help="append one event to a stream",
        description="Append one durable event to a stream of a log file (created if missing). "
        "Prints the committed event; an idempotent retry prints the event already committed.",
    )
    p.add_argument("type", help="the event type, e.g. task.requested")
    p.add_argument("--db", help="the SQLite log file; default: the db of ./streamkit.toml")
    p.add_argument("--path", default="/", help="the stream path (default: /)")
    p.add_argument("--payload", type=json_object("--payload"), help="the payload, a JSON object")
    p.add_argument("--metadata", type=json_object("--metadata"), help="the metadata, a JSON object")
    p.add_argument("--idempotency-key", help="retry-safe key: same key + same body appends once")
    p.add_argument(
        "--expect-offset",
        type=positive_int,
        help="refuse unless the event lands at exactly this offset (a stale-view guard)",
    )
    p.add_argument(
        "--expect-head",
        type=non_negative_int,
        help="refuse unless the last durable offset is exactly N (nothing appended since)",
    )
    p.add_argument(
        "--ephemeral",
        action="store_true",
        help="push to live subscribers without writing (needs a running host)",
    )
    _add_socket_flag(p)
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=10.0,
        help="seconds to wait for a running host's reply (default 10)",
    )
    p.add_argument("--json", action="store_true", help="print the committed event as JSON")
    p.set_defaults(handler=_cmd_append)


def _cmd_append(args: argparse.Namespace, out: TextIO) -> int:
    event: dict[str, Any] = {"type": args.type}
    if args.payload is not None:
        event["payload"] = args.payload
    if args.metadata is not None:
        event["metadata"] = args.metadata
    if args.idempotency_key is not None:
        event["idempotency_key"] = args.idempotency_key
    if args.expect_offset is not None:
        event["offset"] = args.expect_offset
    if args.ephemeral:
        event["ephemeral"] = True
    socket = _live_socket(args)
    if socket is not None:
        if not args.ephemeral and "idempotency_key" not in event:
            # A host frozen past the timeout may still apply the request later, so a
            # plain retry could append it twice: this invocation's own key makes the
            # printed retry command append it at most once.
            event["idempotency_key"] = f"cli/{uuid.uuid4().hex}"
        try:
            (data,) = request_sync(
                socket,
                "append",
                path=args.path,
                events=[event],
                timeout=args.timeout,
                db=_served(args),
                **({} if args.expect_head is None else {"expect_head": args.expect_head}),
            )
        except ControlUnavailable as exc:
            raise _append_in_doubt(args, event, exc) from exc
        _emit(StreamEvent(**data), args, out)
        return 0
    if args.ephemeral:
        raise ControlUnavailable(
            f"--ephemeral needs a running host on {args.db!r} (no control socket answers at "
            f"{_socket_of(args)!r}): an ephemeral event reaches only the subscribers of the "
            "process that appends it; nothing was appended; start `streamkit host` first"
        )

    async def run() -> StreamEvent:
        async with open_log(args.db) as log:
            (committed,) = await log.stream(args.path).append(event, expect_head=args.expect_head)
            return committed

    _emit(asyncio.run(run()), args, out)
    return 0


def _append_in_doubt(
    args: argparse.Namespace, event: dict[str, Any], exc: ControlUnavailable
) -> ControlUnavailable:
    """The refusal of an append whose outcome is unknown: how to retry it safely, how to check."""
    key = event.get("idempotency_key")
    if key is None:  # ephemeral: never stored, nothing to retry safely or to look up
        return ControlUnavailable(
            f"{exc.message}; the ephemeral event may or may not have been pushed",
            details=dict(exc.details),
        )
    argv: list[str] = list(getattr(args, "argv", None) or [])
    if argv and "--idempotency-key" not in argv:
        argv += ["--idempotency-key", key]
    retry = shlex.join(["streamkit", *argv]) if argv else None
    return ControlUnavailable(
        f"{exc.message}; the append may still land (the host may be frozen or overloaded). It "
        f"carries idempotency key {key!r}, so running it again with that key appends it at most "
        "once and prints the committed event"
        + (f": {retry}" if retry else "")
        + f"; to check without appending: streamkit read --db {shlex.quote(args.db)} --path "
        f"{shlex.quote(args.path)} --json (look for that idempotency_key)",
        details={**exc.details, "idempotency_key": key},
    )


# -- read -------------------------------------------------------------------


def _add_read(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "read",
        help="read a stream's events",
        description="Print the durable events of a stream after an offset. With --follow, "
        "keep printing new events as they are committed (by any process) until interrupted.",
    )
    p.add_argument(
        "--db", help="the SQLite log file (must exist); default: the db of ./streamkit.toml"
    )
    p.add_argument("--path", default="/", help="the stream path (default: /)")
    p.add_argument(
        "--after", type=non_negative_int, default=0, help="start after this offset (default: 0)"
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help="print at most this many events (default: all; with --follow, stop after N)",
    )
    p.add_argument("--follow", action="store_true", help="keep following new events")
    _add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.set_defaults(handler=_cmd_read)


def _cmd_read(args: argparse.Namespace, out: TextIO) -> int:
    socket = _live_socket(args) if args.follow else None
    if socket is not None:
        return _read_follow_through(socket, args, out)

    async def run() -> None:
        printed = 0
        limit: int | None = args.limit
        async with existing_log(args.db) as log:
            stream = log.stream(args.path)
            if args.follow:
                async for events, _range in stream.follow(args.after):
                    for event in events:
                        if event.ephemeral:
                            continue
                        _emit(event, args, out)
                        printed += 1
                        if limit is not None and printed >= limit:
                            return
                return
            after = args.after
            while limit is None or printed < limit:
                page_size = 500 if limit is None else min(500, limit - printed)
                page = await stream.read(after, page_size)
                for event in page.events:
                    _emit(event, args, out)
                printed += len(page.events)
                after = page.scanned_through_offset
                if page.at_head:
                    return

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


def _read_follow_through(socket: str, args: argparse.Namespace, out: TextIO) -> int:
    """``read --follow`` through a running host: its ephemerals are printed too.

    Live-state deltas are left out: every processor emits one per batch, and
    ``streamkit watch`` is the way to follow them.
    """

    async def run() -> None:
        printed = 0
        after = args.after
        while True:
            watch = ControlClient(socket).watch(
                "follow", path=args.path, after=after, db=_served(args)
            )
            try:
                async for data in watch:
                    if not data.get("ephemeral"):
                        after = max(after, int(data["offset"]))
                    if data.get("type") == LIVE_STATE_CHANGED:
                        continue  # one per processor per batch: `streamkit watch` shows them
                    _emit(StreamEvent(**data), args, out)
                    if not data.get("ephemeral"):
                        printed += 1
                    if args.limit is not None and printed >= args.limit:
                        return
                return
            except SlowConsumer as exc:
                # Fell too far behind the host: resume from the last durable event
                # printed (the ephemerals meanwhile are gone, and we say so).
                after = int(exc.details.get("resume_after", after))
                sys.stderr.write(f"note: {exc.message}\n")
            finally:
                await watch.aclose()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


# -- host -------------------------------------------------------------------


def _add_host(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "host",
        help="run processors over a log file (the daemon)",
        description="Run the processors named in a streamkit.toml or by --processor over a log "
        "file until SIGTERM or SIGINT (a second signal exits at once). The current directory "
        "is importable, so --processor mymodule:MyProcessor finds ./mymodule.py.",
    )
    add_host_arguments(p)
    p.set_defaults(handler=_cmd_host)


def _cmd_host(args: argparse.Namespace, out: TextIO) -> int:

    config = config_from_namespace(args)
    if not config.processors:
        raise InvalidConfig(
            "no processors to run: name them with --processor MODULE:CLASS or in the "
            "[[processors]] list of streamkit.toml; nothing was started"
        )
    # Like other Python app servers: the directory you start in is importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    file = args.config if args.config is not None else find_config(Path.cwd())
    if file is not None:
        # One rule for every relative path in the file: db and socket are resolved
        # against its directory already, and running there makes the processors'
        # own settings (an outbox path, say) follow the same rule.
        os.chdir(Path(file).resolve().parent)
    # Build the host (import and check every processor) before logging is set up, so a
    # refused configuration leaves no trace but its error line.
    host = ProcessorHost(config)
    configure_logging(config.resolved_log_format())
    asyncio.run(host.run())
    return 0


# -- status -----------------------------------------------------------------


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="where each processor is",
        description="Print each processor's slug, version, path, state, cursor, head, lag, "
        "lease, claim and errors. Asks the running host (which adds stalled processors, "
        "rates and latencies); with no host, reads what the database says.",
    )
    p.add_argument(
        "--db", help="the SQLite log file (must exist); default: the db of ./streamkit.toml"
    )
    _add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print the status as one JSON object")
    p.set_defaults(handler=_cmd_status)


def _cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    answers = [
        request_sync(socket, "status", db=_served(args))
        for socket in live_host_sockets(args.db, getattr(args, "socket", None))
    ]
    if answers:
        status = _merged_status(answers)
    else:

        async def run() -> list[dict[str, Any]]:
            async with existing_log(args.db) as log:
                return await host_store(log).durable_status()

        status = {"host": None, "hosts": [], "processors": asyncio.run(run())}
    if args.json:
        out.write(json.dumps(status, separators=(",", ":")) + "\n")
        return 0
    hosts = status["hosts"]
    if not hosts:
        out.write("host: not running (from the database)\n")
    for host in hosts:
        out.write(f"host: {host['owner']} (pid {host['pid']}), up {host['uptime']:.0f} s\n")
    for row in status["processors"]:
        out.write(_status_line(row, bool(hosts)) + "\n")
    return 0


def _merged_status(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """One status from every live host: each processor's row from the host holding its lease.

    ``host`` is the host holding the most leases (first when none does);
    ``hosts`` lists every one that answered.
    """
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    held: dict[str, int] = {}
    for answer in answers:
        owner = answer["host"]["owner"]
        for row in answer["processors"]:
            key = (row["path"], row["slug"])
            if row.get("lease_held_here"):
                held[owner] = held.get(owner, 0) + 1
                rows[key] = {**row, "host": owner}
            else:
                rows.setdefault(key, {**row, "host": owner})
    hosts = sorted((a["host"] for a in answers), key=lambda h: -held.get(h["owner"], 0))
    ordered = sorted(rows.values(), key=lambda r: (r["path"], r["slug"]))
    return {"host": hosts[0], "hosts": hosts, "processors": ordered}


def _status_line(row: dict[str, Any], live: bool) -> str:
    lease = row.get("lease")
    if lease is None:
        lease_text = "none"
    elif lease.get("released"):
        lease_text = f"released (gen {lease['generation']})"
    elif lease.get("held"):
        here = " here" if row.get("lease_held_here") else f" by {lease['owner']}"
        lease_text = f"held{here} (gen {lease['generation']})"
    else:
        lease_text = f"expired (gen {lease['generation']})"
    due = row.get("claim_due")
    parts = [
        f"{row['slug']}",
        f"v{row['version']}" if row.get("version") is not None else "v?",
        f"path={row['path']}",
    ]
    if live:
        parts.append(f"state={row['state']}")
    parts += [
        f"cursor={row['cursor']}",
        f"head={row['head']}",
        f"lag={row['lag']}",
        f"lease={lease_text}",
        f"claim={'-' if due is None else _format_time(due)}",
    ]
    if live:
        latency = row.get("latency_ms") or {}
        parts.append(f"rate={row.get('events_per_second', 0)}/s")
        if latency.get("samples"):
            parts.append(f"p50={latency['p50']}ms p99={latency['p99']}ms")
        if row.get("stalled"):
            parts.append(f"STALLED at offset {row['stalled_at']}")
        for count, last, label in (
            ("malformed_payloads", "last_malformed", "malformed payloads skipped"),
            ("reduce_failures", "last_reduce_failure", "reduce failures"),
        ):
            if row.get(count):
                seen = row.get(last) or {}
                parts.append(
                    f"{label}={row[count]} (last at offset {seen.get('offset')}, "
                    f"{seen.get('type')}: {seen.get('error')})"
                )
        error = row.get("last_error")
        if error is not None and row.get("failures"):
            parts.append(f"failures={row['failures']} error={error['error']}")
        elif error is not None and error.get("code") == "LEASE_LOST" and row["state"] == "waiting":
            # Why a processor that ran here stopped: the lease went to another host
            # (or this one was frozen past its ttl).
            parts.append(f"lease lost: {error['error']}")
    return "  ".join(parts)


def _format_time(epoch: float) -> str:

    return format_timestamp(epoch)


# -- snapshot ---------------------------------------------------------------


def _add_snapshot(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "snapshot",
        help="a processor's reduced state",
        description="Print a processor's reduced state and the offset it is reduced through: "
        "live from the running host, else from its checkpoint in the database.",
    )
    p.add_argument("slug", help="the processor's contract slug")
    p.add_argument(
        "--db", help="the SQLite log file (must exist); default: the db of ./streamkit.toml"
    )
    p.add_argument("--path", help="the stream path, if the host runs the slug on several")
    _add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print {offset, state, source} as JSON")
    p.set_defaults(handler=_cmd_snapshot)


def _cmd_snapshot(args: argparse.Namespace, out: TextIO) -> int:
    socket = _live_socket(args, args.slug)
    if socket is not None:
        snapshot = request_sync(
            socket, "snapshot", slug=args.slug, path=args.path, db=_served(args)
        )
    else:

        async def run() -> dict[str, Any]:
            async with existing_log(args.db) as log:
                return await host_store(log).stored_snapshot(args.slug)

        snapshot = asyncio.run(run())
    if args.json:
        out.write(json.dumps(snapshot, separators=(",", ":")) + "\n")
    else:
        out.write(f"offset {snapshot['offset']} ({snapshot['source']})\n")
        out.write(json.dumps(snapshot["state"], indent=2, sort_keys=True) + "\n")
    return 0


# -- watch ------------------------------------------------------------------


def _add_watch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "watch",
        help="follow a processor's live state",
        description="Print a processor's live state from the running host: a seed "
        "(revision and state), then each JSON patch as it happens, until interrupted. A "
        "gap in the revisions prints a fresh seed.",
    )
    p.add_argument("slug", help="the processor's contract slug")
    p.add_argument(
        "--db", help="the SQLite log file the host runs on; default: the db of ./streamkit.toml"
    )
    p.add_argument("--path", help="the stream path, if the host runs the slug on several")
    p.add_argument(
        "--limit", type=positive_int, default=None, help="stop after N lines (seeds and patches)"
    )
    _add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.set_defaults(handler=_cmd_watch)


def _cmd_watch(args: argparse.Namespace, out: TextIO) -> int:
    # Checked like every other command; with no host there the client says so.
    socket = _live_socket(args, args.slug) or _socket_of(args)

    async def run() -> None:
        printed = 0
        watch = ControlClient(socket).watch(
            "watch", slug=args.slug, path=args.path, db=_served(args)
        )
        try:
            async for item in watch:
                if args.json:
                    out.write(json.dumps(item, separators=(",", ":")) + "\n")
                elif item.get("kind") == "seed":
                    state = json.dumps(item["state"], separators=(",", ":"), sort_keys=True)
                    out.write(f"seed rev={item['rev']}  {state}\n")
                else:
                    patch = json.dumps(item["patch"], separators=(",", ":"))
                    out.write(f"patch {item['from']}->{item['to']}  {patch}\n")
                out.flush()
                printed += 1
                if args.limit is not None and printed >= args.limit:
                    return
        finally:
            await watch.aclose()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


# -- skip -------------------------------------------------------------------


def _add_skip(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "skip",
        help="move a stalled processor past one event",
        description="Hide the event at --offset from one processor, so a processor stalled on "
        "it moves on. The decision is recorded as a durable streamkit.event-skipped event "
        "(who, why) on the stream. Through the running host if there is one, else written "
        "to the database for the next host to apply.",
    )
    p.add_argument("slug", help="the processor's contract slug")
    p.add_argument(
        "--db", help="the SQLite log file (must exist); default: the db of ./streamkit.toml"
    )
    p.add_argument("--offset", type=positive_int, required=True, help="the event to skip")
    p.add_argument("--path", help="the stream path (default: the host's; / without a host)")
    p.add_argument("--by", help="who decided (default: user@hostname)")
    p.add_argument("--reason", default="", help="why, for the record")
    _add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print the skip event as JSON")
    p.set_defaults(handler=_cmd_skip)


def _cmd_skip(args: argparse.Namespace, out: TextIO) -> int:
    by = args.by or f"{getpass.getuser()}@{platform.node()}"
    socket = _live_socket(args, args.slug)
    if socket is not None:
        data = request_sync(
            socket,
            "skip",
            slug=args.slug,
            offset=args.offset,
            by=by,
            reason=args.reason,
            path=args.path,
            db=_served(args),
        )
        event = StreamEvent(**data)
    else:

        async def run() -> StreamEvent:
            async with existing_log(args.db) as log:
                return await host_store(log).record_skip(
                    args.path or "/", args.slug, args.offset, by=by, reason=args.reason
                )

        event = asyncio.run(run())
    if args.json:
        _emit(event, args, out)
    else:
        out.write(
            f"skipped offset {args.offset} for {args.slug} (recorded at offset {event.offset})\n"
        )
    return 0


# -- entry point ------------------------------------------------------------

_COMMANDS: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    _add_append,
    _add_read,
    _add_host,
    _add_status,
    _add_snapshot,
    _add_watch,
    _add_skip,
)


def refusal_line(message: str, code: str) -> str:
    """The one shape of every refusal the command line prints: ``Error: <message> [CODE]``."""
    return f"Error: {message} [{code}]\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own usage errors, in our shape
        self.print_usage(sys.stderr)
        self.exit(1, refusal_line(f"{message}; nothing was run", InvalidRequest.code))


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (used by ``main`` and by the docs test of every command)."""
    parser = _Parser(
        prog="streamkit",
        description="streamkit: event-sourced stream processing over a durable SQLite log.",
    )
    parser.add_argument("--version", action="version", version=f"streamkit {__version__}")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser
    )
    sub.required = True
    for add in _COMMANDS:
        add(sub)
    add_plugin_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit code (0 on success, 1 on a refusal)."""
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    args.argv = raw  # for messages that print a command to re-run
    handler: Handler = args.handler
    try:
        if getattr(args, "db", "") is None and args.command != "host":
            args.db = _db_from_config()
        if isinstance(getattr(args, "db", None), str):
            args.db = sqlite_target(args.db)  # every --db takes a target: sqlite://PATH too
        return handler(args, out or sys.stdout)
    except StreamkitError as exc:
        sys.stderr.write(refusal_line(exc.message, exc.code))
        return 1
    except BrokenPipeError:
        # The reader went away (`streamkit read | head`): nothing is wrong, so no
        # traceback; stdout is pointed at /dev/null so the interpreter's final
        # flush cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

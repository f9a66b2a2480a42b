"""``streamkit host``, ``status``, ``snapshot``, ``watch`` and ``skip``: the host's commands.

Each talks to the running host over its control socket when one answers,
else reads (or, for ``skip``, writes) the log's file through its backend.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, TextIO

from streamkit.backends import host_store
from streamkit.cli._args import (
    existing_log,
    live_host_sockets,
    positive_int,
    stored_snapshot,
)
from streamkit.cli._common import (
    add_db_flag,
    add_socket_flag,
    cwd_importable,
    emit,
    live_socket,
    served,
    socket_of,
)
from streamkit.cli._heap import freeze_start_up_heap
from streamkit.cli._retention_commands import policy_lines, retention_lines
from streamkit.config import HostConfig, add_host_arguments, config_from_namespace, find_config
from streamkit.control import ControlClient, request_sync
from streamkit.errors import (
    InvalidConfig,
)
from streamkit.events import StreamEvent, format_timestamp
from streamkit.host import HostService, ProcessorHost, configure_logging

__all__ = ["add_host", "add_skip", "add_snapshot", "add_status", "add_watch"]


# -- host -------------------------------------------------------------------


def add_host(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "host",
        help="run processors over a log (the daemon)",
        description="Run the processors named in a streamkit.toml or by --processor over a log "
        "(a SQLite file or a PostgreSQL database) until SIGTERM or SIGINT; a second signal, "
        "half a second or more after the first, exits at once. The current directory "
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
    cwd_importable()
    file = args.config if args.config is not None else find_config(Path.cwd())
    if file is not None:
        # One rule for every relative path in the file: db and socket are resolved
        # against its directory already, and running there makes the processors'
        # own settings (an outbox path, say) follow the same rule.
        os.chdir(Path(file).resolve().parent)
    # Build the host (import and check every processor) before logging is set up, so a
    # refused configuration leaves no trace but its error line.
    host = ProcessorHost(config, services=_services(config))
    configure_logging(config.resolved_log_format())
    freeze_start_up_heap()
    asyncio.run(host.run())
    return 0


def _services(config: HostConfig) -> list[HostService]:
    """What the host serves beside its socket: the HTTP surface when ``http`` is set."""
    if config.http is None:
        return []
    try:
        # The web extra (Starlette, uvicorn, prometheus-client): a plain install lacks it.
        from streamkit.web import HttpService
    except ImportError as exc:
        raise InvalidConfig(
            f"--http (or http = in streamkit.toml) needs the web extra, which is not installed "
            f"({exc.name} is missing): pip install 'streamkit-events[web]'; nothing was started",
            details={"missing": exc.name},
        ) from exc
    return [HttpService(config.http)]


# -- status -----------------------------------------------------------------


def add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="where each processor is",
        description="Print each processor's slug, version, path, state, cursor, head, lag, "
        "lease, claim and errors. Asks the running host (which adds stalled processors, "
        "rates and latencies); with no host, reads what the database says.",
    )
    add_db_flag(p)
    add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print the status as one JSON object")
    p.set_defaults(handler=_cmd_status)


def _cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    answers = [
        request_sync(socket, "status", db=served(args))
        for socket in live_host_sockets(args.db, getattr(args, "socket", None))
    ]
    if answers:
        status = _merged_status(answers)
    else:

        async def run() -> dict[str, Any]:
            async with existing_log(args.db) as log:
                store = host_store(log)
                return {
                    "host": None,
                    "hosts": [],
                    "processors": await store.durable_status(),
                    "retention": [h.to_dict() for h in await store.retention.horizons(time.time())],
                }

        status = asyncio.run(run())
    if args.json:
        out.write(json.dumps(status, separators=(",", ":")) + "\n")
        return 0
    hosts = status["hosts"]
    if not hosts:
        out.write("host: not running (from the database)\n")
    for host in hosts:
        ended = host.get("frozen_sessions_ended") or 0
        frozen = f", ended {ended} frozen database session(s)" if ended else ""
        out.write(f"host: {host['owner']} (pid {host['pid']}), up {host['uptime']:.0f} s{frozen}\n")
    database = status.get("database") or {}
    if not database.get("reachable", True):
        out.write(f"database: UNREACHABLE ({database.get('error')})\n")
    for row in status["processors"]:
        out.write(_status_line(row, bool(hosts), several=len(hosts) > 1) + "\n")
    for line in retention_lines(status.get("retention")):
        out.write(line + "\n")
    for line in policy_lines(status.get("retention_job")):
        out.write(line + "\n")
    return 0


def _merged_status(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """One status from every live host: each processor's row from the host holding its lease.

    A row's ``host`` is the owner that runs the processor (the lease holder,
    wherever it runs; None when nobody holds it). ``host`` of the status is
    the host holding the most leases (first when none does); ``hosts`` lists
    every one that answered.
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
                # Run elsewhere (a host on another machine, say): the lease says by whom.
                lease = row.get("lease") or {}
                runs = lease.get("owner") if lease.get("held") else None
                rows.setdefault(key, {**row, "host": runs})
    hosts = sorted((a["host"] for a in answers), key=lambda h: -held.get(h["owner"], 0))
    ordered = sorted(rows.values(), key=lambda r: (r["path"], r["slug"]))
    unreachable = [
        a["database"] for a in answers if not a.get("database", {}).get("reachable", True)
    ]
    database = unreachable[0] if unreachable else {"reachable": True, "error": None}
    # Read from the database, so any host's answer is everyone's (None: it did not answer).
    retention = next((a["retention"] for a in answers if a.get("retention") is not None), None)
    # The policies' runs are known to the host holding the retention lease.
    jobs = [a["retention_job"] for a in answers if a.get("retention_job") is not None]
    job = next((j for j in jobs if j["holds_lease"]), jobs[0] if jobs else None)
    return {
        "host": hosts[0],
        "hosts": hosts,
        "database": database,
        "processors": ordered,
        "retention": retention,
        "retention_job": job,
    }


def _status_line(row: dict[str, Any], live: bool, *, several: bool = False) -> str:
    """One processor's line; with ``several`` hosts answering, "here" would name none of them."""
    lease = row.get("lease")
    if lease is None:
        lease_text = "none"
    elif lease.get("released"):
        lease_text = f"released (gen {lease['generation']})"
    elif lease.get("held"):
        mine = row.get("lease_held_here") and not several
        here = " here" if mine else f" by {lease['owner']}"
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
        if row.get("phase") not in (None, "serving"):
            parts.append(_phase_text(row))
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
        if row.get("unserved"):
            parts.append(f"UNSERVED: {row['unserved']['text']}")
        if row.get("cannot_build"):
            stopped = row["cannot_build"]
            parts.append(f"CANNOT-BUILD: {stopped['reason']} ({stopped['advice']})")
        if row.get("stalled"):
            parts.append(f"STALLED at offset {row['stalled_at']}")
        for count, last, label in (
            ("malformed_payloads", "last_malformed", "malformed payloads skipped"),
            ("reduce_failures", "last_reduce_failure", "reduce failures skipped"),
        ):
            if row.get(count):
                seen = row.get(last) or {}
                parts.append(
                    f"{label}={row[count]} (last at offset {seen.get('offset')}, "
                    f"{seen.get('type')}: {seen.get('error')})"
                )
        for kind in row.get("malformed_by_type") or ():
            offsets = ",".join(str(offset) for offset in kind["first_offsets"])
            parts.append(
                f"malformed[{kind['type']} v{kind['version']}]={kind['count']} (first at {offsets})"
            )
        for key, value in (row.get("summary") or {}).items():
            parts.append(f"{key}={value}")
        if row.get("dropped_events"):
            parts.append(f"dropped={row['dropped_events']} (an upcaster returned DROP)")
        for problem in (row.get("schema_check") or {}).get("problems") or ():
            parts.append(f"schema check at start: {problem['text']}")
        ahead = row.get("ahead_of_code")
        if ahead:
            parts.append(
                f"cannot read offset {ahead.get('offset')} ({ahead.get('type')} "
                f"v{ahead.get('stored')}, this code knows v{ahead.get('version')}): "
                "left to a host with newer code"
            )
        if row.get("stopped_at") is not None:
            code = (row.get("last_error") or {}).get("code")
            parts.append(f"stopped before offset {row['stopped_at']} ({code})")
        if row.get("refusing_cancel"):
            names = "; ".join(row["refusing_cancel"])
            parts.append(f"refusing_cancel={len(row['refusing_cancel'])} ({names})")
        error = row.get("last_error")
        if error is not None and row.get("failures"):
            parts.append(f"failures={row['failures']} error={error['error']}")
        elif error is not None and error.get("code") == "LEASE_LOST" and row["state"] == "waiting":
            # Why a processor that ran here stopped: the lease went to another host
            # (or this one was frozen past its ttl).
            parts.append(f"lease lost: {error['error']}")
    return "  ".join(parts)


def _phase_text(row: dict[str, Any]) -> str:
    """``rebuilding 120,000/300,000 at 95,000 ev/s, eta 2 s`` (or ``catching-up ...``)."""
    progress = row.get("progress") or {}
    if row["phase"] == "awaiting-cutover":
        held = progress.get("cutover_held")
        if held:
            return f"awaiting-cutover at {progress.get('through', 0):,} (HELD: {held})"
        return (
            f"awaiting-cutover at {progress.get('through', 0):,} (built; version "
            f"{row.get('serving_version')} serves; `streamkit processor cutover "
            f"{row['slug']}` switches)"
        )
    text = f"{row['phase']} {progress.get('through', 0):,}/{progress.get('target', 0):,}"
    rate = progress.get("events_per_second")
    if rate:
        text += f" at {rate:,.0f} ev/s"
    eta = progress.get("eta_seconds")
    if eta is not None:
        text += f", eta {eta:g} s"
    gave_way = progress.get("gave_way_seconds")
    if gave_way:
        text += f", gave way {gave_way:g} s to serving work"
    serving = row.get("serving_version")
    if (
        row["phase"] == "rebuilding"
        and serving not in (None, row.get("version"))
        and not row.get("unserved")  # said only while a live host serves it
    ):
        text += f" (version {serving} serves meanwhile)"
    return text


def _format_time(epoch: float) -> str:

    return format_timestamp(epoch)


# -- snapshot ---------------------------------------------------------------


def add_snapshot(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "snapshot",
        help="a processor's reduced state",
        description="Print a processor's reduced state and the offset it is reduced through: "
        "live from the running host, else from its checkpoint in the database.",
    )
    p.add_argument("slug", help="the processor's contract slug")
    add_db_flag(p)
    p.add_argument("--path", help="the stream path, if the host runs the slug on several")
    add_socket_flag(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print {offset, state, source} as JSON (from a checkpoint: version, cursor too)",
    )
    p.set_defaults(handler=_cmd_snapshot)


def _cmd_snapshot(args: argparse.Namespace, out: TextIO) -> int:
    socket = live_socket(args, args.slug)
    if socket is not None:
        snapshot = request_sync(socket, "snapshot", slug=args.slug, path=args.path, db=served(args))
    else:

        async def run() -> dict[str, Any]:
            async with existing_log(args.db) as log:
                return await stored_snapshot(log, args.slug, args.path)

        snapshot = asyncio.run(run())
    if args.json:
        out.write(json.dumps(snapshot, separators=(",", ":")) + "\n")
    else:
        lag = ""
        cursor = snapshot.get("cursor")
        if cursor is not None and cursor != snapshot["offset"]:
            lag = f"; cursor {cursor}, the events after the offset are reduced again at start"
        if snapshot.get("stale"):
            lag += (
                f"; STALE: version {snapshot.get('version')} serves while version "
                f"{snapshot.get('building_version')} is built"
            )
        out.write(f"offset {snapshot['offset']} ({snapshot['source']}{lag})\n")
        out.write(json.dumps(snapshot["state"], indent=2, sort_keys=True) + "\n")
    return 0


# -- watch ------------------------------------------------------------------


def add_watch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "watch",
        help="follow a processor's live state",
        description="Print a processor's live state from the running host: a seed "
        "(revision and state), then each JSON patch as it happens, until interrupted. A "
        "gap in the revisions prints a fresh seed.",
    )
    p.add_argument("slug", help="the processor's contract slug")
    p.add_argument(
        "--db",
        help="the log the host runs on: a SQLite file or a postgresql:// URL; default: the db of ./streamkit.toml",
    )
    p.add_argument("--path", help="the stream path, if the host runs the slug on several")
    p.add_argument(
        "--limit", type=positive_int, default=None, help="stop after N lines (seeds and patches)"
    )
    add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.set_defaults(handler=_cmd_watch)


def _cmd_watch(args: argparse.Namespace, out: TextIO) -> int:
    # Checked like every other command; with no host there the client says so.
    socket = live_socket(args, args.slug) or socket_of(args)

    async def run() -> None:
        printed = 0
        watch = ControlClient(socket).watch(
            "watch", slug=args.slug, path=args.path, db=served(args)
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


def add_skip(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "skip",
        help="move a stalled processor past one event",
        description="Hide the event at --offset from one processor, so a processor stalled on "
        "it moves on. The decision is recorded as a durable streamkit.event-skipped event "
        "(who, why) on the stream. Through the running host if there is one, else written "
        "to the database for the next host to apply.",
    )
    p.add_argument("slug", help="the processor's contract slug")
    add_db_flag(p)
    p.add_argument("--offset", type=positive_int, required=True, help="the event to skip")
    p.add_argument("--path", help="the stream path (default: the host's; / without a host)")
    p.add_argument("--by", help="who decided (default: user@hostname)")
    p.add_argument("--reason", default="", help="why, for the record")
    p.add_argument(
        "--ahead",
        action="store_true",
        help="skip an event other than the one the processor is stalled at (its next event "
        "when it is not stalled): refused without it",
    )
    add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print the skip event as JSON")
    p.set_defaults(handler=_cmd_skip)


def _cmd_skip(args: argparse.Namespace, out: TextIO) -> int:
    by = args.by or f"{getpass.getuser()}@{platform.node()}"
    socket = live_socket(args, args.slug)
    if socket is not None:
        data = request_sync(
            socket,
            "skip",
            slug=args.slug,
            offset=args.offset,
            by=by,
            reason=args.reason,
            path=args.path,
            ahead=args.ahead,
            db=served(args),
        )
        event = StreamEvent(**data)
    else:

        async def run() -> StreamEvent:
            async with existing_log(args.db) as log:
                return await host_store(log).record_skip(
                    args.path or "/",
                    args.slug,
                    args.offset,
                    by=by,
                    reason=args.reason,
                    ahead=args.ahead,
                )

        event = asyncio.run(run())
    if args.json:
        emit(event, args, out)
    else:
        payload = event.payload if isinstance(event.payload, dict) else {}
        out.write(
            f"skipped offset {args.offset} ({payload.get('type')}) for {args.slug} (recorded "
            f"at offset {event.offset})\n"
        )
    return 0

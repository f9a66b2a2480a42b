"""What the command-line plugins of the first-party processors share.

``streamkit tasks`` and ``streamkit dlq`` drive their processors the way a
user would: by appending request events and by reading state and the log. An
append goes through the running host's control socket when one answers on
``--db`` (so its engines see it at once), else to the file directly; reads use
the file (readers never block the host).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import platform
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from streamkit import InvalidRequest, Log, ProcessorContract, StreamEvent
from streamkit.cli import existing_log, host_socket_for, served_log, stored_snapshot
from streamkit.control import request_sync

__all__ = [
    "Sub",
    "add_common_flags",
    "append_event",
    "events_about",
    "json_line",
    "payload_of",
    "read_snapshot",
    "requested_by",
    "write_traceback",
]

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Sub = Any


def host_socket_of(args: argparse.Namespace, slug: str | None = None) -> str | None:
    """The socket of the live host serving ``--db`` (and ``slug``), or None when none answers."""
    return host_socket_for(args.db, args.socket, slug)


def add_common_flags(p: argparse.ArgumentParser, *, json_help: str) -> None:
    """``--db``, ``--path``, ``--socket`` and ``--json``, as every verb of these commands has."""
    p.add_argument(
        "--db",
        help="the log (must exist): a SQLite file or a postgresql:// URL; default: the db of ./streamkit.toml",
    )
    p.add_argument("--path", default="/", help="the stream path (default: /)")
    p.add_argument("--socket", help="the host's control socket (default: the db path + .sock)")
    p.add_argument("--json", action="store_true", help=json_help)


def append_event(args: argparse.Namespace, event: dict[str, Any]) -> StreamEvent:
    """Append ``event`` through the live host when one answers, else to the file."""
    socket = host_socket_of(args)
    if socket is not None:
        (data,) = request_sync(
            socket, "append", path=args.path, events=[event], db=served_log(args.db)
        )
        return StreamEvent(**data)

    async def run() -> StreamEvent:
        async with existing_log(args.db) as log:
            (committed,) = await log.stream(args.path).append(event)
            return committed

    return asyncio.run(run())


def read_snapshot(
    args: argparse.Namespace, slug: str, contract: ProcessorContract[Any]
) -> dict[str, Any] | None:
    """The processor's state from the host, else its checkpoint; None if it never ran.

    The state is restored through ``contract``'s model and shown whole: a
    checkpoint leaves out the fields at their defaults (``compact_state``), and
    a reader of raw JSON would find them missing. (A checkpoint of another
    version of the processor is shown as stored.)
    """
    socket = host_socket_of(args, slug)
    snapshot: dict[str, Any] | None
    if socket is not None:
        try:
            snapshot = dict(
                request_sync(socket, "snapshot", slug=slug, path=args.path, db=served_log(args.db))
            )
        except Exception:
            return None
    else:

        async def run() -> dict[str, Any] | None:
            async with existing_log(args.db) as log:
                try:
                    return await stored_snapshot(log, slug)
                except InvalidRequest:
                    return None

        snapshot = asyncio.run(run())
    if (
        snapshot is not None
        and snapshot.get("state") is not None
        and snapshot.get("version", contract.version) == contract.version
    ):
        snapshot["state"] = contract.restored_json(snapshot["state"])
    return snapshot


def payload_of(event: StreamEvent) -> dict[str, Any]:
    payload = event.to_dict()["payload"]
    return payload if isinstance(payload, dict) else {}


def requested_by(args: argparse.Namespace) -> str:
    by: str | None = args.by
    return by or f"{getpass.getuser()}@{platform.node()}"


def json_line(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def write_traceback(out: TextIO, excerpt: object, indent: str = "    ") -> None:
    """Print a kept traceback excerpt under what it belongs to, indented; nothing if none."""
    if not isinstance(excerpt, str) or not excerpt:
        return
    out.write(f"{indent[:-2]}traceback:\n")
    for line in excerpt.rstrip("\n").splitlines():
        out.write(f"{indent}{line}\n")


async def events_about(
    log: Log, path: str, types: Iterable[str], key: str, value: str
) -> list[StreamEvent]:
    wanted = set(types)
    found: list[StreamEvent] = []
    after = 0
    stream = log.stream(path)
    while True:
        page = await stream.read(after, 500)
        found += [e for e in page.events if e.type in wanted and payload_of(e).get(key) == value]
        after = page.scanned_through_offset
        if page.at_head:
            return found

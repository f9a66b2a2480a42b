"""What the core commands share: where the host's socket is, the db from the config, output.

A command finds a live host on ``--db`` (``--socket`` to name one), falls
back to ``./streamkit.toml`` for the db, and prints events one line each (or
as JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from streamkit._targets import default_socket
from streamkit.cli._args import (
    host_socket_for,
    served_log,
)
from streamkit.config import find_config, load_config
from streamkit.errors import (
    InvalidRequest,
)
from streamkit.events import StreamEvent

__all__ = [
    "Handler",
    "add_socket_flag",
    "cwd_importable",
    "db_from_config",
    "emit",
    "format_event",
    "live_socket",
    "served",
    "socket_of",
]

Handler = Callable[[argparse.Namespace, TextIO], int]


def cwd_importable() -> None:
    """Make the directory the command runs in importable, as Python app servers do.

    What ``--processor module:Class`` (and ``read --as module:Class``) name is
    looked up there first.
    """
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def socket_of(args: argparse.Namespace) -> str:
    socket: str | None = getattr(args, "socket", None)
    return socket if socket is not None else default_socket(args.db)


def db_from_config(config: str | None = None) -> str:
    """The ``db`` of ``config`` or ``./streamkit.toml`` (as the host reads it), for a command
    given no --db."""
    found = Path(config) if config is not None else find_config(Path.cwd())
    if found is None:
        raise InvalidRequest(
            "no --db was given and there is no streamkit.toml in this directory to name one; "
            "pass --db FILE; nothing was done"
        )
    return str(load_config(found).db)


def served(args: argparse.Namespace) -> str:
    """The log a request to a host means: a host on another one refuses it."""
    return served_log(str(args.db))


def live_socket(args: argparse.Namespace, slug: str | None = None) -> str | None:
    """The checked control socket of a host running on ``--db`` (the one running ``slug``)."""
    return host_socket_for(args.db, getattr(args, "socket", None), slug)


def add_db_flag(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    """``--db``: the log a command works on; without ``required``, the config's db by default."""
    shown = "the log (must exist): a SQLite file or a postgresql:// URL"
    p.add_argument(
        "--db",
        required=required,
        help=shown if required else f"{shown}; default: the db of ./streamkit.toml",
    )


def add_socket_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--socket",
        help="the host's control socket (default: the db path + .sock)",
    )


def format_event(event: StreamEvent, *, timestamp: bool = False) -> str:
    """``offset  [created_at  ]type  payload``: one line of an event for people."""
    payload = event.to_dict()["payload"]
    tag = " (ephemeral)" if event.ephemeral else ""
    when = f"{event.created_at}  " if timestamp and event.created_at else ""
    return f"{event.offset}  {when}{event.type}{tag}  {json.dumps(payload, separators=(',', ':'))}"


def emit(
    event: StreamEvent,
    args: argparse.Namespace,
    out: TextIO,
    *,
    replayed: bool = False,
    timestamp: bool = False,
) -> None:
    """Print one event; ``replayed``: an append's idempotent hit, said as such.

    With ``args.shown`` (``read --as``) the event is printed as that processor reads
    it, with a note when it was lifted or cannot be read.
    """
    note: dict[str, Any] | None = None
    shown = getattr(args, "shown", None)
    if shown is not None:
        event, note = shown(event)
    if args.json:
        data = event.to_dict()
        if replayed:
            data["replayed"] = True
        if note is not None:
            data["upcast"] = note
        out.write(json.dumps(data, separators=(",", ":")) + "\n")
    elif note is not None:
        said = (
            f"from {note['from_type']} v{note['from_version']}"
            if "from_type" in note
            else f"unreadable: {note['unreadable']}"
        )
        out.write(f"{format_event(event, timestamp=timestamp)}  ({said})\n")
    elif replayed:
        out.write(
            f"{format_event(event, timestamp=timestamp)}  (already committed at {event.offset} by an earlier call "
            "with this idempotency key; nothing was appended)\n"
        )
    else:
        out.write(format_event(event, timestamp=timestamp) + "\n")
    out.flush()

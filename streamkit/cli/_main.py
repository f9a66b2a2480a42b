"""The ``streamkit`` command line: a thin layer over the Python API.

Every command maps to one API call, prints data as text or, with ``--json``,
as JSON (one object per line for streams of events), and on failure prints
``Error: ...`` to stderr and exits 1. Nothing is written when a command is
refused. Commands:

- ``streamkit append``: append one event to a stream of a log.
- ``streamkit read``: read a stream's events, optionally following new ones.
- ``streamkit host``: run processors over a log (the daemon).
- ``streamkit status``: where each processor is (cursor, head, lag, lease, claim, errors).
- ``streamkit snapshot``: a processor's reduced state.
- ``streamkit watch``: a processor's live state, as a seed and then patches.
- ``streamkit skip``: move a stalled processor past one event.
- ``streamkit schema check``: can processors' code read everything the log stores
  (``schema recount`` counts the summary it reads again).
- commands that packages register in the ``streamkit.commands`` entry-point group
  (``streamkit tasks`` and ``streamkit dlq`` come from the first-party processors).

When a host is running on the log (its control socket answers), ``append``
and ``read --follow`` go through it, so ephemeral events reach live
subscribers; otherwise they use the log directly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from streamkit import __version__
from streamkit._targets import is_postgres_target, sqlite_target
from streamkit.cli._admin_command import add_admin
from streamkit.cli._common import Handler, db_from_config
from streamkit.cli._host_commands import add_host, add_skip, add_snapshot, add_status, add_watch
from streamkit.cli._log_commands import add_append, add_read
from streamkit.cli._plugins import add_plugin_commands
from streamkit.cli._processor_commands import add_processor
from streamkit.cli._retention_commands import add_retention, add_verify
from streamkit.cli._schema_commands import add_schema
from streamkit.errors import (
    InvalidRequest,
    StreamkitError,
)

__all__ = ["build_parser", "main", "refusal_line"]

# -- entry point ------------------------------------------------------------

_COMMANDS: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    add_append,
    add_read,
    add_host,
    add_status,
    add_snapshot,
    add_watch,
    add_skip,
    add_admin,
    add_schema,
    add_processor,
    add_retention,
    add_verify,
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
        description=(
            "streamkit: event-sourced stream processing over a durable log "
            "(a SQLite file, or PostgreSQL)."
        ),
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
            args.db = db_from_config(getattr(args, "config", None))
        if isinstance(getattr(args, "db", None), str) and not is_postgres_target(args.db):
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

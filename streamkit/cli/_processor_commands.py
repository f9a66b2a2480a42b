"""``streamkit processor versions`` and ``streamkit processor rollback``: a processor's versions.

Checkpoints are kept per contract version, one serving (see
:mod:`streamkit.checkpoint`). ``versions`` lists them from the database;
``rollback`` lifts the retirement of a version a cutover replaced, so that
hosts running its code build it from its kept checkpoint up to the serving
cursor and cut back over (the same fenced cutover as any). Both work on the
database directly, whether or not a host runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any, TextIO

from streamkit.backends import host_store
from streamkit.checkpoint import ReduceCheckpoint, check_rollback
from streamkit.cli._args import existing_log

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
        "and where it was replaced.",
    )
    versions.add_argument("slug", help="the processor's contract slug")
    versions.add_argument(
        "--db",
        required=True,
        help="the log (must exist): a SQLite file or a postgresql:// URL",
    )
    versions.add_argument("--json", action="store_true", help="print a JSON list")
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
    rollback.add_argument(
        "--db",
        required=True,
        help="the log (must exist): a SQLite file or a postgresql:// URL",
    )
    rollback.set_defaults(handler=_cmd_rollback)


def _row(checkpoint: ReduceCheckpoint) -> dict[str, Any]:
    role = "serving" if checkpoint.serving else "retired" if checkpoint.retired_at else "building"
    return {
        "version": checkpoint.reducer_version,
        "role": role,
        "cursor": checkpoint.reduced_through_offset,
        "cutover_offset": checkpoint.cutover_offset,
        "retired_at": checkpoint.retired_at,
    }


def _cmd_versions(args: argparse.Namespace, out: TextIO) -> int:
    async def run() -> list[ReduceCheckpoint]:
        async with existing_log(args.db, read_only=True) as log:
            return await host_store(log).checkpoint_versions(args.slug)

    rows = [_row(checkpoint) for checkpoint in asyncio.run(run())]
    if args.json:
        out.write(json.dumps(rows, separators=(",", ":")) + "\n")
        return 0
    if not rows:
        out.write(f"{args.slug}: no checkpoint in this log\n")
    for row in rows:
        line = f"{args.slug}  v{row['version']}  {row['role']}  cursor={row['cursor']}"
        if row["role"] == "serving":
            line += f"  since offset {row['cutover_offset']}"
        if row["retired_at"] is not None:
            line += f"  replaced at offset {row['retired_at']}"
        out.write(line + "\n")
    return 0


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

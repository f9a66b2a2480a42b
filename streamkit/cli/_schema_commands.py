"""``streamkit schema check`` and ``streamkit schema recount``: the data check before a deploy.

``check`` asks, of the processors named (``--processor module:Class`` or
``--all`` of a streamkit.toml), whether their code can read everything the
log stores on their paths (:mod:`streamkit.schema_check`); it exits 0 when
it can, :data:`PROBLEMS_FOUND` when some stored events would be skipped or
would stall a processor (or the summary it reads cannot be trusted), and 1
when the check itself was refused. ``recount`` counts the summary of stored
types again from the events. Only ``recount`` writes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
from typing import Literal, TextIO

from streamkit.cli._args import existing_log
from streamkit.cli._common import cwd_importable
from streamkit.config import ResolvedProcessor, config_from_args, resolve_processors
from streamkit.errors import InvalidRequest
from streamkit.records import StoredType
from streamkit.schema_check import ProcessorCheck, check_processor, parse_validate, problems_of

__all__ = ["PROBLEMS_FOUND", "add_schema"]

PROBLEMS_FOUND = 2
"""The exit code of a check that found stored events the code would skip or stall at."""


def add_schema(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "schema",
        help="check stored events against processors' event definitions",
        description="What the log stores, judged by processors' code: run `schema check` "
        "before a deploy (in CI, against a copy of production's log).",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    check = verbs.add_parser(
        "check",
        help="can these processors read every event stored on their paths?",
        description="For each processor, every stored (type, payload version) it reads, from "
        "the log's summary (no scan): current, lifted by its upcasters, AHEAD of the code (the "
        "processor would stall) or with NO CHAIN to the current version (every such event would "
        "be skipped, or stall a processor set to on_malformed=stall). --validate pushes the "
        "stored payloads through chain and model too, and counts exactly what would be skipped. "
        f"Exits 0 when nothing would be skipped or stall, {PROBLEMS_FOUND} when something "
        "would, 1 when the check is refused.",
    )
    check.add_argument(
        "--db",
        help="the log (must exist): a SQLite file or a postgresql:// URL; default: the db of "
        "the config",
    )
    check.add_argument(
        "--processor",
        dest="processors",
        action="append",
        default=[],
        metavar="module:Class[@/path][{kwargs}]",
        help="a processor to check (its path, default /, and constructor kwargs as in "
        "`streamkit host --processor`); repeat for more",
    )
    check.add_argument(
        "--all",
        action="store_true",
        help="check every processor of the config (./streamkit.toml, or --config)",
    )
    check.add_argument("--config", metavar="FILE", help="the streamkit.toml --all reads")
    check.add_argument(
        "--validate",
        metavar="all|sample=N",
        help="also read the stored payloads through upcasters and model: all of them, or N "
        "of each stored type and version (default: the summary only)",
    )
    check.add_argument("--json", action="store_true", help="print one JSON object per processor")
    check.set_defaults(handler=_cmd_check)
    recount = verbs.add_parser(
        "recount",
        help="count the log's summary of stored types again from its events",
        description="Rewrite the summary of stored types from the events, in one write "
        "transaction (appends wait for it; it reads the whole log once). Needed only when "
        "`schema check` says the summary is behind the log: a writer of a release before the "
        "summary appended after the log was upgraded.",
    )
    recount.add_argument(
        "--db", help="the log: a SQLite file or a postgresql:// URL; default: the db of the config"
    )
    recount.add_argument("--config", metavar="FILE", help="the streamkit.toml naming the db")
    recount.set_defaults(handler=_cmd_recount)


def _processors(args: argparse.Namespace) -> list[ResolvedProcessor]:
    if args.all == bool(args.processors):
        raise InvalidRequest(
            "schema check needs --processor module:Class (repeatable) or --all (the config's "
            "processors), and not both; nothing was checked"
        )
    cwd_importable()
    if args.processors:
        config = config_from_args(db=args.db, processors=args.processors)
    else:
        config = config_from_args(config=args.config or "streamkit.toml", db=args.db)
    return resolve_processors(config)


def _validate(value: str | None) -> int | Literal["all"] | None:
    try:
        return parse_validate(value)
    except ValueError as exc:
        raise InvalidRequest(
            f"--validate: {exc}; nothing was checked", details={"validate": value}
        ) from exc


def _cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    validate = _validate(args.validate)
    resolved = _processors(args)

    async def run() -> list[ProcessorCheck]:
        checks = []
        # Read-only: a check never changes the log (a log of an earlier layout is refused
        # with how to upgrade it, instead of being upgraded by a look).
        async with existing_log(args.db, read_only=True) as log:
            for entry in resolved:
                spec = entry.spec
                stream = log.stream(spec.path)
                head = await stream.head()  # before the summary (see check_processor)
                stored = await log.stored_types(spec.path)
                checks.append(
                    await check_processor(
                        entry.processor.contract,
                        stream,
                        stored,
                        head,
                        on_malformed=spec.on_malformed,
                        validate=validate,
                        read=functools.partial(stream.read, include_archive=True),
                    )
                )
        return checks

    checks = asyncio.run(run())
    found = problems_of(checks)
    if args.json:
        for check in checks:
            out.write(json.dumps(check.to_dict(), sort_keys=True) + "\n")
    else:
        for check in checks:
            out.write("\n".join(check.lines()) + "\n")
        failing = sum(not check.ok for check in checks)
        out.write(
            "schema check: ok\n"
            if not found
            else f"schema check: {found} problem(s) in {failing} of {len(checks)} processor(s)\n"
        )
    return PROBLEMS_FOUND if found else 0


def _cmd_recount(args: argparse.Namespace, out: TextIO) -> int:
    async def run() -> list[StoredType]:
        async with existing_log(args.db) as log:
            await log.recount_stored_types()
            return await log.stored_types()

    rows = asyncio.run(run())
    out.write(
        f"recounted the summary of stored types: {len(rows)} (path, type, version) rows, "
        f"{sum(row.count for row in rows)} events\n"
    )
    return 0

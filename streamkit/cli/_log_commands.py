"""``streamkit append`` and ``streamkit read``: the log's own commands."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shlex
import sys
import uuid
from collections.abc import Callable
from typing import Any, TextIO

from streamkit.backends import open_log
from streamkit.cli._args import (
    existing_log,
    json_object,
    non_negative_int,
    positive_int,
    positive_seconds,
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
from streamkit.config import config_from_args, find_config, resolve_processors
from streamkit.contract import ProcessorContract
from streamkit.control import ControlClient, request_sync
from streamkit.errors import (
    ControlUnavailable,
    InvalidRequest,
    SlowConsumer,
)
from streamkit.events import StreamEvent, replayed_offsets
from streamkit.lifting import as_read_by
from streamkit.live_state import LIVE_STATE_CHANGED
from streamkit.log import read_matching, type_matcher

__all__ = ["add_append", "add_read"]


# -- append -----------------------------------------------------------------


def add_append(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "append",
        help="append one event to a stream",
        description="Append one durable event to a stream of a log (a SQLite file is created if missing). "
        "Prints the committed event; an idempotent retry prints the event already committed.",
    )
    p.add_argument("type", help="the event type, e.g. task.requested")
    p.add_argument(
        "--db",
        help="the log: a SQLite file or a postgresql:// URL; default: the db of ./streamkit.toml",
    )
    p.add_argument("--path", default="/", help="the stream path (default: /)")
    p.add_argument("--payload", type=json_object("--payload"), help="the payload, a JSON object")
    p.add_argument("--metadata", type=json_object("--metadata"), help="the metadata, a JSON object")
    p.add_argument("--idempotency-key", help="retry-safe key: same key + same body appends once")
    p.add_argument(
        "--payload-version",
        type=positive_int,
        help="the version of the payload's shape (default: 1, or, through a running host, "
        "the current version of the host's definition of the type; see "
        "docs/schema-evolution.md)",
    )
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
    add_socket_flag(p)
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
    if args.payload_version is not None:
        event["payload_version"] = args.payload_version
    if args.ephemeral:
        event["ephemeral"] = True
    socket = live_socket(args)
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
                db=served(args),
                **({} if args.expect_head is None else {"expect_head": args.expect_head}),
            )
        except ControlUnavailable as exc:
            raise _append_in_doubt(args, event, exc) from exc
        replayed = bool(data.pop("replayed", False))
        kept_for = data.pop("keys_kept_for", None)
        emit(StreamEvent(**data), args, out, replayed=replayed)
        _say_key_window(args, kept_for)
        return 0
    if args.ephemeral:
        raise ControlUnavailable(
            f"--ephemeral needs a running host on {args.db!r} (no control socket answers at "
            f"{socket_of(args)!r}): an ephemeral event reaches only the subscribers of the "
            "process that appends it; nothing was appended; start `streamkit host` first"
        )

    async def run() -> tuple[StreamEvent, bool]:
        async with open_log(args.db) as log:
            result = await log.stream(args.path).append(event, expect_head=args.expect_head)
            (committed,) = result
            return committed, committed.offset in replayed_offsets(result)

    committed, replayed = asyncio.run(run())
    emit(committed, args, out, replayed=replayed)
    return 0


def _say_key_window(args: argparse.Namespace, kept_for: float | None) -> None:
    """Under a key window, say (on stderr, so --json stays one object) when the key of
    the user's own ``--idempotency-key`` stops answering retries."""
    if kept_for is not None and args.idempotency_key is not None:
        sys.stderr.write(
            f"note: {args.path} has a key window: this key answers retries for "
            f"{kept_for:g} s after its event is archived or deleted, then is forgotten\n"
        )


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
    again = f"RETRY WITH: {retry}" if retry else f"retry with --idempotency-key {shlex.quote(key)}"
    return ControlUnavailable(
        f"the append's outcome is unknown: {exc.message}; it may still land (the host may be "
        f"frozen or overloaded). {again} (that key appends it at most once and prints the "
        "committed event; the same command without it could append a second event). To "
        f"check without appending: streamkit read --db {shlex.quote(args.db)} --path "
        f"{shlex.quote(args.path)} --json (look for idempotency_key {key!r})",
        details={**exc.details, "idempotency_key": key, "retry": retry},
    )


# -- read -------------------------------------------------------------------


def add_read(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "read",
        help="read a stream's events",
        description="Print the durable events of a stream after an offset, one per line: "
        "offset, created_at (UTC), type, payload. With --follow, keep printing new events as "
        "they are committed (by any process) until interrupted.",
    )
    add_db_flag(p)
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
    p.add_argument(
        "--include-archive",
        action="store_true",
        help="below the path's start (history retention took), read its archive instead of "
        "refusing with HISTORY_TRUNCATED",
    )
    p.add_argument(
        "--type",
        dest="types",
        action="append",
        metavar="TYPE",
        help="only events of this type, or of a prefix ending in * (order.*); repeat for more",
    )
    p.add_argument(
        "--as",
        dest="as_processor",
        metavar="PROCESSOR",
        help="print each event as this processor's current code reads it (older versions "
        "lifted, former type names renamed): a slug of ./streamkit.toml (or --config), or "
        "module:Class",
    )
    p.add_argument("--config", metavar="FILE", help="the streamkit.toml --as looks in")
    add_socket_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per line")
    p.set_defaults(handler=_cmd_read)


def _reader(args: argparse.Namespace) -> ProcessorContract[Any] | None:
    """The contract ``--as`` names: a slug of the config, or a ``module:Class``."""
    wanted: str | None = args.as_processor
    if wanted is None:
        return None
    cwd_importable()
    if ":" in wanted:
        config = config_from_args(db=args.db, processors=[wanted])
    else:
        source = args.config or find_config()
        if source is None:
            raise InvalidRequest(
                f"--as {wanted!r} names a processor by slug, and there is no streamkit.toml "
                "here to find it in; pass --config FILE, or --as module:Class; nothing was read"
            )
        config = config_from_args(config=source, db=args.db)
    resolved = resolve_processors(config)
    for entry in resolved:
        if ":" in wanted or entry.slug == wanted:
            contract: ProcessorContract[Any] = entry.processor.contract
            return contract
    known = ", ".join(entry.slug for entry in resolved) or "none"
    raise InvalidRequest(
        f"--as {wanted!r}: no such processor in the config (it has: {known}); nothing was read",
        details={"as": wanted},
    )


def _cmd_read(args: argparse.Namespace, out: TextIO) -> int:
    matches = type_matcher(args.types) if args.types else None
    reader = _reader(args)
    if reader is not None:
        args.shown = functools.partial(as_read_by, reader)
    socket = live_socket(args) if args.follow else None
    if socket is not None:
        return _read_follow_through(socket, args, out, matches)

    async def run() -> None:
        printed = 0
        limit: int | None = args.limit
        async with existing_log(args.db) as log:
            stream = log.stream(args.path)
            if args.follow:
                async for events, _range in stream.follow(args.after):
                    for event in events:
                        if event.ephemeral or (matches is not None and not matches(event.type)):
                            continue
                        emit(event, args, out, timestamp=True)
                        printed += 1
                        if limit is not None and printed >= limit:
                            return
                return
            after = args.after
            read = functools.partial(stream.read, include_archive=args.include_archive)
            while limit is None or printed < limit:
                page_size = 500 if limit is None else min(500, limit - printed)
                if matches is None:
                    page = await read(after, page_size)
                else:
                    page = await read_matching(read, after, page_size, matches)
                for event in page.events:
                    emit(event, args, out, timestamp=True)
                printed += len(page.events)
                after = page.scanned_through_offset
                if page.at_head:
                    return

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


def _read_follow_through(
    socket: str, args: argparse.Namespace, out: TextIO, matches: Callable[[str], bool] | None
) -> int:
    """``read --follow`` through a running host: its ephemerals are printed too.

    Live-state deltas are left out: every processor emits one per batch, and
    ``streamkit watch`` is the way to follow them.
    """

    async def run() -> None:
        printed = 0
        after = args.after
        while True:
            watch = ControlClient(socket).watch(
                "follow", path=args.path, after=after, db=served(args)
            )
            try:
                async for data in watch:
                    if not data.get("ephemeral"):
                        after = max(after, int(data["offset"]))
                    if data.get("type") == LIVE_STATE_CHANGED:
                        continue  # one per processor per batch: `streamkit watch` shows them
                    if matches is not None and not matches(str(data.get("type"))):
                        continue
                    emit(StreamEvent(**data), args, out, timestamp=True)
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

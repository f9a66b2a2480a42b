"""The host's answers to control-socket requests (the ops ``streamkit`` clients send).

Each op maps to one :class:`~streamkit.host.ProcessorHost` method. Arguments
are validated by the server against the models below before the host sees
them; a refusal is a coded error reply, and the host keeps serving.

One-shot ops: ``append`` (``path``, ``events``: durable and ephemeral,
``expect_head``: refused unless the last durable offset is exactly that),
``read`` (``path``, ``after``, ``limit``, ``types``), ``status``, ``snapshot``
(``slug``, ``path``), ``skip`` (``slug``, ``offset``, ``by``, ``reason``,
``path``), ``wait`` (``slug``, ``offset``, ``timeout``, ``path``: answers once
the processor has processed through the offset), ``cutover`` (``slug``,
``path``, ``within``: cut a version this host builds in the shadow over now,
for a manual cutover; answers once committed), ``versions`` (``slug``,
``path``: every version's row and state, the differences, each host's
counts), ``rollback`` (``slug``, ``to``, ``path``), ``hello`` (which database the host serves: ``db``, ``owner``,
``pid``), ``http`` (``served``: the HTTP surface's ``url``, ``token`` and
``admin`` page address, for the socket's owner). Every op takes an optional ``db``, the database the client means
(a resolved path): a host serving another database refuses the request.
Streaming ops: ``follow`` (``path``, ``after``: every commit,
ephemerals included, as event objects) and ``watch`` (``slug``, ``path``: a
live-state seed, then deltas; a fresh seed after any gap).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field

from streamkit.control import NoArgs, Operation
from streamkit.errors import InvalidRequest, UnknownOperation
from streamkit.events import MAX_OFFSET, EventInput, ReadPage, StreamEvent, appended_to_dicts
from streamkit.log import Log

__all__ = ["HostControlHandler", "ServedHost"]


class ServedHost(Protocol):
    """What the handler needs of a host: the methods its operations map to, one each.

    :class:`~streamkit.host.ProcessorHost` is the one implementation; naming
    the shape here keeps the handler below the host (no import back up).
    """

    owner: str
    served_db: str
    log: Log | None

    def runner(self, slug: str, path: str | None = None) -> object: ...

    async def append(
        self,
        path: str,
        events: Sequence[EventInput | Mapping[str, Any]],
        *,
        expect_head: int | None = None,
    ) -> list[StreamEvent]: ...

    async def keys_kept_for(
        self, path: str, events: Sequence[EventInput | Mapping[str, Any]]
    ) -> float | None: ...

    async def read(
        self,
        path: str,
        after_offset: int = 0,
        limit: int = 500,
        types: Sequence[str] | None = None,
    ) -> ReadPage: ...

    async def snapshot(self, slug: str, path: str | None = None) -> dict[str, Any]: ...

    def watch(self, slug: str, path: str | None = None) -> AsyncIterator[dict[str, Any]]: ...

    def follow(self, path: str, after_offset: int = 0) -> AsyncIterator[StreamEvent]: ...

    async def skip(
        self,
        slug: str,
        offset: int,
        *,
        by: str,
        reason: str,
        path: str | None = None,
        ahead: bool = False,
    ) -> StreamEvent: ...

    async def status(self) -> dict[str, Any]: ...

    async def versions(self, slug: str, path: str | None = None) -> dict[str, Any]: ...

    async def rollback(self, slug: str, to: str, path: str | None = None) -> dict[str, Any]: ...

    async def cut_over(
        self,
        slug: str,
        path: str | None = None,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109 - the engine verb's timeout
    ) -> dict[str, Any]: ...

    def http_access(self) -> list[dict[str, str]]: ...

    async def wait_until_processed(
        self,
        slug: str,
        offset: int,
        timeout: float = 10.0,  # noqa: ASYNC109 - the engine verb's timeout
        path: str | None = None,
    ) -> None: ...


class HostArgs(NoArgs):
    db: str | None = None
    """The database the client means (resolved); a host serving another one refuses."""


class AppendArgs(HostArgs):
    path: str = "/"
    events: list[dict[str, Any]] = Field(min_length=1, max_length=10_000)
    expect_head: int | None = Field(default=None, ge=0, le=MAX_OFFSET)


class ReadArgs(HostArgs):
    path: str = "/"
    after: int = Field(default=0, ge=0, le=MAX_OFFSET)
    limit: int = Field(default=500, ge=1, le=10_000)
    types: list[str] | None = None


class FollowArgs(HostArgs):
    path: str = "/"
    after: int = Field(default=0, ge=0, le=MAX_OFFSET)


class SlugArgs(HostArgs):
    slug: str = Field(min_length=1)
    path: str | None = None


class SkipArgs(SlugArgs):
    offset: int = Field(ge=1, le=MAX_OFFSET)
    by: str = Field(min_length=1, max_length=256)
    reason: str = Field(default="", max_length=4096)
    ahead: bool = False
    """Skip an event other than the one the processor is stalled at, on purpose."""


class CutoverArgs(SlugArgs):
    within: float = Field(default=60.0, gt=0, le=3600, allow_inf_nan=False)
    """Seconds to wait for the cutover to commit."""


class RollbackArgs(SlugArgs):
    to: str = Field(min_length=1, max_length=256)


class WaitArgs(SlugArgs):
    offset: int = Field(ge=0, le=MAX_OFFSET)
    timeout: float = Field(default=10.0, gt=0, le=60, allow_inf_nan=False)


_OPERATIONS: dict[str, Operation] = {
    "append": Operation(AppendArgs, description="append events (durable or ephemeral)"),
    "read": Operation(ReadArgs, description="read durable events after an offset"),
    "follow": Operation(FollowArgs, streaming=True, description="every commit from an offset"),
    "status": Operation(HostArgs, description="the host and each processor"),
    "snapshot": Operation(SlugArgs, description="a processor's reduced state and offset"),
    "watch": Operation(SlugArgs, streaming=True, description="live state: seed, then deltas"),
    "skip": Operation(SkipArgs, description="move a processor past one event"),
    "wait": Operation(WaitArgs, description="answer once a processor passed an offset"),
    "versions": Operation(
        SlugArgs, description="a processor's versions side by side (rows, states, counts)"
    ),
    "rollback": Operation(RollbackArgs, description="make a replaced version serve again"),
    "cutover": Operation(
        CutoverArgs, description="cut a version built in the shadow over (manual cutover)"
    ),
    "hello": Operation(HostArgs, description="which database this host serves, and who it is"),
    "http": Operation(HostArgs, description="the HTTP surface's address and token (owner only)"),
}


class HostControlHandler:
    """Serves :data:`_OPERATIONS` for one host."""

    def __init__(self, host: ServedHost) -> None:
        self._host = host

    @property
    def operations(self) -> Mapping[str, Operation]:
        return _OPERATIONS

    async def handle(self, op: str, args: BaseModel) -> Any:
        host = self._host
        self._check_db(args)
        if isinstance(args, AppendArgs):
            kept_for = await host.keys_kept_for(args.path, args.events)
            committed = await host.append(args.path, args.events, expect_head=args.expect_head)
            return appended_to_dicts(committed, kept_for)
        if isinstance(args, ReadArgs):
            page = await host.read(args.path, args.after, args.limit, args.types)
            return {
                "events": [event.to_dict() for event in page.events],
                "scanned_through_offset": page.scanned_through_offset,
                "at_head": page.at_head,
            }
        if isinstance(args, WaitArgs):
            await host.wait_until_processed(args.slug, args.offset, args.timeout, args.path)
            return {"slug": args.slug, "offset": args.offset}
        if isinstance(args, CutoverArgs):
            return await host.cut_over(args.slug, args.path, timeout=args.within)
        if isinstance(args, SkipArgs):
            event = await host.skip(
                args.slug,
                args.offset,
                by=args.by,
                reason=args.reason,
                path=args.path,
                ahead=args.ahead,
            )
            return event.to_dict()
        if isinstance(args, RollbackArgs):
            return await host.rollback(args.slug, args.to, args.path)
        if op == "versions" and isinstance(args, SlugArgs):
            return await host.versions(args.slug, args.path)
        if op == "snapshot" and isinstance(args, SlugArgs):
            return await host.snapshot(args.slug, args.path)
        if op == "status":
            return await host.status()
        if op == "hello":
            return {"db": host.served_db, "owner": host.owner, "pid": os.getpid()}
        if op == "http":
            # The socket answers its owner alone, so its token may go to them.
            return {"served": host.http_access()}
        raise _unknown(op)

    def _check_db(self, args: BaseModel) -> None:
        wanted = getattr(args, "db", None)
        served = self._host.served_db
        if wanted is not None and wanted != served:
            raise InvalidRequest(
                f"this host serves {served!r}, not {wanted!r}; nothing was done; point the "
                "client at the socket of the host that runs on that database",
                details={"served": served, "db": wanted},
            )

    def watch(self, op: str, args: BaseModel) -> AsyncIterator[Any]:
        host = self._host
        self._check_db(args)
        if op == "watch" and isinstance(args, SlugArgs):
            host.runner(args.slug, args.path)  # refuse an unknown slug before streaming
            return host.watch(args.slug, args.path)
        if isinstance(args, FollowArgs):
            return _follow(host, args.path, args.after)
        raise _unknown(op)


async def _follow(host: ServedHost, path: str, after: int) -> AsyncIterator[Any]:
    if host.log is None:
        return
    follow = host.follow(path, after)
    try:
        async for event in follow:
            yield event.to_dict()
    finally:
        closer = getattr(follow, "aclose", None)
        if closer is not None:
            await closer()


def _unknown(op: str) -> UnknownOperation:
    return UnknownOperation(f"op {op!r} is not served by this host; nothing was done")

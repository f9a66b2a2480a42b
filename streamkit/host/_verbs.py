"""What a host does for its clients: the verbs the control socket and HTTP serve.

The half of :class:`~streamkit.host.ProcessorHost` (which inherits it) that
clients reach: append, read and follow a stream, a processor's snapshot,
live state, skip, status, and waiting for an offset. Each verb is one method,
so the socket's handler (:mod:`._control`) and the HTTP routes
(``streamkit.web``) translate to it and keep no rule of their own: a refusal
raised here is the refusal both send, and writes nothing.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkit._targets import shown_target
from streamkit.checkpoint import shown_snapshot
from streamkit.config import HostConfig
from streamkit.errors import InvalidRequest, NotFound, SlowConsumer
from streamkit.events import EventInput, ReadPage, StreamEvent
from streamkit.host._pacer import Pacer, PacerStats
from streamkit.host._runner import ProcessorRunner
from streamkit.host._status import processor_rows
from streamkit.host._watch import Subscription, jsonable, watch_messages
from streamkit.live_state import LiveSnapshot
from streamkit.log import read_matching, type_matcher
from streamkit.log._log import Log
from streamkit.protocols import Clock, HostStore

__all__ = ["HostVerbs"]


class HostVerbs:
    """The client verbs of :class:`~streamkit.host.ProcessorHost` (which inherits them).

    The attributes below are the host's; they are named here so each verb's
    use of them is checked.
    """

    config: HostConfig
    clock: Clock
    owner: str
    log: Log | None
    pacer: Pacer | None
    store: HostStore | None
    runners: list[ProcessorRunner]
    socket_path: Path | None
    _started_at: float | None

    if TYPE_CHECKING:

        def subscribe(self, path: str, key: str) -> Subscription: ...

        def unsubscribe(self, subscription: Subscription) -> None: ...

    def runner(self, slug: str, path: str | None = None) -> ProcessorRunner:
        """The runner of ``slug`` (on ``path`` if given); InvalidRequest if there is none."""
        found = [r for r in self.runners if r.slug == slug and (path is None or r.path == path)]
        if len(found) != 1:
            known = ", ".join(f"{r.slug}@{r.path}" for r in self.runners) or "none"
            why = "is not run by this host" if not found else "runs on several paths; name one"
            raise InvalidRequest(
                f"processor {slug!r} {why} (this host runs: {known}); nothing was done",
                details={"slug": slug, "path": path},
            )
        return found[0]

    async def append(
        self,
        path: str,
        events: Sequence[EventInput | Mapping[str, Any]],
        *,
        expect_head: int | None = None,
    ) -> list[StreamEvent]:
        """Append to a stream of the host's log (ephemerals reach this host's subscribers).

        ``expect_head`` as in :meth:`streamkit.log.Stream.append`.
        """
        return await self._require_log().stream(path).append(*events, expect_head=expect_head)

    async def read(
        self,
        path: str,
        after_offset: int = 0,
        limit: int = 500,
        types: Sequence[str] | None = None,
    ) -> ReadPage:
        """Read durable events of a stream of the host's log, of ``types`` only if given.

        With ``types`` (exact types, or prefixes ending in ``*``) the page holds
        the matching events and its proof covers what was looked at (see
        :func:`streamkit.log._types.read_matching`).
        """
        stream = self._require_log().stream(path)
        if types is None:
            return await stream.read(after_offset, limit)
        return await read_matching(stream.read, after_offset, limit, type_matcher(types))

    async def event(self, path: str, offset: int) -> StreamEvent:
        """The durable event at ``offset`` of ``path``; :class:`NotFound` if there is none."""
        page = await self._require_log().stream(path).read(max(0, offset - 1), 1)
        if not page.events or page.events[0].offset != offset:
            raise NotFound(
                f"no durable event at offset {offset} of {path!r} (an ephemeral's offset, or "
                "past the head); nothing was read",
                details={"path": path, "offset": offset},
            )
        return page.events[0]

    async def stream_heads(self) -> list[tuple[str, int]]:
        """Every path of the log with a durable event, and its head."""
        return await self._require_store().stream_heads()

    async def hosts(self) -> list[dict[str, Any]]:
        """The hosts beating on this log now and the processors each runs (the registry)."""
        live = await self._require_store().live_hosts(self.clock(), self.config.lease.ttl)
        return [
            {"owner": owner, "processors": sorted(processors), "here": owner == self.owner}
            for owner, processors in sorted(live.items())
        ]

    async def follow(self, path: str, after_offset: int = 0) -> AsyncIterator[StreamEvent]:
        """Every event of ``path`` after ``after_offset``, then each commit as it lands.

        A client that reads slower than its byte budget
        (``limits.subscriber_bytes``) loses what the host buffered for it:
        the follow ends with :class:`~streamkit.errors.SlowConsumer`, whose
        ``resume_after`` is the last durable offset yielded (durable events
        are intact; skipped ephemerals are gone).
        """
        follower = self._require_log().stream(path).follow(after_offset)
        sent = after_offset
        try:
            async for events, _ in follower:
                if follower.overflows:
                    raise SlowConsumer(
                        f"the follower of {path!r} fell more than its byte budget behind and "
                        f"the host dropped what it held for it (ephemerals in it are gone); "
                        f"durable events are intact: follow again after offset {sent}",
                        details={"path": path, "resume_after": sent},
                    )
                for event in events:
                    if not event.ephemeral:
                        sent = event.offset
                    yield event
        finally:
            closer = getattr(follower, "aclose", None)
            if closer is not None:
                await closer()

    async def snapshot(self, slug: str, path: str | None = None) -> dict[str, Any]:
        """``{offset, state, source}``: live from the engine here, else from the checkpoint.

        From the engine it also carries ``rev`` and ``live`` (the live-state
        revision and projection), so a watcher can re-seed from it and apply
        the deltas after ``rev``. ``offset`` is never past the durable head
        (as status shows the cursor).
        """
        runner = self.runner(slug, path)
        stream = self._require_log().stream(runner.path)
        engine = runner.engine
        if engine is not None:
            offset, state = await engine.snapshot()
            # Caught up by the line above, this reads no log and awaits nothing: the
            # revision belongs to the very state returned.
            rev, projection = await engine.live_snapshot()
            snapshot = {
                "offset": offset,
                "state": jsonable(state),
                "rev": rev,
                "live": jsonable(projection),
                "source": "engine",
            }
            # The head after the snapshot: a durable event the engine reduced is below it.
            return shown_snapshot(snapshot, await stream.head())

        stored = await self._require_store().stored_snapshot(slug)
        contract = runner.processor.contract
        if stored.get("state") is not None and stored.get("version") == contract.version:
            # A checkpoint leaves out fields at their defaults (compact_state): a reader
            # of the snapshot gets the whole state, as from the engine.
            stored["state"] = contract.restored_json(stored["state"])
        return shown_snapshot(stored, await stream.head())

    async def live_snapshot(self, slug: str, path: str | None = None) -> LiveSnapshot:
        """``(rev, projection)`` of a processor this host runs (the watch seed)."""
        runner = self.runner(slug, path)
        engine = runner.engine
        if engine is None:
            raise InvalidRequest(
                f"processor {slug!r} is not running in this host (another host holds its "
                "lease); watch it through that host's socket; nothing was done",
                details={"slug": slug, "path": runner.path},
            )
        return await engine.live_snapshot()

    async def watch(self, slug: str, path: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Yield ``{"kind": "seed", rev, state}`` then ``{"kind": "delta", from, to, patch}``.

        A gap in the revision chain (a lost delta, a ``patch: null``, a watcher
        that fell behind) yields a fresh seed.
        """
        runner = self.runner(slug, path)
        subscription = self.subscribe(runner.path, slug)
        try:
            async for message in watch_messages(
                subscription, lambda: self.live_snapshot(slug, runner.path)
            ):
                yield message
        finally:
            self.unsubscribe(subscription)

    async def skip(
        self, slug: str, offset: int, *, by: str, reason: str, path: str | None = None
    ) -> StreamEvent:
        """Move ``slug`` past the event at ``offset``; the decision is a durable skip event."""
        runner = self.runner(slug, path)
        event = await self._require_store().record_skip(
            runner.path, slug, offset, by=by, reason=reason
        )
        runner.skip(offset, by=by, recorded_at=event.offset, reason=reason)
        return event

    async def status(self) -> dict[str, Any]:
        """The host and each processor: cursor, head, lag, lease, claim, stalled, rates."""
        database, processors = await processor_rows(
            self._require_log(), self._require_store(), self.runners
        )
        started = self._started_at
        return {
            "database": database,
            "host": {
                "owner": self.owner,
                "pid": os.getpid(),
                "db": shown_target(self.config.db),
                "socket": None if self.socket_path is None else str(self.socket_path),
                "uptime": None if started is None else round(self.clock() - started, 3),
                "clients_first": self._clients_first(),
            },
            "processors": processors,
        }

    def _clients_first(self) -> dict[str, Any]:
        """What favouring clients cost the processors so far (docs/host.md, "Clients first")."""
        paced = PacerStats(0, 0.0) if self.pacer is None else self.pacer.statistics()
        return {
            "pauses": paced.pauses,
            "paused_seconds": round(paced.paused_seconds, 6),
            "held_writes": 0 if self.log is None else self.log.held_writes,
        }

    async def wait_until_processed(
        self,
        slug: str,
        offset: int,
        timeout: float = 10.0,  # noqa: ASYNC109 - the engine's verb, with its timeout
        path: str | None = None,
    ) -> None:
        """Wait until ``slug`` (running here) has processed through ``offset``."""
        runner = self.runner(slug, path)
        deadline = time.monotonic() + timeout
        while runner.engine is None:
            if time.monotonic() >= deadline:
                raise InvalidRequest(
                    f"processor {slug!r} is not running in this host; nothing to wait for",
                    details={"slug": slug},
                )
            await asyncio.sleep(0.01)
        await runner.engine.wait_until_processed(offset, max(0.0, deadline - time.monotonic()))

    def _require_log(self) -> Log:
        if self.log is None:
            raise InvalidRequest("the host is not started; call start() first")
        return self.log

    def _require_store(self) -> HostStore:
        if self.store is None:
            raise InvalidRequest("the host is not started; call start() first")
        return self.store

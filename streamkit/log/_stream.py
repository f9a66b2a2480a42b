"""A stream: one path of a log, and the same path bound to one processor.

A :class:`Stream` holds no state but its log and its path, so it is cheap
and the log hands out one per path. Everything it does is checked here
(offsets, limits, claimants, claim times: a bad argument is refused with
nothing read or written) and then asked of the log through
:class:`LogForStreams`, the part of :class:`~streamkit.log.Log` a stream
calls. That interface is declared here so this module needs nothing of the
log's: the log builds its streams, never the other way round.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel

from streamkit._requests import Fence, PageRead
from streamkit.errors import InvalidRequest
from streamkit.events import (
    MAX_OFFSET,
    EventInput,
    ReadPage,
    StreamEvent,
    prepare_event,
    prepare_events,
)
from streamkit.log._follow import Follow
from streamkit.protocols import LogBackend, payload_validators

__all__ = ["MAX_READ_LIMIT", "LogForStreams", "ProcessorStreamView", "Stream", "check_int"]

MAX_READ_LIMIT = 10_000


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` if it is an integer from ``low`` (to ``high``), else InvalidRequest."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise InvalidRequest(
            f"{name} must be an integer {bounds}, got {value!r}; nothing was read or written",
            details={name: repr(value)},
        )
    return value


class LogForStreams(Protocol):
    """What a :class:`Stream` asks of its log (:class:`~streamkit.log.Log` is the one)."""

    @property
    def path(self) -> str:
        """What the log was opened on."""
        ...

    @property
    def read_only(self) -> bool:
        """Whether the log was opened read-only."""
        ...

    @property
    def backend(self) -> LogBackend:
        """The storage under the log."""
        ...

    def _check_writable(self) -> None: ...

    def _check_open(self) -> None: ...

    def _append(
        self,
        path: str,
        events: list[Any],
        fence: Fence | None = None,
        *,
        expect_head: int | None = None,
    ) -> list[StreamEvent] | asyncio.Future[list[StreamEvent]]: ...

    async def _read(self, read: PageRead) -> ReadPage: ...

    async def _submit_claim(self, path: str, slug: str, due_at: float | None) -> None: ...

    def _follow(self, path: str, after_offset: int) -> Follow: ...


class Stream:
    """One stream path of a log. Satisfies :class:`~streamkit.protocols.ProcessorStream`
    except that :meth:`claim` names its claimant (see :meth:`for_processor`)."""

    __slots__ = ("log", "path")

    def __init__(self, log: LogForStreams, path: str) -> None:
        self.log = log
        self.path = path

    def __repr__(self) -> str:
        return f"<Stream {self.path!r} of {self.log.path!r}>"

    async def append(
        self,
        *events: EventInput | Mapping[str, Any],
        expect_head: int | None = None,
        fence: Fence | None = None,
    ) -> list[StreamEvent]:
        """Append atomically; return the committed events in input order.

        An idempotent retry returns the event committed earlier; an ephemeral
        returns a :class:`~streamkit.events.StreamEvent` with ``ephemeral=True``
        and the offset it took. Refusals (``InvalidEvent``, ``OffsetConflict``,
        ``IdempotencyConflict``, ``StorageBusy``) write nothing. Cancelling the
        wait does not withdraw the append: it may still commit.

        ``fence(conn)`` (for hosts) runs inside the append's transaction before
        any row is written, when the call holds a durable event; a
        :class:`~streamkit.errors.StreamkitError` it raises (``LeaseLost``)
        refuses the call and nothing is written. Ephemeral events never reach a
        transaction, so a call of ephemerals only is not fenced.

        ``expect_head=N`` is optimistic concurrency: the whole call is refused
        with :class:`~streamkit.errors.OffsetConflict` (nothing written) unless
        the last DURABLE offset of the path is exactly ``N`` when it commits,
        that is unless nothing was appended since a read through ``N``.
        Ephemerals (live-state deltas, say) taking offsets meanwhile do not
        count. An event's ``offset`` is exact placement instead.
        """
        log = self.log
        if log.read_only:
            log._check_writable()
        if len(events) == 1 and fence is None and expect_head is None:  # the commonest call
            outcome = log._append(self.path, [prepare_event(events[0])])
        else:
            if expect_head is not None:
                check_int("expect_head", expect_head, 0, MAX_OFFSET)
            prepared = prepare_events(events) if events else []
            if not prepared:
                log._check_open()
                return []
            if fence is not None and not _has_durable(prepared):
                fence = None  # ephemerals never reach a transaction: nothing to fence
            outcome = log._append(self.path, prepared, fence, expect_head=expect_head)
        return outcome if isinstance(outcome, list) else await outcome

    async def read(
        self,
        after_offset: int = 0,
        limit: int = 500,
        *,
        types: Mapping[str, type[BaseModel]] | None = None,
        include_archive: bool = False,
    ) -> ReadPage:
        """Durable events after ``after_offset`` (at most ``limit``) with the scanned-range proof.

        A read that begins below the path's start (history retention took)
        is refused with HISTORY_TRUNCATED; with ``include_archive`` it reads
        the archive's segments there instead, through the same decoding.

        ``types`` maps event types to pydantic models: each payload of such a
        type stored at version 1 comes validated into its model (one that does
        not validate, or of another version, stays as its decoded JSON: check
        ``type(event.payload)``; a processor's fold lifts older versions), and the page's
        events are then a lazy sequence, each built as it is taken (see
        :class:`~streamkit.events.ReadPage`). A processor engine reads this
        way so each event is built once.
        """
        check_int("after_offset", after_offset, 0, MAX_OFFSET)
        check_int("limit", limit, 1, MAX_READ_LIMIT)
        validators = None if types is None else payload_validators(types)
        return await self.log._read(
            PageRead(self.path, after_offset, limit, None, validators, include_archive)
        )

    async def head(self) -> int:
        """The durable head: the highest committed offset of this path (0 if it is empty)."""
        self.log._check_open()
        return await self.log.backend.head(self.path)

    def follow(self, after_offset: int = 0) -> Follow:
        """Yield ``(events, ScannedRange(after, through))`` from ``after_offset`` on, forever.

        The subscription starts when ``follow`` returns. History comes from the
        log, then this process's appends at once (ephemerals included) and
        other processes' commits within milliseconds. Ranges are contiguous
        (each ``after`` is the previous ``through``); durable events come once,
        in order. A consumer that falls far behind is re-fed from the log (its
        missed ephemerals are gone). Closing the log ends the iteration.
        """
        check_int("after_offset", after_offset, 0, MAX_OFFSET)
        return self.log._follow(self.path, after_offset)

    def for_processor(self, slug: str) -> ProcessorStreamView:
        """This stream as one processor sees it: ``claim(at)`` claims under ``slug``."""
        return ProcessorStreamView(self, _check_claimant(slug))

    async def claim(self, at: float | None, *, claimant: str) -> None:
        """Ask to be revived by epoch second ``at`` (``None`` releases); one claim per claimant."""
        _check_claimant(claimant)
        if at is not None and (
            isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at)
        ):
            raise InvalidRequest(
                f"claim time must be a finite number of epoch seconds or None, got {at!r}; "
                "nothing was written",
                details={"at": repr(at)},
            )
        await self.log._submit_claim(self.path, claimant, None if at is None else float(at))

    async def claims(self) -> dict[str, float]:
        """Every claim on this path: claimant -> due epoch second."""
        self.log._check_open()
        return await self.log.backend.claims(self.path)


def _has_durable(events: list[Any]) -> bool:
    return any(not event.ephemeral for event in events)


def _check_claimant(slug: object) -> str:
    if not isinstance(slug, str) or not slug:
        raise InvalidRequest(
            f"a claimant must be a non-empty string, got {slug!r}; nothing was written",
            details={"claimant": repr(slug)},
        )
    return slug


class ProcessorStreamView:
    """A stream bound to one processor slug; satisfies :class:`~streamkit.protocols.ProcessorStream`."""

    __slots__ = ("slug", "stream")

    def __init__(self, stream: Stream, slug: str) -> None:
        self.stream = stream
        self.slug = slug

    def __repr__(self) -> str:
        return f"<ProcessorStreamView {self.stream.path!r} for {self.slug!r}>"

    @property
    def path(self) -> str:
        """The stream path."""
        return self.stream.path

    async def append(
        self,
        *events: EventInput | Mapping[str, Any],
        expect_head: int | None = None,
        fence: Fence | None = None,
    ) -> list[StreamEvent]:
        """Same as :meth:`Stream.append`."""
        return await self.stream.append(*events, expect_head=expect_head, fence=fence)

    async def read(
        self,
        after_offset: int = 0,
        limit: int = 500,
        *,
        types: Mapping[str, type[BaseModel]] | None = None,
        include_archive: bool = False,
    ) -> ReadPage:
        """Same as :meth:`Stream.read`."""
        return await self.stream.read(
            after_offset, limit, types=types, include_archive=include_archive
        )

    async def head(self) -> int:
        """Same as :meth:`Stream.head`."""
        return await self.stream.head()

    async def claim(self, at: float | None) -> None:
        """Claim (or with ``None`` release) a revival at ``at`` under this view's slug."""
        await self.stream.claim(at, claimant=self.slug)

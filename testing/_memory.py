"""In-memory stand-ins for the log and the checkpoint store, for processor tests.

:class:`MemoryStream` keeps the log's commit semantics (SPEC section 2) in a
list: offsets from 1 in commit order, all-or-nothing appends, idempotency keys,
``offset`` preconditions, ephemerals that take an offset and are never stored,
and the read proof, which never passes the durable head. Input is validated by
the same code as the real log, so errors match. After each append it pushes the
committed events to every engine in ``.engines`` without waiting (awaiting
would deadlock a processor that appends during its own batch).

:class:`MemoryStorage` is the real checkpoint table over an in-memory SQLite
database, so tests checkpoint exactly as a host does and can count writes.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import sqlite3
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

from pydantic import BaseModel

from streamkit import ProcessorContract, ProcessorEngine, ReduceCheckpointTable
from streamkit.catalog import EventCatalog
from streamkit.errors import IdempotencyConflict, InvalidRequest, OffsetConflict
from streamkit.events import (
    MAX_OFFSET,
    Appended,
    EventInput,
    ReadPage,
    ScannedRange,
    StreamEvent,
    format_timestamp,
    prepare_events,
    same_body,
    validate_path,
)
from streamkit.log import MAX_READ_LIMIT
from streamkit.protocols import Clock, PayloadTypes, payload_validators

__all__ = ["MemoryStorage", "MemoryStream", "memory_storage", "memory_stream"]


class PushTarget(Protocol):
    """What the pump needs of an engine."""

    def process_event_batch(
        self, events: Sequence[StreamEvent], range: ScannedRange
    ) -> Awaitable[None]: ...


class MemoryStream:
    """One stream path in memory, with the push pump; it is itself the ``ProcessorStream``.

    Attributes tests read: ``events`` (durable, in offset order),
    ``pushed_events`` (every committed event, ephemerals included),
    ``engines`` (push targets), ``claims`` (each ``claim(at)`` call's ``at``, in
    order), ``reads`` (how many reads ran), ``push_errors`` (exceptions raised by
    pushed batches). Set ``drop_pushes = True`` to lose pushes (as a host that
    crashed or lagged would); ``dropped_pushes`` counts them.

    An appended event that names no ``payload_version``, of a type a contract
    defines, is stamped with its current version as a host's log stamps it
    (or read as ``unversioned``, as a host's ``[schema] unversioned``): the
    contracts are ``contracts`` when given, else those of the processors of
    the engines in ``.engines``. Nothing is validated: a malformed payload is
    stored, as one written past a host's door would be.
    """

    def __init__(
        self,
        path: str = "/",
        *,
        clock: Clock = time.time,
        contracts: Iterable[ProcessorContract[Any]] | None = None,
        unversioned: int | None = None,
    ) -> None:
        self._path = validate_path(path)
        self._clock = clock
        self._contracts = None if contracts is None else tuple(contracts)
        self._unversioned = unversioned
        self._catalog: tuple[tuple[int, ...], EventCatalog] | None = None
        self.events: list[StreamEvent] = []
        self._offsets: list[int] = []
        self.pushed_events: list[StreamEvent] = []
        self.engines: list[PushTarget] = []
        self.claims: list[float | None] = []
        self.reads = 0
        self.drop_pushes = False
        self.dropped_pushes = 0
        self.push_errors: list[BaseException] = []
        self._by_key: dict[str, StreamEvent] = {}
        self._last_offset = 0

    def _stamping(self) -> EventCatalog:
        """The catalog that names unnamed versions: of ``contracts``, else of the engines'."""
        contracts = self._contracts
        if contracts is None:
            contracts = tuple(
                engine.processor.contract
                for engine in self.engines
                if isinstance(engine, ProcessorEngine)
            )
        key = tuple(id(contract) for contract in contracts)
        if self._catalog is None or self._catalog[0] != key:
            self._catalog = (key, EventCatalog(contracts, unversioned=self._unversioned))
        return self._catalog[1]

    @property
    def stream(self) -> MemoryStream:
        """The stream to hand to an engine (this object)."""
        return self

    @property
    def path(self) -> str:
        """The stream path."""
        return self._path

    @property
    def head(self) -> int:
        """The durable head: the offset of the last durable event, or 0."""
        return self._offsets[-1] if self._offsets else 0

    @property
    def last_offset(self) -> int:
        """The last offset handed out, ephemerals included."""
        return self._last_offset

    async def append(
        self, *events: EventInput | Mapping[str, Any], expect_head: int | None = None
    ) -> list[StreamEvent]:
        """Append atomically and push the new events to every engine; see the class docstring.

        ``expect_head`` is the log's optimistic-concurrency check: the call is
        refused unless the last durable offset is exactly that.
        """
        prepared = prepare_events(events)
        catalog = self._stamping()
        for item in prepared:
            catalog.stamp(item)
        before = self._last_offset
        offset = before
        committed: list[StreamEvent] = []
        new: list[StreamEvent] = []
        keyed: dict[str, StreamEvent] = {}
        earlier: set[int] = set()
        created_at = format_timestamp(self._clock())
        # Plan the whole call before changing anything, so a refusal leaves no trace.
        for item in prepared:
            key = item.idempotency_key
            if key is not None:
                in_call = keyed.get(key)
                existing = in_call or self._by_key.get(key)
                if existing is not None:
                    if not same_body(item, existing):
                        raise IdempotencyConflict(
                            f'idempotency key "{key}" already names a different event at offset '
                            f"{existing.offset}; nothing was appended (stream {self._path!r}: "
                            "retry with the original body, or use a new key)",
                            details={"key": key, "offset": existing.offset, "path": self._path},
                        )
                    if item.offset is not None and item.offset != existing.offset:
                        raise self._offset_conflict(item.index, item.offset, existing.offset)
                    committed.append(existing)
                    if in_call is None:
                        earlier.add(existing.offset)
                    continue
            if expect_head is not None:
                # Judged at the first new event, as the log does: a retry of a call
                # that landed (all idempotent hits) returns what it wrote.
                if expect_head != self.head:
                    raise OffsetConflict.of_head(self._path, expect_head, self.head)
                expect_head = None
            offset += 1
            if item.offset is not None and item.offset != offset:
                raise self._offset_conflict(item.index, item.offset, offset)
            event = item.decoded(path=self._path, offset=offset, created_at=created_at)
            if key is not None:
                keyed[key] = event
            committed.append(event)
            new.append(event)
        self._last_offset = offset
        for event in new:
            if not event.ephemeral:
                self.events.append(event)
                self._offsets.append(event.offset)
        self._by_key.update(keyed)
        self.pushed_events.extend(new)
        if new:
            self._push(new, ScannedRange(before, offset))
        return Appended(committed, frozenset(earlier)) if earlier else committed

    def _offset_conflict(self, index: int, expected: int, actual: int) -> OffsetConflict:
        return OffsetConflict(
            f"event #{index} expected offset {expected} of {self._path!r} but would land at "
            f"offset {actual}; nothing was appended (read the stream again and retry with the "
            "offset it shows)",
            details={"path": self._path, "index": index, "expected": expected, "actual": actual},
        )

    async def read(
        self,
        after_offset: int = 0,
        limit: int = 500,
        *,
        types: Mapping[str, type[BaseModel]] | None = None,
    ) -> ReadPage:
        """Durable events after ``after_offset``, with the proof of how far the read scanned.

        With ``types``, as the log's ``Stream.read``: payloads of those types
        come validated into their models; one that does not validate, or is
        stored at a version other than 1, stays as stored.
        """
        validators = None if types is None else payload_validators(types)
        for name, value, low, high in (
            ("after_offset", after_offset, 0, MAX_OFFSET),
            ("limit", limit, 1, MAX_READ_LIMIT),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < low
                or (high is not None and value > high)
            ):
                bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
                raise InvalidRequest(
                    f"{name} must be an integer {bounds}, got {value!r}; nothing was read or "
                    "written",
                    details={name: repr(value)},
                )
        self.reads += 1
        start = bisect.bisect_right(self._offsets, after_offset)
        page = self.events[start : start + limit]
        if validators is not None:
            page = [_typed(event, validators) for event in page]
        head = self.head
        if len(page) == limit:
            return ReadPage(page, page[-1].offset, page[-1].offset == head)
        return ReadPage(page, max(after_offset, head), True)

    async def claim(self, at: float | None) -> None:
        """Record the claim (a test that wants the revive calls ``engine.revive()`` itself)."""
        self.claims.append(at)

    def _push(self, events: list[StreamEvent], scanned: ScannedRange) -> None:
        if self.drop_pushes:
            self.dropped_pushes += 1
            return
        for engine in list(self.engines):
            task = asyncio.ensure_future(engine.process_event_batch(events, scanned))
            task.add_done_callback(self._push_settled)

    def _push_settled(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and (error := task.exception()) is not None:
            self.push_errors.append(error)


class MemoryStorage(ReduceCheckpointTable):
    """The real checkpoint table over an in-memory SQLite database; ``writes`` counts writes.

    Close it when done (or use it as a context manager); the plugin's fixture does.
    """

    __slots__ = ("connection",)

    def __init__(self) -> None:
        self.connection = sqlite3.connect(":memory:", isolation_level=None)
        super().__init__(self.connection)

    def close(self) -> None:
        """Close the database (the checkpoints are gone with it)."""
        self.connection.close()

    def __enter__(self) -> MemoryStorage:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def memory_stream(
    path: str = "/",
    *,
    clock: Clock = time.time,
    contracts: Iterable[ProcessorContract[Any]] | None = None,
    unversioned: int | None = None,
) -> MemoryStream:
    """A fresh :class:`MemoryStream` at ``path`` (see the class for ``contracts``)."""
    return MemoryStream(path, clock=clock, contracts=contracts, unversioned=unversioned)


def memory_storage() -> MemoryStorage:
    """A fresh :class:`MemoryStorage` (close it, or use ``with``)."""
    return MemoryStorage()


def _typed(event: StreamEvent, validators: PayloadTypes) -> StreamEvent:
    """``event`` with its payload validated into its type's model, if it has one and validates."""
    validate = validators.get(event.type)
    if validate is None or event.payload_version != 1:
        return event  # another version's payload is not of the model's shape
    try:
        payload = validate({} if event.payload is None else event.payload)
    except Exception:  # refused: stays as stored, for the reader to report
        return event
    return dataclasses.replace(event, payload=payload)

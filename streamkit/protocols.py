"""The extension points and the backend boundary, as Protocols.

Each is a :class:`typing.Protocol`, so any object of the right shape works;
nothing needs to inherit from streamkit classes.

- :class:`ProcessorStream` is all a :class:`~streamkit.engine.ProcessorEngine`
  needs of a stream; the log's streams and ``streamkit.testing.memory_stream``
  both satisfy it.
- :class:`LogBackend` is what a :class:`~streamkit.log.Log` needs of its
  storage: it executes the requests of :mod:`streamkit._requests` (group
  commits, claims, transactions) and serves reads with their proof. The log
  above it validates, batches and fans out; ``streamkit.backends`` holds one
  package per storage engine, and ``open_log(target)`` picks one.

Only protocols are defined here. The records that cross the boundary
(:class:`~streamkit.records.Lease`, :class:`~streamkit.records.LogStats`)
live in :mod:`streamkit.records` and the payload validators of a typed read
in :mod:`streamkit._event_builders`; both are re-exported here, where the
protocols name them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from streamkit._event_builders import PayloadTypes, payload_validators
from streamkit._requests import AppendCall, Connection, FollowJob, Job, PageRead, TransactionJob
from streamkit.checkpoint import ReduceCheckpoint
from streamkit.events import EventInput, ReadPage, StreamEvent
from streamkit.horizon import Hold, Horizon
from streamkit.key_window import KeyWindow
from streamkit.records import (
    RELEASED,
    FirstCheckpoint,
    Lease,
    LeaseAsk,
    LogStats,
    RetentionAsk,
    RetentionRun,
    Segment,
    StoredType,
)

__all__ = [
    "RELEASED",
    "CheckpointStorage",
    "Clock",
    "FirstCheckpoint",
    "HostStore",
    "Lease",
    "LeaseAsk",
    "LeaseExchange",
    "LeaseGuard",
    "LeaseRenewer",
    "LogBackend",
    "LogStats",
    "PayloadTypes",
    "ProcessorStream",
    "RetentionAsk",
    "RetentionVerbs",
    "StoredType",
    "StreamAccess",
    "payload_validators",
]

T = TypeVar("T")

Clock = Callable[[], float]
"""Wall-clock time in epoch seconds (``time.time`` in production; tests pass their own)."""


@runtime_checkable
class StreamAccess(Protocol):
    """One path of a log as a processor may use it itself: read it, append to it.

    What ``args.stream`` gives a processor: the very stream its engine runs
    over, so a host's fencing holds for it (a host that lost the lease writes
    nothing through it).
    """

    @property
    def path(self) -> str:
        """The stream path, e.g. ``/`` or ``/orders``."""
        ...

    async def append(self, *events: EventInput | Mapping[str, Any]) -> list[StreamEvent]:
        """Append atomically; return the committed (or, for ephemerals, pushed) events."""
        ...

    async def read(
        self,
        after_offset: int = 0,
        limit: int = 500,
        *,
        types: Mapping[str, type[BaseModel]] | None = None,
    ) -> ReadPage:
        """Read durable events after ``after_offset`` with the scanned-range proof.

        ``types`` (event type -> pydantic model) is an option of speed: a
        stream may build the payloads of those types as their models, so a
        processor's fold builds each event once. A payload that does not
        validate stays as decoded JSON. A stream may ignore it: the fold
        types what a plain read leaves decoded, so both give the same batch.
        """
        ...


class ProcessorStream(StreamAccess, Protocol):
    """The stream a processor engine runs over: one path of a log, plus the alarm claim."""

    async def claim(self, at: float | None) -> None:
        """Ask to be revived by epoch second ``at``; ``None`` releases the claim."""
        ...


class LogBackend(Protocol):
    """The storage under a :class:`~streamkit.log.Log`: the backend boundary of the log.

    It keeps the log contract of SPEC section 2 for what it is handed: each
    :class:`~streamkit._requests.AppendCall` lands whole or not at all, at
    dense per-path offsets in commit order, with idempotency keys compared by
    body, ``offset`` and ``expect_head`` judged inside the commit, fences run
    before any row and seals after; refusals settle the call with a coded
    error and write nothing. Reads are one snapshot, so a page's
    ``scanned_through_offset`` is a proof. New commits (its own and other
    processes') are published to the feed the log gave it.
    """

    def submit(self, job: Job | FollowJob) -> None:
        """Queue a request; it is executed in submission order and its future settled."""
        ...

    def try_inline(self, jobs: list[AppendCall | TransactionJob]) -> bool:
        """Execute ``jobs`` now on the calling thread if that costs no wait; False if not run."""
        ...

    def follow(self, path: str) -> None:
        """Start publishing other processes' commits on ``path`` to the feed."""
        ...

    def request_close(
        self, waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
    ) -> None:
        """Take no more requests; finish the queued ones, then release the storage."""
        ...

    def shutdown(self) -> None:
        """Close, blocking until the queued requests are done and the storage is released."""
        ...

    def stats(self) -> LogStats:
        """This backend's counters."""
        ...

    def follow_looked_at(self) -> float | None:
        """When (``time.monotonic()``) it last looked for other processes' commits.

        None while nobody follows the log (it then has no reason to look).
        A value that stops moving while followers wait is a follow loop that
        died or hangs: health checks read it.
        """
        ...

    async def query(self, fn: Callable[[Connection], T], what: str = "reading the log") -> T:
        """Run read-only ``fn`` on the backend's read connection."""
        ...

    async def read_sized(self, read: PageRead) -> tuple[ReadPage, int]:
        """The page ``read`` asks for (see :class:`~streamkit._requests.PageRead`).

        The page (with the range it proves scanned) and the size in bytes of
        its stored JSON, which followers count against their budget.
        """
        ...

    async def head(self, path: str) -> int:
        """The highest durable offset of ``path`` (0 if it is empty)."""
        ...

    async def paths(self) -> list[str]:
        """Every path holding at least one durable event, sorted."""
        ...

    async def claims(self, path: str) -> dict[str, float]:
        """Every claim on ``path``: claimant -> due epoch second."""
        ...

    async def stored_types(self, path: str | None = None) -> list[StoredType]:
        """What the log holds per (path, type, payload version), from its summary: no scan.

        Of ``path`` only if given; sorted by path, type and version.
        """
        ...

    def recount_stored_types(self, conn: Connection) -> None:
        """Count the summary again from the events, in the writer's open transaction ``conn``.

        Exact once it commits, even while other writers append (they wait for it).
        """
        ...


@runtime_checkable
class CheckpointStorage(Protocol):
    """Where a :class:`~streamkit.engine.ProcessorEngine` keeps its checkpoints.

    Async so that a host may run the write off the event loop (in its writer
    thread, say). :class:`~streamkit.ReduceCheckpointTable` is the SQLite implementation.
    """

    async def load(self, slug: str, version: str | None = None) -> ReduceCheckpoint | None:
        """The checkpoint of ``slug`` at ``version`` (None: the serving version's), or None."""
        ...

    async def save(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        state_offset: int | None = None,
        retain_from: int | None = None,
    ) -> None:
        """Write the checkpoint of ``(slug, reducer_version)`` in one statement.

        Whether that version serves does not change. ``state_json=None`` keeps the stored state. ``state_offset`` is stored
        as given: ``None`` when the state (written now or kept) is the
        cursor's, else the offset the stored state was reduced through.
        ``retain_from`` is stored as given: the first offset the processor's
        state still needs (:meth:`~streamkit.StreamProcessor.retain_from`),
        which retention keeps (:mod:`streamkit.horizon`). A state over
        :data:`~streamkit.checkpoint.MAX_CHECKPOINT_STATE_BYTES` raises
        :class:`~streamkit.errors.CheckpointTooLarge` and writes nothing.
        """
        ...

    async def fence_serving(self, slug: str) -> None:
        """Before a cutover: make sure the serving version moves no more.

        After it, the serving row's cursor is final: the engine reads it,
        reduces up to it and cuts over there. A store whose writers all hold
        one lease (or none, in a test) has nothing to do; a host's store for a
        version built under a shadow lease takes the serving lease over.
        """
        ...

    async def cut_over(
        self,
        slug: str,
        *,
        reducer_version: str,
        reduced_through_offset: int,
        state_json: str | None,
        replacing: str | None,
        retain_from: int | None = None,
    ) -> None:
        """Write this version's checkpoint and make it the serving one, in one transaction.

        Only while ``replacing`` (the version it was built to replace, None
        when none served) still serves at or below ``reduced_through_offset``:
        else :class:`~streamkit.errors.CutoverRaced` and nothing is written
        (:func:`~streamkit.checkpoint.check_cutover`). The replaced row is kept.
        """
        ...


@runtime_checkable
class IncidentStorage(Protocol):
    """A checkpoint storage that also keeps each version's skips (what a host's does).

    What an engine skipped (:mod:`streamkit.engine._skip_tally`) is written
    with its checkpoint: the engine stages the tally before a write, and the
    storage writes it in that write's transaction (``save`` or
    ``cut_over``), so no checkpoint moves past a skip its tally does not
    hold. A failed write leaves it staged; the next one carries it.
    """

    def stage_incidents(self, slug: str, version: str, record_json: str) -> None:
        """Have the next checkpoint write of ``slug`` at ``version`` carry ``record_json``."""
        ...

    async def load_incidents(self, slug: str, version: str) -> str | None:
        """The tally stored for ``slug`` at ``version`` (JSON), or None if none was."""
        ...


@dataclass(frozen=True, slots=True)
class LeaseExchange:
    """A version built under a shadow lease: at its cutover, the serving lease becomes its own.

    ``shadow()`` is the shadow lease as held now (released in the cutover's
    transaction); ``taken(lease, started)`` is told the serving lease once it
    committed, with the monotonic instant its taking statement was sent.
    """

    slug: str
    owner: str
    ttl: float
    clock: Clock
    shadow: Callable[[], Lease]
    taken: Callable[[Lease, float], None]


class LeaseGuard(Protocol):
    """A lease a host holds, as a write asks of it: may this host still write under it?"""

    def check(self) -> None:
        """Raise :class:`~streamkit.errors.LeaseLost` unless the lease is in force locally."""
        ...

    def fence(self, conn: Connection) -> None:
        """Inside a write transaction: the local check, then the stored lease row."""
        ...


class LeaseRenewer(Protocol):
    """A connection of its own that renews leases off the event loop (the host's keeper thread).

    Blocking by design: it runs on a thread, so renewals go on while the
    loop is busy with a long batch.
    """

    def renew(self, lease: Lease, now: float, ttl: float) -> Lease:
        """Renew ``lease`` in its own transaction; LeaseLost if another holds it now."""
        ...

    def close(self) -> None:
        """Release the connection (a later :meth:`renew` reconnects)."""
        ...


class RetentionVerbs(Protocol):
    """Retention's reads and verbs on one log: horizons, holds, key windows, runs, the archive.

    See docs/retention.md; every verb writes its record and a control event in
    one transaction, or nothing.
    """

    async def horizons(self, now: float, path: str | None = None) -> list[Horizon]:
        """The retention horizon of every path (or of ``path``), with what holds each back."""
        ...

    async def place_hold(self, hold: Hold) -> StreamEvent:
        """Place an operator's ``hold`` (checked): its row and its control event, at once."""
        ...

    async def release_hold(self, path: str, name: str, *, by: str, reason: str) -> StreamEvent:
        """Release the hold ``name`` of ``path``: its row goes with its control event."""
        ...

    async def forget_processor(
        self, slug: str, version: str | None, *, by: str, reason: str, now: float, ttl: float
    ) -> StreamEvent:
        """Delete ``slug``'s checkpoint rows (all, or ``version``'s) with their control event.

        Refused while a host that beat within ``ttl`` of ``now`` runs it.
        """
        ...

    async def key_window(self, path: str) -> KeyWindow | None:
        """``path``'s key window: how long keys of taken events answer (None: forever)."""
        ...

    async def set_key_window(
        self, path: str, keep_for: float | None, *, by: str, reason: str, now: float
    ) -> StreamEvent:
        """Give ``path`` a key window of ``keep_for`` seconds (None: forever), with its record."""
        ...

    async def run(self, ask: RetentionAsk) -> RetentionRun:
        """Take ``ask.path``'s history below its horizon (through ``ask.through``).

        Archived or deleted as the ask says (:class:`~streamkit.records.RetentionAsk`):
        the newest ``keep_for`` seconds and ``keep_last`` offsets stay; its
        ``fence`` runs first in every cut's transaction; while other writes go
        through the log's writer, the run takes at most ``share`` of its time,
        pausing between cuts. Then the keys the path's key window lets go are
        forgotten.
        """
        ...

    async def segments(self, path: str | None = None) -> list[Segment]:
        """The recorded archive segments (of ``path`` only), by path and range."""
        ...

    async def verify_archive(self, path: str | None = None) -> list[str]:
        """Every problem of the recorded archive segments and their chain (empty: proven)."""
        ...


class HostStore(Protocol):
    """What a host keeps beside the log, in the log's own storage: the host half of a backend.

    Leases (one holder per ``(path, slug)``, fencing generations, takeover
    only of a row watched unrenewed), fenced checkpoints, operator skips with
    their records, the host registry and the durable status. Every write
    that a lease guards runs its fence inside the same transaction.
    """

    async def prepare(self) -> None:
        """Create what the host keeps (idempotent, safe when several hosts start at once)."""
        ...

    async def read_lease(self, path: str, slug: str) -> Lease | None:
        """The stored lease of ``(path, slug)``, or None if none was ever taken."""
        ...

    async def try_acquire(self, ask: LeaseAsk) -> Lease | None:
        """Take a free (or released, or ``ask.stale`` and unchanged) lease; None if another holds it."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give ``lease`` up, keeping its generation; False if it was no longer held."""
        ...

    def check_fence(self, conn: Connection, lease: Lease, now: float) -> None:
        """Inside a write transaction: LeaseLost unless ``lease`` is the stored, unexpired row."""
        ...

    def lease_renewer(self, timeout: float) -> LeaseRenewer:
        """A renewer with a connection of its own (waits at most ``timeout`` for a lock)."""
        ...

    def checkpoints(
        self, guard: LeaseGuard, path: str = "/", exchange: LeaseExchange | None = None
    ) -> CheckpointStorage:
        """Checkpoint storage whose every save is fenced by ``guard`` in its transaction.

        ``path`` is where a cutover's control event goes; ``exchange`` is
        given for a version built under a shadow lease:
        its cutover takes the serving lease over in the same transaction.
        """
        ...

    async def begin_processor(
        self, guard: LeaseGuard, path: str, first: FirstCheckpoint
    ) -> StreamEvent:
        """A new processor's first checkpoint with its ``streamkit.processor-began`` record
        on ``path``, in one transaction fenced by ``guard``; refused if it has a checkpoint."""
        ...

    async def version_rows(
        self, slug: str, version: str
    ) -> tuple[ReduceCheckpoint | None, ReduceCheckpoint | None]:
        """``(serving, own)``: the slug's serving checkpoint and ``version``'s, each None if none."""
        ...

    async def checkpoint_versions(self, slug: str) -> list[ReduceCheckpoint]:
        """Every version's checkpoint of ``slug``: the serving one first, then by version."""
        ...

    async def version_incidents(self, slug: str) -> dict[str, dict[str, Any]]:
        """``{version: skip tally}`` of every version of ``slug`` that kept one (see
        :mod:`streamkit.engine._skip_tally`)."""
        ...

    async def reinstate(self, slug: str, version: str) -> bool:
        """Lift the retirement of ``slug``'s ``version`` (a rollback); whether one was lifted."""
        ...

    async def stored_snapshot(self, slug: str) -> dict[str, Any]:
        """``{offset, state, version, source}`` of ``slug``'s checkpoint; InvalidRequest if none."""
        ...

    async def load_skips(self) -> dict[tuple[str, str], dict[int, int]]:
        """Every recorded skip: ``(path, slug) -> {offset: offset of its skip event}``.

        Only :meth:`record_skip` writes them, and a host obeys these records
        alone, never a skip event found in the log without one.
        """
        ...

    async def record_skip(
        self,
        path: str,
        slug: str,
        offset: int,
        *,
        by: str,
        reason: str,
        ahead: bool = False,
        stalled_at: int | None = None,
    ) -> StreamEvent:
        """Skip ``offset`` for ``slug``: the skip event and its record in one transaction.

        An offset other than where the processor is stalled (``stalled_at``, as its
        host knows it; else its next event past its checkpoint) is refused unless
        ``ahead`` says the operator means it.
        """
        ...

    async def register(self, owner: str, socket: str, pid: int, now: float) -> None:
        """Enter this host in the registry (where its control socket is)."""
        ...

    async def deregister(self, owner: str) -> None:
        """Remove this host from the registry."""
        ...

    async def host_beat(self, owner: str, processors: list[str], now: float) -> None:
        """Record that ``owner`` is alive and which processors (``slug@path``) it runs."""
        ...

    async def live_hosts(self, now: float, ttl: float) -> dict[str, list[str]]:
        """The hosts whose latest beat is within ``ttl``: owner -> the processors it runs."""
        ...

    async def leases(self) -> list[Lease]:
        """Every stored lease row (held, expired or released)."""
        ...

    async def durable_status(self, now: float | None = None) -> list[dict[str, Any]]:
        """One row per known ``(path, slug)``: version, cursor, head, lag, lease and claim."""
        ...

    async def durable_lag(self, path: str, cursor: int) -> int:
        """Durable events of ``path`` after ``cursor``."""
        ...

    @property
    def retention(self) -> RetentionVerbs:
        """Retention's reads and verbs on this log (one part, whatever the backend)."""
        ...

    async def stream_heads(self) -> list[tuple[str, int]]:
        """Every path that holds a durable event, with its durable head, sorted by path."""
        ...

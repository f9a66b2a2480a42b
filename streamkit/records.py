"""The plain records that cross the backend boundary: a stored lease, a log's counters,
what a log stores of each event type, an archived segment, what a retention run did,
and the asks a host hands a backend (a lease to take, a processor's first checkpoint,
a retention run).

Values, not protocols: a backend builds the records and the layers above read
them; the layers above build the asks and a backend reads them. An ask is one
value so that every layer between the caller and the statements passes it on
in one line: a new field is one edit where it is made and one where it is read.
:mod:`streamkit.protocols` names them in its protocols and re-exports them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamkit.history import RETENTION_CHUNK

__all__ = [
    "RELEASED",
    "FirstCheckpoint",
    "Lease",
    "LeaseAsk",
    "LogStats",
    "RetentionAsk",
    "RetentionRun",
    "Segment",
    "StoredType",
]


@dataclass(frozen=True, slots=True)
class LogStats:
    """Counters of one open log since it was opened (this process only)."""

    transactions: int
    """Write transactions committed (a group of appends counts once)."""
    appended: int
    """Durable events written (idempotent retries excluded)."""
    ephemeral: int
    """Offsets handed to ephemeral events."""
    ephemeral_reservations: int
    """Writes that reserved a block of offsets for ephemerals."""
    refused: int
    """Append and claim calls refused (their effects rolled back)."""
    frozen_sessions_ended: int = 0
    """Sessions of frozen processes this log's writer ended because they held locks it
    waited for past its lock timeout (PostgreSQL; see docs/postgres.md)."""


RELEASED = -math.inf
"""The ``expires_at`` of a lease its holder gave up: expired at every instant, and
telling "given up" apart from "timed out"."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease as stored: who holds ``(path, slug)``, under which generation, until when."""

    path: str
    slug: str
    owner: str
    generation: int
    expires_at: float
    """Epoch seconds by the holder's clock; ``-inf`` once the holder released it."""
    beat: int = 0
    """Renewals under this generation: a taker watches it to see the holder is alive."""

    def same_row(self, other: Lease) -> bool:
        """Whether ``other`` is this row unchanged: same owner, generation and beat."""
        return (self.owner, self.generation, self.beat, self.expires_at) == (
            other.owner,
            other.generation,
            other.beat,
            other.expires_at,
        )

    @property
    def released(self) -> bool:
        """Whether the holder gave the lease up (rather than letting it expire)."""
        return self.expires_at == RELEASED

    def held_at(self, now: float) -> bool:
        """Whether the lease is still in force at epoch second ``now``."""
        return now < self.expires_at

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for status output (``expires_at`` is ``None`` once released)."""
        return {
            "path": self.path,
            "slug": self.slug,
            "owner": self.owner,
            "generation": self.generation,
            "expires_at": None if self.released else self.expires_at,
            "beat": self.beat,
            "released": self.released,
        }


@dataclass(frozen=True, slots=True)
class LeaseAsk:
    """A lease to take: ``(path, slug)`` for ``owner`` from epoch second ``now`` for ``ttl``.

    ``stale`` is another holder's row the caller watched go unrenewed for a ttl
    of its own monotonic time: it is taken over only if still exactly that row.
    The statements check each field (InvalidRequest, nothing written).
    """

    path: str
    slug: str
    owner: str
    now: float
    ttl: float
    stale: Lease | None = None


@dataclass(frozen=True, slots=True)
class FirstCheckpoint:
    """A new processor's first checkpoint: ``slug`` at ``version`` begins after ``after``.

    ``state_json`` is its initial state, ``start`` where it declared it
    starts (``beginning``, ``now`` or an offset, as written in its record),
    ``by`` who began it.
    """

    slug: str
    version: str
    state_json: str
    start: str
    after: int
    by: str


@dataclass(frozen=True, slots=True)
class RetentionAsk:
    """A retention run of ``path``: what to take, where it goes, and how fast.

    ``through`` caps the run (default: all below the horizon); ``archive`` is
    an absolute directory for the segment files (None deletes); ``chunk``
    events go per transaction; the ``keep_for`` seconds of newest events and
    the ``keep_last`` newest offsets stay; ``fence`` runs first in every
    cut's transaction (a host passes its lease's); ``share`` (0 < share <= 1)
    is the most of the writer's time the run takes while other writes go on.
    """

    path: str
    through: int | None = None
    archive: str | None = None
    chunk: int = RETENTION_CHUNK
    keep_for: float | None = None
    keep_last: int | None = None
    fence: Callable[[Any], None] | None = None
    share: float = 1.0


@dataclass(frozen=True, slots=True)
class StoredType:
    """What a log holds of one event type at one payload version on one path.

    Exact after every commit this release (or a later one) made: kept by the
    writer with the rows it counts (on SQLite settled in steps, reads adding
    the newest rows: docs/log.md); see
    docs/schema-evolution.md for a log a writer of an earlier release still
    appends to.
    """

    path: str
    type: str
    version: int
    """The version of the payload's shape (1 for events stored without one)."""
    count: int
    """Durable events of this type and version on the path."""
    first_offset: int
    last_offset: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (``streamkit schema check --json``, the HTTP API)."""
        return {
            "path": self.path,
            "type": self.type,
            "version": self.version,
            "count": self.count,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
        }


@dataclass(frozen=True, slots=True)
class Segment:
    """One archived range of a path, as the log records it (and :func:`check_segment` proves)."""

    path: str
    first: int
    last: int
    count: int
    bytes: int
    file: str
    """Where the segment lives: a file path."""
    sha256: str
    prev_sha256: str | None
    """The previous segment's hash on the path (None: the first segment of the path)."""


@dataclass(slots=True)
class RetentionRun:
    """What one run of one path did."""

    path: str
    mode: str
    horizon: int
    start_before: int
    start_after: int
    events: int = 0
    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    segments: list[Segment] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)
    keys_forgotten: int = 0
    """Idempotency keys of taken events the path's key window let go (see
    :mod:`streamkit.key_window`); 0 on a path whose keys are kept forever."""
    pages_reclaimed: int = 0
    """Database pages the run gave back to the file system (SQLite files made with
    incremental vacuum; 0 where the server reuses the space itself)."""
    paused_seconds: float = 0.0
    """Seconds the run waited between cuts to leave the log's writer to other writes
    (its ``share``); 0 when nothing else wrote or the share was 1."""
    stopped_by: str = "horizon"
    """What the run stopped at: ``horizon``, ``through``, ``keep_for``, ``keep_last``, or
    ``own_records`` (what was left to take was only earlier runs' records, or no event)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "mode": self.mode,
            "horizon": self.horizon,
            "start_before": self.start_before,
            "start_after": self.start_after,
            "events": self.events,
            "chunks": self.chunks,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "segments": [s.file for s in self.segments],
            "orphans_removed": self.orphans_removed,
            "keys_forgotten": self.keys_forgotten,
            "pages_reclaimed": self.pages_reclaimed,
            "paused_seconds": round(self.paused_seconds, 3),
            "stopped_by": self.stopped_by,
        }

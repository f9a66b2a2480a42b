"""One chunk's cut, whatever the backend: what its transaction writes and checks.

A retention run (:mod:`.run`) cuts a path's history a chunk at a time, each
in ONE transaction, the :data:`~streamkit.history.TRUNCATED_EVENT` control
event's. Before the event takes the path's head, :func:`taken` runs the
caller's fence (a host's lease: lost, nothing is written) and the first half
of the cut (:meth:`TruncationRows.take`: the start is unmoved, the segment and
the keys' body hashes recorded, the rows deleted); after it, :func:`sealed`
reads the horizon again inside the transaction and refuses a chunk that
reaches it (a hold placed meanwhile, a processor registered), then moves the
path's start (:meth:`TruncationRows.move_start`). Either half refusing rolls
the whole cut back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from streamkit._requests import Connection
from streamkit.backends._retention.key_windows import KeyWindowRows
from streamkit.backends._retention.rules import RetentionRows, horizon_in
from streamkit.backends._stored import Row
from streamkit.errors import InvalidRequest
from streamkit.events import StreamEvent
from streamkit.history import TRUNCATED_EVENT
from streamkit.records import Segment

__all__ = [
    "Cut",
    "TruncationRows",
    "check_start_unmoved",
    "sealed",
    "segment_values",
    "taken",
    "truncated_event",
]


@dataclass(frozen=True, slots=True)
class Cut:
    """One chunk's change, as its transaction writes it."""

    path: str
    after: int
    """The path's start before the cut, minus one (what it must still be)."""
    through: int
    segment: Segment | None
    keys: list[tuple[str, int, str, str]]
    """``(key, offset, body_sha256, created_at)`` of each keyed event taken."""
    types: dict[tuple[str, int], int]
    """Events deleted per stored ``(type, payload version)`` (none when archived)."""


def check_start_unmoved(cut: Cut, through: int) -> None:
    """Inside a cut's transaction: InvalidRequest unless the path was cut through ``cut.after``."""
    if through != cut.after:
        raise InvalidRequest(
            f"{cut.path!r} was cut through {through} by another run meanwhile (this one began "
            f"at {cut.after}); nothing was written",
            details={"path": cut.path, "through": through},
        )


def segment_values(segment: Segment) -> tuple[str, int, int, int, int, str, str, str | None]:
    """A segment's row, in the order of its columns (path .. prev_sha256)."""
    return (
        segment.path,
        segment.first,
        segment.last,
        segment.count,
        segment.bytes,
        segment.file,
        segment.sha256,
        segment.prev_sha256,
    )


class TruncationRows(RetentionRows, KeyWindowRows, Protocol):
    """A backend's start, segments and rows, key windows, and the one write of a cut."""

    def truncated_through(self, conn: Connection, path: str) -> int:
        """The offset ``path``'s history was taken through (0: none was)."""
        ...

    def segments(self, conn: Connection, path: str | None) -> list[Segment]:
        """The recorded segments (of ``path`` only, if given), by path and range."""
        ...

    def stored_rows(
        self, conn: Connection, path: str, after: int, through: int, limit: int
    ) -> list[Row]:
        """The stored rows of ``path`` in ``(after, through]``, ascending, at most ``limit``."""
        ...

    def reclaim_step(self, conn: Connection) -> int:
        """After the cuts, inside one write transaction of the log's writer: give back at
        most a short step of freed space; the pages given (0: nothing more now).

        A run repeats it, so appends go on between the steps.
        """
        ...

    def take(self, conn: Connection, cut: Cut) -> int:
        """In the control event's transaction, before its row: the first half of ``cut``.

        Checks the path's start is still ``cut.after`` + 1 (InvalidRequest,
        nothing written, if another run cut meanwhile; two runs of one path
        must not both get past this check), records the segment and the
        keys' body hashes and deletes the rows: the rows that cost time and
        that no append touches, so it runs before the path's head is taken.
        The rows it deleted.
        """
        ...

    def move_start(self, conn: Connection, cut: Cut) -> None:
        """In the same transaction, after the control event's row: the rest of ``cut``.

        Takes the deleted events out of the summary of stored types (which
        appends to the path also move) and moves the path's start.
        """
        ...


def truncated_event(cut: Cut, mode: str, count: int) -> dict[str, Any]:
    segment = cut.segment
    payload: dict[str, Any] = {
        "through": cut.through,
        "mode": mode,
        "count": count,
        "segment": None
        if segment is None
        else {
            "file": segment.file,
            "first": segment.first,
            "last": segment.last,
            "sha256": segment.sha256,
            "prev_sha256": segment.prev_sha256,
            "bytes": segment.bytes,
        },
    }
    return {"type": TRUNCATED_EVENT, "payload": payload}


def taken(
    rows: TruncationRows, cut: Cut, fence: Callable[[Connection], None] | None
) -> Callable[[Connection], None]:
    def take(conn: Connection) -> None:
        if fence is not None:
            fence(conn)  # a host's run: its lease, first, or nothing is written
        rows.take(conn, cut)

    return take


def sealed(
    rows: TruncationRows, cut: Cut, clock: Callable[[], float]
) -> Callable[[Connection, list[StreamEvent]], None]:
    def seal(conn: Connection, events: list[StreamEvent]) -> None:
        # The horizon again, inside the cut's transaction and after the control event
        # took the path's head: a hold (placed by a control event on the path, so it
        # committed before or waits) or a processor that appeared since the run began
        # holds here too, and the rows taken first go back with the refusal.
        horizon = horizon_in(rows.facts(conn), cut.path, clock())
        if cut.through >= horizon.offset:
            held = ", ".join(f"{n.kind} {n.name}" for n in horizon.held_by) or "nothing"
            raise InvalidRequest(
                f"retention of {cut.path!r} through {cut.through} refused: the horizon is "
                f"{horizon.offset} now (held by {held}); nothing was written",
                details={"path": cut.path, "through": cut.through, "horizon": horizon.offset},
            )
        rows.move_start(conn, cut)

    return seal

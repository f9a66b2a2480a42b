"""What one version of a processor skipped: counted once per event, and kept with its checkpoint.

A processor that chose ``skip`` (``on_malformed``, ``on_reduce_error``)
moves past a payload that does not validate, or an event its reduce raises
on; an upcaster that returns DROP drops an event on purpose. Each is
counted here, per stored (type, version) for payloads and per type for
reduces, with the first :data:`FIRST_OFFSETS_KEPT` offsets of each and the
latest incident (``{offset, type, error, traceback}``).

The guarantees:

- An event is counted once per version, however often it is folded: a
  batch retried after a failed write, a deferred state's events replayed at
  start, a shadow build resumed from its row. ``through`` is the highest
  offset counted; an event at or below it is not counted again.
- The tally travels with the checkpoint: a host's checkpoint storage that
  keeps it (:class:`~streamkit.protocols.IncidentStorage`) writes
  :meth:`SkipTally.record` in the transaction of the next checkpoint after a
  change, so the checkpoint never moves past a skip its tally does not
  hold, and a restart goes on counting from there
  (:meth:`SkipTally.restore`). That is how a version's counts stay on its
  row after it served, for ``processor versions`` and a cutover's check.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FIRST_OFFSETS_KEPT", "SkipTally", "shown_tally"]

FIRST_OFFSETS_KEPT = 5
"""How many offsets of each skipped kind the tally lists: where to start looking."""


class SkipTally:
    """The skips of one version of a processor (see the module)."""

    __slots__ = (
        "_failed_kinds",
        "_malformed_kinds",
        "changes",
        "dropped",
        "last_malformed",
        "last_reduce_failure",
        "malformed",
        "reduce_failures",
        "through",
    )

    def __init__(self) -> None:
        self.malformed = 0
        self.reduce_failures = 0
        self.dropped = 0
        self.last_malformed: dict[str, Any] | None = None
        self.last_reduce_failure: dict[str, Any] | None = None
        # Per stored (type, version) / per type: [count, first offsets...].
        self._malformed_kinds: dict[tuple[str, int], list[int]] = {}
        self._failed_kinds: dict[str, list[int]] = {}
        self.through = 0
        """The highest offset counted: an event at or below it is counted already."""
        self.changes = 0
        """How many counts changed since this tally was made: a write compares it."""

    @property
    def skipped(self) -> int:
        """Events skipped without the user's code asking for it (malformed, failed reduce)."""
        return self.malformed + self.reduce_failures

    def _first_time(self, offset: int) -> bool:
        if offset <= self.through:
            return False
        self.through = offset
        self.changes += 1
        return True

    def malformed_payload(self, offset: int, etype: str, version: int, incident: Any) -> None:
        """A payload skipped because it does not validate (``incident``: its latest form)."""
        if not self._first_time(offset):
            return
        self.malformed += 1
        self.last_malformed = incident
        _count(self._malformed_kinds, (etype, version), offset)

    def reduce_failure(self, offset: int, etype: str, incident: Any) -> None:
        """An event skipped because its reduce raised (the state kept)."""
        if not self._first_time(offset):
            return
        self.reduce_failures += 1
        self.last_reduce_failure = incident
        _count(self._failed_kinds, etype, offset)

    def drop(self, offset: int) -> None:
        """An event an upcaster dropped (it returned DROP)."""
        if self._first_time(offset):
            self.dropped += 1

    def malformed_by_type(self) -> tuple[dict[str, Any], ...]:
        """Skipped payloads per stored (type, version): count and first offsets, in type order."""
        return tuple(
            {"type": etype, "version": version, "count": kept[0], "first_offsets": kept[1:]}
            for (etype, version), kept in sorted(self._malformed_kinds.items())
        )

    def reduce_failures_by_type(self) -> tuple[dict[str, Any], ...]:
        """Failed reduces per type: count and first offsets, in type order."""
        return tuple(
            {"type": etype, "count": kept[0], "first_offsets": kept[1:]}
            for etype, kept in sorted(self._failed_kinds.items())
        )

    def record(self) -> dict[str, Any]:
        """The tally as JSON-ready data: what a checkpoint storage keeps (see the module)."""
        return {
            "through": self.through,
            "malformed_payloads": self.malformed,
            "reduce_failures": self.reduce_failures,
            "dropped_events": self.dropped,
            "malformed_by_type": list(self.malformed_by_type()),
            "reduce_failures_by_type": list(self.reduce_failures_by_type()),
            "last_malformed": self.last_malformed,
            "last_reduce_failure": self.last_reduce_failure,
        }

    def restore(self, record: dict[str, Any]) -> None:
        """Go on from a stored :meth:`record` (a restart, a resumed build); unknown keys ignored."""
        self.through = int(record.get("through") or 0)
        self.malformed = int(record.get("malformed_payloads") or 0)
        self.reduce_failures = int(record.get("reduce_failures") or 0)
        self.dropped = int(record.get("dropped_events") or 0)
        self.last_malformed = record.get("last_malformed")
        self.last_reduce_failure = record.get("last_reduce_failure")
        self._malformed_kinds = {
            (str(kind["type"]), int(kind["version"])): [
                int(kind["count"]),
                *map(int, kind["first_offsets"]),
            ]
            for kind in record.get("malformed_by_type") or ()
        }
        self._failed_kinds = {
            str(kind["type"]): [int(kind["count"]), *map(int, kind["first_offsets"])]
            for kind in record.get("reduce_failures_by_type") or ()
        }


def shown_tally(record: dict[str, Any] | None) -> dict[str, Any]:
    """The counts of a kept :meth:`SkipTally.record` as ``processor versions`` shows them.

    Every count is 0 for a version that kept none (it skipped nothing, or ran
    before tallies were kept).
    """
    record = record or {}
    return {
        "malformed_payloads": int(record.get("malformed_payloads") or 0),
        "reduce_failures": int(record.get("reduce_failures") or 0),
        "dropped_events": int(record.get("dropped_events") or 0),
        "malformed_by_type": list(record.get("malformed_by_type") or ()),
        "reduce_failures_by_type": list(record.get("reduce_failures_by_type") or ()),
    }


def _count(kinds: dict[Any, list[int]], kind: Any, offset: int) -> None:
    kept = kinds.get(kind)
    if kept is None:
        kinds[kind] = [1, offset]
        return
    kept[0] += 1
    if len(kept) <= FIRST_OFFSETS_KEPT:
        kept.append(offset)

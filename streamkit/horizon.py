"""The horizon of a path: the lowest offset retention must keep, and who holds it there.

Events of a path may go (archived or deleted) only below its *horizon*, the
least of what every consumer still needs:

- every checkpoint row on the path, running or not, serving, building in the
  shadow or retired by a cutover (a rollback resumes from it): the offset
  after its cursor, the offset after its state's own offset when the stored
  state lags the cursor (a restart reduces from there again), and what the
  state says it needs (:meth:`~streamkit.StreamProcessor.retain_from`);
- every checkpoint row whose path is unknown (written by a store that was
  not told it): it may read any path, so it holds each one where it stands;
- every processor a host runs on the path that has no checkpoint row yet: it
  will start from the beginning;
- every operator hold on the path that has not expired.

With nothing known on a path its horizon is past its head: nothing there is
anyone's to keep. The rule is pure (:func:`horizon_of`); the backends only
read the rows it takes. A processor leaves the rule only when an operator
forgets it (``streamkit processor forget``), never because it stopped; holds
are placed and released by audited verbs (:mod:`streamkit.holds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "CheckpointNeed",
    "Hold",
    "Horizon",
    "Need",
    "abandoned_if_gone",
    "horizon_of",
    "needs_of",
]

NeedKind = Literal["processor", "hold", "unstarted"]
NeedWhy = Literal["cursor", "state", "retain_from", "hold", "no checkpoint"]


@dataclass(frozen=True, slots=True)
class CheckpointNeed:
    """The columns of one checkpoint row the horizon reads."""

    path: str | None
    slug: str
    version: str
    cursor: int
    state_offset: int | None
    retain_from: int | None
    serving: bool
    retired_at: int | None


@dataclass(frozen=True, slots=True)
class Hold:
    """An operator's hold: every event of ``path`` from ``from_offset`` on is kept.

    ``until`` (epoch seconds) ends it by itself; None holds until released.
    """

    path: str
    name: str
    from_offset: int
    until: float | None
    placed_by: str
    reason: str
    placed_at: float

    def in_force(self, now: float) -> bool:
        """Whether the hold still holds at ``now``."""
        return self.until is None or now < self.until


@dataclass(frozen=True, slots=True)
class Need:
    """One consumer's need on a path: the first offset it must still be able to read."""

    kind: NeedKind
    name: str
    """``slug@version`` for a processor, the hold's name for a hold."""
    from_offset: int
    why: NeedWhy
    state: str = ""
    """For a processor: ``serving``, ``shadow``, ``retired``, or ``abandoned`` (a shadow
    row that needs history the path no longer holds: it can never be built from there, and
    holds nothing); else empty."""

    def to_dict(self) -> dict[str, object]:
        shown: dict[str, object] = {
            "kind": self.kind,
            "name": self.name,
            "from": self.from_offset,
            "why": self.why,
        }
        if self.state:
            shown["state"] = self.state
        return shown


@dataclass(frozen=True, slots=True)
class Horizon:
    """Where retention may cut a path: every event below ``offset`` is no one's to keep."""

    path: str
    head: int
    offset: int
    needs: tuple[Need, ...]
    """Every need on the path, lowest first."""
    start: int = 1
    """The first offset the path still holds (after what retention took)."""
    archived_segments: int = 0
    archived_bytes: int = 0
    keys_kept_for: float | None = None
    """How long keys of taken events answer, in seconds (None: forever; see
    :mod:`streamkit.key_window`)."""

    @property
    def held_by(self) -> tuple[Need, ...]:
        """The needs that hold the horizon below the head's next offset (those at its offset,
        or below it when the horizon stands at the path's start).

        Empty when nothing of the path is held: every consumer is past its head.
        """
        if self.offset > self.head:
            return ()
        return tuple(
            need
            for need in self.needs
            if need.from_offset <= self.offset and need.state != "abandoned"
        )

    @property
    def releasable(self) -> int:
        """How many offsets lie below the horizon (an upper bound on the events that may go)."""
        return self.offset - 1

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "head": self.head,
            "start": self.start,
            "horizon": self.offset,
            "archived_segments": self.archived_segments,
            "archived_bytes": self.archived_bytes,
            "keys_kept_for": self.keys_kept_for,
            "held_by": [need.to_dict() for need in self.held_by],
            "needs": [need.to_dict() for need in self.needs],
        }


def needs_of(row: CheckpointNeed) -> Need:
    """What one checkpoint row needs: the least of its three reasons, named."""
    need: int = row.cursor + 1
    why: NeedWhy = "cursor"
    if row.state_offset is not None and row.state_offset + 1 < need:
        need, why = row.state_offset + 1, "state"
    if row.retain_from is not None and row.retain_from < need:
        need, why = row.retain_from, "retain_from"
    if row.serving:
        state = "serving"
    elif row.retired_at is not None:
        state = "retired"
    else:
        state = "shadow"
    return Need("processor", f"{row.slug}@{row.version}", max(1, need), why, state)


def abandoned_if_gone(need: Need, start: int) -> Need:
    """``need`` as shown where the path's first offset is ``start``.

    A shadow row that needs an offset below ``start`` was taken by retention
    before it could be built (a build that meets it stops, ``cannot-build``):
    it is shown as ``abandoned``, never as what holds the horizon. Roll back,
    ``streamkit processor forget SLUG --version V``, or start the version from
    the path's start.
    """
    if need.kind == "processor" and need.state == "shadow" and need.from_offset < start:
        return replace(need, state="abandoned")
    return need


def horizon_of(
    path: str,
    head: int,
    rows: Iterable[CheckpointNeed],
    holds: Iterable[Hold],
    running: Sequence[str],
    now: float,
) -> Horizon:
    """The horizon of ``path`` (see the module docstring).

    ``rows`` may hold every path's rows; those of other paths are left out,
    those with no path count here. ``running`` are the slugs hosts run on
    ``path``; one without a row of its own needs the path from its start.
    """
    needs: list[Need] = []
    slugs: set[str] = set()
    for row in rows:
        if row.path is not None and row.path != path:
            continue
        slugs.add(row.slug)
        needs.append(needs_of(row))
    for hold in holds:
        if hold.path == path and hold.in_force(now):
            needs.append(Need("hold", hold.name, max(1, hold.from_offset), "hold"))
    for slug in sorted(set(running) - slugs):
        needs.append(Need("unstarted", slug, 1, "no checkpoint"))
    needs.sort(key=lambda need: (need.from_offset, need.kind, need.name))
    offset = min([head + 1, *(need.from_offset for need in needs)])
    return Horizon(path, head, offset, tuple(needs))

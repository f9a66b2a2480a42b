"""At start: a new processor on a path whose history was taken must say where it starts.

A processor that never ran on its path (no checkpoint of its slug) folds
the path from offset 1. Where retention took the path's oldest events that
is possible only from the archive, and it may not be what the processor
needs at all (a dashboard of recent activity has no use for years of
history). So a host refuses to start while such a processor does not
declare where it starts (``start`` of its contract or of its
``[[processors]]`` table, :data:`~streamkit.contract.StartFrom`):

- ``beginning``: from offset 1, reading the archive; refused too when part
  of the history was deleted with no archive, since the state could not be
  built;
- ``start``: from the path's start; ``head``: from the head as it is when
  the processor first runs. Either is recorded by a
  :data:`~streamkit.checkpoint.BEGAN_EVENT` in the transaction of its first
  checkpoint (:mod:`._runner`).

The refusal is :class:`~streamkit.errors.HistoryTruncated`, before any
lease is taken; nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamkit.contract import StartFrom
from streamkit.errors import HistoryTruncated
from streamkit.protocols import HostStore
from streamkit.records import Segment

__all__ = ["check_new_processors"]


async def check_new_processors(
    store: HostStore, processors: Sequence[tuple[str, str, StartFrom | None]], now: float
) -> None:
    """Refuse the start if a new processor ``(slug, path, start)`` cannot start as declared."""
    starts = {horizon.path: horizon.start for horizon in await store.retention.horizons(now)}
    problems: list[str] = []
    details: list[dict[str, object]] = []
    for slug, path, start in processors:
        first = starts.get(path, 1)
        if first <= 1 or start in ("start", "head"):
            continue
        if await store.checkpoint_versions(slug):
            continue  # it ran here before: it resumes from its checkpoint
        segments = await store.retention.segments(path)
        archived = _archived_from_one(segments, first - 1)
        taken = (
            f"its events through {first - 1} are archived in {len(segments)} segment file(s)"
            if archived
            else f"its events through {first - 1} were deleted (not all of them archived)"
        )
        if start is None:
            choices = (
                '"beginning" (from offset 1, reading the archive), ' if archived else ""
            ) + f'"start" (from offset {first}) or "head" (from the newest event)'
            problems.append(
                f"processor {slug!r} has never run on {path!r}, which starts at offset {first}: "
                f"{taken}; declare where it starts: start = {choices}, in its [[processors]] "
                "table or its contract"
            )
        elif not archived:
            problems.append(
                f'processor {slug!r} declares start = "beginning" on {path!r}, but {taken}: '
                f'its state cannot be built from offset 1; declare "start" (from offset '
                f'{first}) or "head"'
            )
        else:
            continue
        details.append(
            {
                "slug": slug,
                "path": path,
                "start": first,
                "declared": start,
                "archive": [s.file for s in segments],
            }
        )
    if problems:
        raise HistoryTruncated(
            "; ".join(problems) + "; nothing was started",
            details={"processors": details},
        )


def _archived_from_one(segments: Sequence[Segment], through: int) -> bool:
    """Whether ``segments`` cover offsets 1..``through`` without a gap."""
    covered = 0
    for segment in sorted(segments, key=lambda s: s.first):
        if segment.first != covered + 1:
            return False
        covered = segment.last
    return covered >= through

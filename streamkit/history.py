"""A path's start: history taken by retention is refused loudly, never skipped.

Retention takes a path's oldest events, archived into segment files or
deleted, only below its horizon (:mod:`streamkit.horizon`). The path then
*starts* after the offset it was taken through. A read that begins below
its start gets :class:`~streamkit.errors.HistoryTruncated`, naming the
start and the archive, instead of the first event still held: a consumer
never jumps over history without being told (Kafka's ``auto.offset.reset``
is exactly such a jump).

Each cut is recorded by the reserved control event :data:`TRUNCATED_EVENT`
on the path, written in the cut's own transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamkit.errors import HistoryTruncated

__all__ = [
    "RETENTION_CHUNK",
    "RETENTION_SHARE",
    "TRUNCATED_EVENT",
    "deleted_ranges",
    "history_truncated",
]

RETENTION_CHUNK = 2_000
"""Events a retention run takes per transaction unless told otherwise.

One transaction of this many deletions (and its segment's records) keeps
the writer a few milliseconds, so appends go on between chunks: measured
with appends beside a run on SQLite (docs/performance.md), chunks of 10,000
made their p99 32x its usual, chunks of 2,000 about 3.5x, at the same rate.
"""

RETENTION_SHARE = 0.005
"""The most of the log writer's time a host's retention run takes while appends go on.

Each cut holds the writer (a millisecond or two for 2,000 events on
SQLite, its commit included), and an append that arrives meanwhile waits
for it. At a share ``s`` of the writer's time, about ``s * (1 + a / c)``
of the appends arrive during a cut (``a`` an append's own time, ``c`` a
cut's), so at 1% slightly over 1% of them do: the p99 lands among the
delayed ones (measured on SQLite, docs/performance.md, 1.6x to 3.7x its
usual). At 0.5% it stays among the undelayed (1.0x), at about 3,200
events archived a second (over 270 million a day). An idle log is cut at
full speed whatever the share.
"""

TRUNCATED_EVENT = "streamkit.truncated"
"""The control event of one cut: ``{through, mode, count, segment}``.

``mode`` is ``archive`` or ``delete``; ``count`` the events taken; ``segment``
(archive only) ``{file, first, last, sha256, prev_sha256, bytes}``.
"""


def history_truncated(
    path: str, after: int, through: int, segments: Sequence[tuple[str, int, int]]
) -> HistoryTruncated:
    """The refusal of a read of ``path`` after ``after``, below its start (``through`` + 1).

    ``segments`` are the path's archive segments as ``(file, first, last)``: the
    offsets through ``through`` that none covers were deleted. The message names
    both parts, and advice that works for where the read began: the archive for
    an archived offset, the offset after the deleted range for a deleted one.
    """
    archived = _merged(sorted((first, last) for _, first, last in segments))
    deleted = deleted_ranges(through, archived)
    parts = []
    if deleted:
        parts.append(f"{_ranges(deleted)} {'was' if len(deleted) == 1 else 'were'} deleted")
    if archived:
        files = [file for file, _, _ in sorted(segments, key=lambda s: s[1])]
        parts.append(
            f"{_ranges(archived)} {'is' if len(archived) == 1 else 'are'} archived in "
            f"{len(files)} segment file(s) (first {files[0]})"
        )
    wanted = after + 1
    gone = next(((a, b) for a, b in deleted if a <= wanted <= b), None)
    if gone is None:
        advice = (
            f"include the archive (streamkit read --include-archive), or read after offset "
            f"{through}"
        )
    elif gone[1] < through:
        advice = (
            f"offsets {gone[0]}..{gone[1]} cannot be read by anyone: read after offset "
            f"{gone[1]} with the archive (streamkit read --include-archive), or after offset "
            f"{through}"
        )
    else:
        advice = (
            f"offsets {gone[0]}..{gone[1]} cannot be read by anyone: read after offset {through}"
        )
    return HistoryTruncated(
        f"{path!r} starts at offset {through + 1}: of its events through {through}, "
        f"{' and '.join(parts)}; a read after offset {after} would skip them, so nothing was "
        f"read; {advice}",
        details={
            "path": path,
            "requested": after,
            "start": through + 1,
            "archive": [file for file, _, _ in segments],
            "archived": [list(r) for r in archived],
            "deleted": [list(r) for r in deleted],
        },
    )


def deleted_ranges(through: int, archived: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The offsets ``1..through`` no archived range covers, as ``(first, last)`` ranges."""
    gaps: list[tuple[int, int]] = []
    covered = 0
    for first, last in sorted(archived):
        if first > covered + 1:
            gaps.append((covered + 1, min(first - 1, through)))
        covered = max(covered, last)
    if covered < through:
        gaps.append((covered + 1, through))
    return [(a, b) for a, b in gaps if a <= b]


def _merged(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ranges with the adjacent ones joined (segments 1..2 and 3..4 are 1..4)."""
    joined: list[tuple[int, int]] = []
    for first, last in ranges:
        if joined and first <= joined[-1][1] + 1:
            joined[-1] = (joined[-1][0], max(joined[-1][1], last))
        else:
            joined.append((first, last))
    return joined


def _ranges(ranges: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"{a}..{b}" for a, b in ranges)

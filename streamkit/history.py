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

__all__ = ["RETENTION_CHUNK", "RETENTION_SHARE", "TRUNCATED_EVENT", "history_truncated"]

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
    path: str, after: int, through: int, archive: Sequence[str]
) -> HistoryTruncated:
    """The refusal of a read of ``path`` after ``after``, below its start (``through`` + 1)."""
    where = (
        f"its events through {through} are archived in {len(archive)} segment file(s) "
        f"(first {archive[0]})"
        if archive
        else f"its events through {through} were deleted (no archive was kept)"
    )
    return HistoryTruncated(
        f"{path!r} starts at offset {through + 1}: {where}; a read after offset {after} "
        f"would skip them, so nothing was read; read after offset {through}"
        + (", or include the archive (streamkit read --include-archive)" if archive else ""),
        details={
            "path": path,
            "requested": after,
            "start": through + 1,
            "archive": list(archive),
        },
    )

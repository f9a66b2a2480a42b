"""The archive's files, whatever the backend: those no row records, and the whole check.

A crash anywhere in a run leaves at worst a segment file that no row
records. :func:`sweep` removes such a file once the path's start has passed
its range (a run sweeps before it writes and after its chunks); a file above
the start is left alone, since it may be another run's, about to be
recorded, so two runs of one path never remove each other's files.
:func:`verify_archive` proves every recorded segment and their chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from streamkit.backends._retention.cuts import TruncationRows
from streamkit.backends._retention.segments import check_chain, check_segment, segment_range
from streamkit.log import Log
from streamkit.records import Segment

__all__ = ["discard", "remove_orphans", "sweep", "verify_archive"]


def remove_orphans(folder: Path, path: str, through: int, recorded: set[str]) -> list[str]:
    """Segment files of ``path`` in ``folder`` that no row records and never will, removed.

    Never will: their range ends at or below ``through``, the path's start
    (read before ``recorded``), so a cut of it would be refused. A file
    above it may be another run's, written and about to be recorded: it
    stays until a run takes its range.
    """
    if not folder.is_dir():
        return []
    removed = []
    for file in sorted(folder.iterdir()):
        covered = segment_range(path, file.name)
        if covered is None or covered[1] > through or str(file) in recorded:
            continue
        with contextlib.suppress(FileNotFoundError):
            file.unlink()
        removed.append(str(file))
    return removed


async def sweep(
    log: Log, rows: TruncationRows, folder: Path, path: str
) -> tuple[list[str], list[Segment]]:
    """The files :func:`remove_orphans` removed, and the path's recorded segments."""
    # The start first: a segment recorded before it moved there is in the second read.
    through = await log.query(lambda conn: rows.truncated_through(conn, path))
    recorded = await log.query(lambda conn: rows.segments(conn, path))
    files = {s.file for s in recorded}
    return await asyncio.to_thread(remove_orphans, folder, path, through, files), recorded


def discard(file: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(file)


async def verify_archive(log: Log, rows: TruncationRows, path: str | None = None) -> list[str]:
    """Every problem of the recorded archive (of ``path`` only), in words; empty: all proven.

    Each path's segments as a chain (:func:`~streamkit.backends._retention.segments.check_chain`)
    and each file against its record, every byte hashed (off the event loop).
    """
    recorded = await log.query(lambda conn: rows.segments(conn, path))
    by_path: dict[str, list[Segment]] = {}
    for segment in recorded:
        by_path.setdefault(segment.path, []).append(segment)
    problems: list[str] = []
    for segments in by_path.values():
        problems += check_chain(segments)
        for segment in segments:
            found = await asyncio.to_thread(check_segment, segment)
            if found is not None:
                problems.append(found)
    return problems

"""Archive segments: a path's archived range in a file of its own, written, proven and chained.

A segment is one SQLite database file (the format the US Library of
Congress recommends for keeping data sets; readable by any ``sqlite3`` for
decades, with no streamkit installed) holding:

- ``events``: the archived rows exactly as the log stored them, in the
  column order every read selects (:data:`~streamkit.backends._stored.Row`),
  keyed by offset, so a page of the archive is one indexed range read and
  decodes through the same code as a page of the log;
- ``manifest``: one row per key: the format, the path, the first and last
  offset and the count, the previous segment's SHA-256 (the chain), the
  streamkit version that wrote it and when.

:func:`write_segment` makes it so that a segment that exists under its name
is whole: it writes a temporary file beside the final one, syncs it to
disk, renames it into place and syncs the directory; it then reads the file
back (every row and the manifest, against what was asked) and hashes its
bytes. Only a :class:`Segment` that came back from it may be recorded, and
the segment's row in the log (its hash, and the previous segment's) is
what :func:`check_segment` and :func:`check_chain` prove a file against:
a flipped byte, a truncated or missing file, a range that does not
follow on, a link of the chain that does not match are each named.

Every read of a segment (:func:`archive_page`) is checked against its record
first: a file that does not match is refused (``LOG_TAMPERED``, naming the
segment), so a read fails and a rebuild stalls instead of folding altered
history; a file that is gone is a ``STORAGE_ERROR`` saying so. The check hashes a file once per process, then again only when
the file's identity (device, inode, size, modification time) changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamkit._version import __version__
from streamkit.backends._stored import Row, decode_rows
from streamkit.errors import LogTampered, StorageError
from streamkit.events import ReadPage, StreamEvent
from streamkit.protocols import PayloadTypes
from streamkit.records import Segment

__all__ = [
    "SEGMENT_FORMAT",
    "Segment",
    "archive_page",
    "archived_event",
    "check_chain",
    "check_segment",
    "file_sha256",
    "read_segment",
    "segment_name",
    "segment_of",
    "segment_range",
    "write_segment",
]

SEGMENT_FORMAT = "1"
"""The layout :func:`write_segment` writes (the manifest's ``format``)."""

_SCHEMA = (
    'CREATE TABLE events ("offset" INTEGER PRIMARY KEY, type TEXT NOT NULL, payload TEXT NOT NULL,'
    " metadata TEXT NOT NULL, source TEXT, idempotency_key TEXT, created_at TEXT NOT NULL,"
    " payload_version INTEGER NOT NULL)",
    "CREATE TABLE manifest (key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID",
)
_COLUMNS = '"offset", type, payload, metadata, source, idempotency_key, created_at, payload_version'


def segment_of(row: Any) -> Segment:
    """A segment from its recorded row: path, first, last, count, bytes, file, sha256, prev."""
    path, first, last, count, size, file, sha256, prev = row
    return Segment(
        str(path),
        int(first),
        int(last),
        int(count),
        int(size),
        str(file),
        str(sha256),
        None if prev is None else str(prev),
    )


def segment_name(path: str, first: int, last: int, tag: str = "") -> str:
    """The file name of ``path``'s segment of ``first..last``, sortable by range.

    The path goes in with its slashes spelled out (``/orders/eu`` ->
    ``_orders_eu``; ``_`` itself doubled), so each path's segments are told
    apart in one directory and the name says what the file holds. ``tag``
    (each write's own, :func:`write_segment`) keeps two runs that write the
    same range at once from writing one file: only one of them records it.
    """
    spelled = path.replace("_", "__").replace("/", "_")
    return f"{spelled}.{first:020d}-{last:020d}{'.' + tag if tag else ''}.segment"


def segment_range(path: str, name: str) -> tuple[int, int] | None:
    """The range a file of ``path``'s segments covers, by its name (a ``.partial`` too);
    None for a file that is not one."""
    prefix = segment_name(path, 0, 0).split(".", 1)[0] + "."
    if not name.startswith(prefix):
        return None
    found = _NAMED.fullmatch(name[len(prefix) :])
    return None if found is None else (int(found[1]), int(found[2]))


_NAMED = re.compile(r"(\d{20})-(\d{20})(?:\.[0-9a-f]+)?\.segment(?:\.partial)?")


def file_sha256(file: str | Path) -> str:
    """The hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_segment(
    directory: str | Path,
    path: str,
    first: int,
    last: int,
    rows: Sequence[Row],
    prev_sha256: str | None,
    created_at: str,
) -> Segment:
    """Write the range ``first..last`` of ``path`` (its stored ``rows``) as a segment, proven.

    The segment covers the whole range, offsets with no durable event (taken
    by ephemerals) included: a read of the archive knows the range holds
    nothing else. The file is synced and renamed into ``directory`` (made if
    missing), then read back: a row or manifest entry that does not come
    back as written raises :class:`ValueError` and the file is removed. What
    comes back is the segment to record, with its size and hash.
    """
    offsets = [row[0] for row in rows]
    if offsets != sorted(set(offsets)) or not 1 <= first <= last:
        raise ValueError("a segment's rows must be in ascending offset order, each once")
    if offsets and not first <= offsets[0] <= offsets[-1] <= last:
        raise ValueError(f"a segment of {first}..{last} holds rows of that range only")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / segment_name(path, first, last, secrets.token_hex(4))
    temporary = final.with_name(final.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    manifest = {
        "format": SEGMENT_FORMAT,
        "path": path,
        "first": str(first),
        "last": str(last),
        "count": str(len(rows)),
        "prev_sha256": prev_sha256,
        "written_by": f"streamkit {__version__}",
        "created_at": created_at,
    }
    conn = sqlite3.connect(temporary, isolation_level=None)
    try:
        # Durability comes from the file sync below; a rollback journal would only
        # double the writing of a file nobody reads until it is renamed into place.
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("BEGIN")
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.executemany(f"INSERT INTO events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.executemany("INSERT INTO manifest (key, value) VALUES (?, ?)", manifest.items())
        conn.execute("COMMIT")
    finally:
        conn.close()
    try:
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, final)
        _sync_directory(folder)
        back = read_segment(final)
        stored = _manifest(final)
        if back != [tuple(row) for row in rows] or stored != manifest:
            raise ValueError(f"segment {final} did not read back as it was written")
    except BaseException:
        for leftover in (temporary, final):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        raise
    return Segment(
        path=path,
        first=first,
        last=last,
        count=len(rows),
        bytes=final.stat().st_size,
        file=str(final),
        sha256=file_sha256(final),
        prev_sha256=prev_sha256,
    )


def _connect_read_only(file: str | Path) -> sqlite3.Connection:
    uri = Path(file).resolve().as_uri() + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True)


def _manifest(file: str | Path) -> dict[str, str | None]:
    conn = _connect_read_only(file)
    try:
        return {
            str(k): None if v is None else str(v)
            for k, v in conn.execute("SELECT key, value FROM manifest")
        }
    finally:
        conn.close()


def read_segment(file: str | Path, after: int = 0, limit: int | None = None) -> list[Row]:
    """The stored rows of a segment after ``after`` (at most ``limit``), ascending."""
    conn = _connect_read_only(file)
    try:
        rows = conn.execute(
            f'SELECT {_COLUMNS} FROM events WHERE "offset" > ? ORDER BY "offset" LIMIT ?',
            (after, -1 if limit is None else limit),
        ).fetchall()
    finally:
        conn.close()
    return [
        (int(o), str(t), str(p), str(m), s, k, str(c), int(v)) for o, t, p, m, s, k, c, v in rows
    ]


_PROVEN: dict[str, tuple[tuple[int, int, int, int], str]] = {}
"""Per segment file, the identity it had when it was last proven, and the hash proven."""


def prove(segment: Segment) -> None:
    """Refuse (LogTampered) a segment whose file is not as recorded (see the module)."""
    try:
        stat = os.stat(segment.file)
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    except OSError:
        identity = (0, 0, -1, 0)
    if _PROVEN.get(segment.file) == (identity, segment.sha256):
        return
    if identity[2] < 0:
        # Gone, not changed: nothing of it can be read (a copy may be restored), and
        # nothing altered is served either.
        raise StorageError(
            f"segment {segment.file} of {segment.path} ({segment.first}..{segment.last}) is "
            "missing; nothing was read from it; restore the segment's file from a copy "
            "(`streamkit verify --archive` checks every one)",
            details={
                "path": segment.path,
                "file": segment.file,
                "first": segment.first,
                "last": segment.last,
            },
        )
    problem = check_segment(segment)
    if problem is not None:
        raise LogTampered(
            f"{problem}; the read was refused and nothing was read from it (a rebuild over it "
            "stalls); restore the segment's file from a copy (`streamkit verify --archive` "
            "checks every one)",
            details={
                "path": segment.path,
                "file": segment.file,
                "first": segment.first,
                "last": segment.last,
            },
        )
    _PROVEN[segment.file] = (identity, segment.sha256)


def archived_event(segments: Sequence[Segment], path: str, offset: int) -> StreamEvent | None:
    """The event at ``offset`` of ``path`` from the segment that holds it (proven), or None."""
    page = archive_page(segments, path, offset - 1, 1, offset)
    if page is None or not page.events or page.events[0].offset != offset:
        return None
    return page.events[0]


def check_segment(segment: Segment) -> str | None:
    """What is wrong with ``segment``'s file, in words, or None when it is as recorded.

    Missing, another size, another hash (a byte changed anywhere), or (the
    hash being right) a manifest that does not say what the record says.
    """
    file = Path(segment.file)
    if not file.is_file():
        return f"segment {file} of {segment.path} ({segment.first}..{segment.last}) is missing"
    size = file.stat().st_size
    if size != segment.bytes:
        return (
            f"segment {file} of {segment.path} ({segment.first}..{segment.last}) is "
            f"{size} bytes, recorded as {segment.bytes}"
        )
    found = file_sha256(file)
    if found != segment.sha256:
        return (
            f"segment {file} of {segment.path} ({segment.first}..{segment.last}) has SHA-256 "
            f"{found}, recorded as {segment.sha256}: it was changed after it was written"
        )
    try:
        manifest = _manifest(file)
    except sqlite3.Error as exc:
        return f"segment {file} of {segment.path} cannot be read: {exc}"
    expected = {
        "path": segment.path,
        "first": str(segment.first),
        "last": str(segment.last),
        "count": str(segment.count),
        "prev_sha256": segment.prev_sha256,
    }
    wrong = sorted(k for k, v in expected.items() if manifest.get(k) != v)
    if wrong:
        return f"segment {file}'s manifest disagrees with its record on {', '.join(wrong)}"
    return None


def check_chain(segments: Sequence[Segment]) -> list[str]:
    """What is wrong with one path's recorded segments as a chain, in words (empty: nothing).

    In ascending order each must begin after the one before it ends and name
    its hash as the previous; the first names none. The files themselves are
    :func:`check_segment`'s.
    """
    problems: list[str] = []
    previous: Segment | None = None
    for segment in sorted(segments, key=lambda s: s.first):
        if previous is None:
            if segment.prev_sha256 is not None:
                problems.append(
                    f"the first segment of {segment.path} ({segment.first}..{segment.last}) names "
                    f"a previous segment {segment.prev_sha256} that is not recorded"
                )
        else:
            if segment.first <= previous.last:
                problems.append(
                    f"segments {previous.first}..{previous.last} and {segment.first}.."
                    f"{segment.last} of {segment.path} overlap"
                )
            if segment.prev_sha256 != previous.sha256:
                problems.append(
                    f"segment {segment.first}..{segment.last} of {segment.path} names "
                    f"{segment.prev_sha256} as the previous one, whose hash is {previous.sha256}"
                )
        previous = segment
    return problems


def archive_page(
    segments: Sequence[Segment],
    path: str,
    after: int,
    limit: int,
    upto: int | None,
    types: PayloadTypes | None = None,
) -> ReadPage | None:
    """A page of ``path`` after ``after`` from its archive, or None if no segment covers it.

    ``segments`` are the path's, ascending. The segment whose range holds
    ``after + 1`` answers: its events (decoded as a page of the log is), a
    proof through the last one when the page is full, else through the end
    of its range (never ``at_head``: the log goes on after it), or through
    ``upto`` when the read was bounded short of it. A gap between segments
    (a range deleted without an archive) covers nothing: None.
    """
    for segment in segments:
        if segment.last <= after:
            continue
        if segment.first > after + 1:
            return None
        prove(segment)
        rows = read_segment(segment.file, after, limit)
        if upto is not None:
            rows = [row for row in rows if row[0] <= upto]
        events = decode_rows(path, rows, types)
        if len(rows) == limit:
            return ReadPage(events, rows[-1][0], False)
        if upto is not None and upto <= segment.last:
            return ReadPage(events, max(after, upto), True)
        return ReadPage(events, segment.last, False)
    return None

"""A retention chunk made ready to cut: its rows read, its segment proven, its keys hashed.

Everything a chunk needs before its one transaction (:mod:`._truncation`)
is CPU work of milliseconds: reading a few thousand rows, writing, reading
back and hashing the segment file, hashing each keyed event's body. Done
in a thread of the host's process, that work holds the interpreter's lock,
and the event loop that serves appends waits behind it (up to the 5 ms
switch interval at each hand-off): measured, it multiplied the appends'
p99 during a run several times over even with the transactions taken out.

:func:`prepare_chunk` is that work as one function of the rows, the same
wherever it runs. Two preparers call it:

- :class:`ThreadPreparer` reads the rows through the log's own readers
  and prepares them in a worker thread (the plain path, and the only one
  for a log no other process can open, such as a memory log);
- :class:`ProcessPreparer` hands the whole chunk to one worker process
  (:mod:`streamkit.backends._retention.chunk_worker`) shared by every run in this
  process, which opens its own read
  connection (``opener``), reads the rows, prepares them and sends back
  only the cut: the segment's record, the keys with their hashes and the
  counts per stored type. A speed trick, off under ``STREAMKIT_PLAIN=1``
  (:mod:`streamkit._speed`).

The outcome is the same either way; the rows are committed events of a
range no writer changes (appends go after the head; only a cut, which
checks the path's start in its transaction, deletes them), so a reader in
another process reads exactly what the log's own reader would.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import pickle
import sqlite3
import struct
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Protocol

from streamkit._requests import Connection
from streamkit.backends._keys import body_sha256
from streamkit.backends._retention.segments import write_segment
from streamkit.backends._stored import Row
from streamkit.history import TRUNCATED_EVENT
from streamkit.log import Log
from streamkit.records import Segment

__all__ = [
    "ChunkAsk",
    "ChunkPreparer",
    "Opener",
    "Prepared",
    "ProcessPreparer",
    "RowReader",
    "ThreadPreparer",
    "prepare_chunk",
]


class RowReader(Protocol):
    """What a preparer reads a chunk's rows with (a backend's truncation rows)."""

    def stored_rows(
        self, conn: Connection, path: str, after: int, through: int, limit: int
    ) -> list[Row]:
        """The stored rows of ``path`` in ``(after, through]``, ascending, at most ``limit``."""
        ...


@dataclass(frozen=True, slots=True)
class ChunkAsk:
    """One chunk to prepare: the rows of ``path`` after ``after``, through ``limit`` at most."""

    path: str
    after: int
    limit: int
    chunk: int
    young: str | None
    """The creation time from which an event is too young to go (``keep_for``), or None."""
    folder: str | None
    """The archive directory, or None when the chunk is deleted."""
    prev: str | None
    """The SHA-256 of the path's last segment (the chain's last link)."""
    created_at: str


@dataclass(frozen=True, slots=True)
class Prepared:
    """A chunk ready for its transaction, or the reason the run stops before it."""

    through: int
    """The offset the cut goes through."""
    count: int
    """Stored events the cut takes."""
    stop: str | None = None
    """``keep_for`` (nothing old enough is left) or ``own_records``: no cut, the run ends."""
    young_at: int | None = None
    """The first event too young to go, if the chunk met one: the run ends after this cut."""
    segment: Segment | None = None
    keys: tuple[tuple[str, int, str, str], ...] = ()
    """``(key, offset, body_sha256, created_at)`` of each keyed event taken."""
    types: tuple[tuple[tuple[str, int], int], ...] = ()
    """Events deleted per stored ``(type, payload version)`` (none when archived)."""


def prepare_chunk(taken: list[Row], ask: ChunkAsk) -> Prepared:
    """The cut of ``taken`` (the rows :class:`ChunkAsk` names, as read), or where the run stops.

    Archive mode writes and proves the segment here (:func:`write_segment`
    raises OSError, sqlite3.Error or ValueError when it cannot, and leaves
    no file).
    """
    through = taken[-1][0] if len(taken) == ask.chunk else ask.limit
    limit = ask.limit
    young_at = None
    kept = None if ask.young is None else next((r for r in taken if r[6] >= ask.young), None)
    if kept is not None:
        # The first event too young to go: the run stops before it.
        taken = taken[: taken.index(kept)]
        through = limit = kept[0] - 1
        young_at = kept[0]
        if through <= ask.after:
            return Prepared(through=through, count=0, stop="keep_for", young_at=young_at)
    if through == limit and all(row[1] == TRUNCATED_EVENT for row in taken):
        # All that is left is earlier runs' own records (or no event at all): cutting
        # them would write another record, and the next run would take that, forever.
        return Prepared(through=through, count=0, stop="own_records", young_at=young_at)
    segment = None
    if ask.folder is not None:
        # The segment covers the whole range, so a read of the archive knows it whole.
        segment = write_segment(
            ask.folder, ask.path, ask.after + 1, through, taken, ask.prev, ask.created_at
        )
    keys = tuple(
        (str(row[5]), row[0], body_sha256(row[1], row[2], row[3]), row[6])
        for row in taken
        if row[5] is not None
    )
    # An archived event is still read (by rebuilds, through the same fold), so the
    # summary of stored types, which schema checks read, keeps counting it.
    types = () if ask.folder is not None else tuple(Counter((r[1], r[7]) for r in taken).items())
    return Prepared(
        through=through,
        count=len(taken),
        young_at=young_at,
        segment=segment,
        keys=keys,
        types=types,
    )


class ChunkPreparer(Protocol):
    """Prepares a run's chunks (:func:`prepare_chunk`), somewhere off the event loop."""

    in_process: bool
    """Whether the work runs in this process (a run counts it as its own time when pacing)."""

    async def prepare(self, ask: ChunkAsk) -> Prepared:
        """The chunk ``ask`` names, prepared."""
        ...


class ThreadPreparer:
    """Reads through ``log``'s readers; prepares in a worker thread of this process."""

    in_process = True

    def __init__(self, log: Log, rows: RowReader) -> None:
        self._log = log
        self._rows = rows

    async def prepare(self, ask: ChunkAsk) -> Prepared:
        taken = await self._log.query(
            functools.partial(
                self._rows.stored_rows,
                path=ask.path,
                after=ask.after,
                through=ask.limit,
                limit=ask.chunk,
            )
        )
        return await asyncio.to_thread(prepare_chunk, taken, ask)


Opener = Callable[[], Any]
"""Opens a read connection to the log (picklable: it runs in the worker process)."""


class ProcessPreparer:
    """Reads and prepares in the worker process (:class:`_Worker`), with its own connection."""

    in_process = False

    def __init__(self, opener: Opener, rows: RowReader) -> None:
        self._opener = opener
        self._rows = rows

    async def prepare(self, ask: ChunkAsk) -> Prepared:
        # The pipe's round trip blocks: a thread waits on it, the loop does not.
        return await asyncio.to_thread(_WORKER.call, (self._opener, self._rows, ask))


def read_and_prepare(opener: Opener, rows: RowReader, ask: ChunkAsk) -> Prepared:
    """In the worker process: read the chunk's rows on a connection of its own, prepare them."""
    try:
        conn = opener()
        try:
            taken = rows.stored_rows(conn, ask.path, ask.after, ask.limit, ask.chunk)
        finally:
            with contextlib.suppress(Exception):
                conn.close()
    except (OSError, ValueError):
        raise
    except Exception as exc:
        raise OSError(f"reading the rows of {ask.path!r} failed ({exc!r})") from None
    return prepare_chunk(taken, ask)


class _Worker:
    """The one worker process of this process's runs: started at the first chunk, then kept.

    Its own interpreter (``python -m streamkit.backends._retention.chunk_worker``), fed
    over a pipe, rather than :mod:`multiprocessing`: both of its ways to
    start a clean process import the parent's ``__main__`` again in the
    child, and an application script without a ``__name__`` guard would
    start all over there. It ends when this process closes the pipe (at
    exit, or killed: the worker reads the end of its input and leaves).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def call(self, request: tuple[Opener, RowReader, ChunkAsk]) -> Prepared:
        with self._lock:
            process = self._started()
            assert process.stdin is not None
            assert process.stdout is not None
            try:
                write_message(process.stdin, request)
                outcome, value = read_message(process.stdout)
            except (OSError, EOFError, pickle.PickleError) as exc:
                # Killed, out of memory, a broken pipe: the next chunk starts another.
                self._stop()
                raise OSError(f"the retention worker process failed ({exc!r})") from exc
        if outcome == "ok":
            assert isinstance(value, Prepared)
            return value
        kind, words = value
        raise (ValueError if kind == "ValueError" else OSError)(words)

    def _started(self) -> subprocess.Popen[bytes]:
        process = self._process
        if process is not None and process.poll() is None:
            return process
        env = dict(os.environ)
        # The worker imports the streamkit this process runs, wherever that came from.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        process = subprocess.Popen(
            [sys.executable, "-m", "streamkit.backends._retention.chunk_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        if self._process is None:
            atexit.register(self._stop)
        self._process = process
        return process

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs."""
        process = self._process
        return None if process is None or process.poll() is not None else process.pid


_WORKER = _Worker()


def write_message(stream: IO[bytes], value: object) -> None:
    """One message on the worker's pipe: its length, then its pickle."""
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">Q", len(data)) + data)
    stream.flush()


def read_message(stream: IO[bytes]) -> Any:
    """The next message on the worker's pipe (EOFError at its end)."""
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the pipe ended")
    (size,) = struct.unpack(">Q", head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the pipe ended mid-message")
    return pickle.loads(data)


PREPARE_ERRORS = (OSError, sqlite3.Error, ValueError)
"""What a preparer raises when a chunk cannot be read or its segment written."""

"""The WAL guard: refuse to write to a log whose ``-wal`` file was deleted or replaced.

SQLite keeps a log's newest commits in ``<db>-wal`` until it checkpoints them
into the main file, and coordinates processes through ``<db>-shm``. Deleting
those two files under a live process (a clean-up script, a careless ``rm``)
splits the database in two: the live process keeps writing into its unlinked
WAL, while a process that opens the file afterwards sees an older database
and hands out offsets that were already acknowledged. Nothing SQLite does
notices. Two checks close that:

- :class:`WalIdentity`: a writer notes its WAL file's identity (device and
  inode) at its first transaction and checks it after every ``BEGIN
  IMMEDIATE`` (one ``stat``). While any connection is open SQLite never
  deletes or replaces the WAL, so a change means tampering: the writer
  refuses that write and every later one with
  :class:`~streamkit.errors.LogTampered`.
- :func:`refuse_replaced_wal`: before opening, a log in WAL mode whose
  ``-wal`` file is missing while another process holds SQLite's shared lock
  on the main file has lost its WAL under that process; it is refused.

Both refuse with nothing written. Recovery is an operator's job: stop every
process on the file, check it with ``PRAGMA integrity_check``, and restore
from a backup if it reports damage or events are missing.
"""

from __future__ import annotations

import fcntl
import os
import time

from streamkit.errors import LogTampered

__all__ = ["WalIdentity", "refuse_replaced_wal"]

# SQLite's unix VFS locks these bytes of the main file; every connection that
# has the database open in WAL mode holds a read (shared) lock on this range.
_SHARED_FIRST = 0x40000000 + 2
_SHARED_SIZE = 510
_WAL_MODE = b"\x02\x02"  # header bytes 18-19 of a database in WAL mode


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _tampered(db: str, what: str) -> LogTampered:
    return LogTampered(
        f"the log {db!r} lost its write-ahead log: {what}. Writing now could reuse offsets "
        "that were already acknowledged, so nothing was written. Stop every process that has "
        "the file open, check it (sqlite3 FILE 'PRAGMA integrity_check'), and restore it from "
        "a backup if it reports damage or events are missing",
        details={"path": db},
    )


class WalIdentity:
    """The identity of one writer's ``-wal`` file, checked after every ``BEGIN IMMEDIATE``."""

    __slots__ = ("_db", "_first", "_refused", "_wal")

    def __init__(self, db: str) -> None:
        self._db = db
        self._wal = db + "-wal"
        self._first: tuple[int, int] | None = None
        self._refused: LogTampered | None = None

    def check(self) -> None:
        """Raise :class:`~streamkit.errors.LogTampered` if the WAL is not the one first seen.

        Call it inside a write transaction: SQLite holds the WAL open then, so
        a missing or different file cannot be SQLite's own doing. Once refused,
        always refused: the split cannot heal by itself.
        """
        if self._refused is not None:
            raise self._refused.with_traceback(None)
        seen = _identity(self._wal)
        if self._first is None and seen is not None:
            self._first = seen
            return
        if seen != self._first:
            what = (
                f"{self._wal!r} was deleted while this process had the log open"
                if seen is None
                else f"{self._wal!r} was replaced by another file while this process had the "
                "log open"
            )
            self._refused = _tampered(self._db, what)
            raise self._refused.with_traceback(None)


def refuse_replaced_wal(db: str) -> None:
    """Raise :class:`~streamkit.errors.LogTampered` if ``db`` lost its WAL under a live process.

    A missing ``-wal`` is normal for a log nobody has open (the last
    connection to close removes it); it is refused only while another process
    holds SQLite's shared lock on the main file, checked a few times so that a
    process caught between taking its lock and creating its WAL is not taken
    for tampering.
    """
    wal = db + "-wal"
    if os.path.exists(wal) or not os.path.isfile(db):
        return
    try:
        with open(db, "rb") as header:
            header.seek(18)
            if header.read(2) != _WAL_MODE:
                return
    except OSError:
        return  # unreadable: opening reports it properly
    for attempt in range(3):
        if attempt:
            time.sleep(0.05)
        if os.path.exists(wal) or not _held_by_another_process(db):
            return
    raise _tampered(db, f"{wal!r} is missing while another process has the log open")


def _held_by_another_process(db: str) -> bool:
    # Only reached when no WAL exists, that is when no connection of ours can have
    # the file open (or it too lost its WAL): closing this descriptor, which drops
    # the process's POSIX locks on the file, then takes no lock SQLite relies on.
    try:
        fd = os.open(db, os.O_RDWR)
    except OSError:
        return False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, _SHARED_SIZE, _SHARED_FIRST, os.SEEK_SET)
        except OSError:
            return True
        fcntl.lockf(fd, fcntl.LOCK_UN, _SHARED_SIZE, _SHARED_FIRST, os.SEEK_SET)
        return False
    finally:
        os.close(fd)

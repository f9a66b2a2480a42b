"""A path's key window, whatever the backend: setting it, and forgetting the keys it lets go.

:func:`set_key_window` writes the window's row (or deletes it: forever) and
``streamkit.key-window-set`` in one transaction (:mod:`streamkit.key_window`).
:func:`forget_expired_keys`, which every retention run of the path calls
after its cuts, forgets the keys whose events were taken and were created
before now minus the window, in batches: each batch one transaction with its
``streamkit.keys-forgotten`` record, so the log says how many keys went and
from when. Only a key whose row records its event's hash and time (written
when retention took the event) can go: a key whose event is still stored
always answers. A backend supplies the rows (:class:`KeyWindowRows`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from streamkit._requests import Connection
from streamkit._timestamps import format_timestamp
from streamkit.errors import InvalidRequest
from streamkit.events import StreamEvent, validate_path
from streamkit.holds import check_reason
from streamkit.key_window import KEY_WINDOW_SET, KEYS_FORGOTTEN, KeyWindow, check_key_window
from streamkit.log import Log

__all__ = [
    "FORGET_BATCH",
    "KEY_WINDOW_COLUMNS",
    "KeyWindowRows",
    "forget_expired_keys",
    "key_window",
    "key_window_of",
    "set_key_window",
]

FORGET_BATCH = 5_000
"""Keys forgotten per transaction: a short write, so appends go on between batches."""

KEY_WINDOW_COLUMNS = "path, keep_for, set_by, reason, set_at"
"""The columns of a window's row, in the order :func:`key_window_of` takes them."""


def key_window_of(row: Any) -> KeyWindow:
    """A window from its row (columns as :data:`KEY_WINDOW_COLUMNS`)."""
    return KeyWindow(str(row[0]), float(row[1]), str(row[2]), str(row[3]), float(row[4]))


class KeyWindowRows(Protocol):
    """Where a backend keeps the key windows and the keys, on a connection."""

    def key_window(self, conn: Connection, path: str) -> KeyWindow | None:
        """``path``'s window, or None: its keys are kept forever."""
        ...

    def put_key_window(self, conn: Connection, path: str, window: KeyWindow | None) -> None:
        """Record ``window`` as ``path``'s (None: delete the row, forever)."""
        ...

    def expired_keys(self, conn: Connection, path: str, before: str, limit: int) -> list[str]:
        """At most ``limit`` keys of ``path`` whose taken event was created before ``before``."""
        ...

    def forget_keys(self, conn: Connection, path: str, keys: list[str], before: str) -> int:
        """Delete those of ``keys`` still recorded as taken before ``before``; how many went."""
        ...


async def key_window(log: Log, rows: KeyWindowRows, path: str) -> KeyWindow | None:
    """``path``'s key window (None: forever)."""
    path = validate_path(path)
    return await log.query(functools.partial(rows.key_window, path=path))


async def set_key_window(
    log: Log,
    rows: KeyWindowRows,
    path: str,
    keep_for: float | None,
    *,
    by: str,
    reason: str,
    now: float,
) -> StreamEvent:
    """Give ``path`` the key window ``keep_for`` seconds (None: forever), with its record.

    Refused (InvalidRequest, nothing written) for a malformed window or
    reason, and if another operator changed the window meanwhile.
    """
    path = validate_path(path)
    keep_for = check_key_window(path, keep_for)
    by, reason = check_reason(by, reason, f"setting the key window of {path!r}")
    previous = await key_window(log, rows, path)
    window = None if keep_for is None else KeyWindow(path, keep_for, by, reason, now)

    def seal(conn: Connection, events: list[StreamEvent]) -> None:
        if rows.key_window(conn, path) != previous:
            raise InvalidRequest(
                f"the key window of {path!r} changed while it was being set (another operator "
                "set it); nothing was written; look again",
                details={"path": path},
            )
        rows.put_key_window(conn, path, window)

    payload: dict[str, Any] = {
        "keep_for": keep_for,
        "previous": None if previous is None else previous.keep_for,
        "by": by,
        "reason": reason,
    }
    return await log.append_control(path, {"type": KEY_WINDOW_SET, "payload": payload}, seal)


async def forget_expired_keys(
    log: Log,
    rows: KeyWindowRows,
    path: str,
    now: float,
    *,
    fence: Callable[[Connection], None] | None = None,
    batch: int = FORGET_BATCH,
) -> int:
    """Forget ``path``'s keys that its window lets go as of ``now``; how many were forgotten.

    ``fence`` runs first in each batch's transaction (a host's run: its lease).
    Nothing is forgotten on a path without a window.
    """
    window = await key_window(log, rows, path)
    if window is None:
        return 0
    # Timestamps are fixed-width UTC text: compared as text, they compare as instants.
    before = format_timestamp(max(0.0, now - window.keep_for))
    forgotten = 0
    while True:
        keys = await log.query(
            functools.partial(rows.expired_keys, path=path, before=before, limit=batch)
        )
        if not keys:
            break

        def seal(conn: Connection, events: list[StreamEvent], keys: list[str] = keys) -> None:
            if fence is not None:
                fence(conn)
            current = rows.key_window(conn, path)
            if current is None or current.keep_for != window.keep_for:
                raise InvalidRequest(
                    f"the key window of {path!r} changed while its keys were being forgotten; "
                    "no key was forgotten in this batch; run retention again",
                    details={"path": path},
                )
            if rows.forget_keys(conn, path, keys, before) != len(keys):
                raise InvalidRequest(
                    f"keys of {path!r} were forgotten by another run meanwhile; no key was "
                    "forgotten in this batch; run retention again",
                    details={"path": path},
                )

        payload = {"count": len(keys), "created_before": before, "keep_for": window.keep_for}
        await log.append_control(path, {"type": KEYS_FORGOTTEN, "payload": payload}, seal)
        forgotten += len(keys)
        if len(keys) < batch:
            break
    return forgotten

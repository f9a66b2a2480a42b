"""Watching a processor's live state: a byte-bounded mailbox of deltas, and the seed/delta chain.

A watcher gets ``{"kind": "seed", rev, state}`` first, then
``{"kind": "delta", from, to, patch}`` for each delta of its processor in rev
order. A gap in the chain (a lost delta, a ``patch: null``, a mailbox that
overflowed its byte budget) is answered with a fresh seed, never with a
patch that does not apply; so is a new engine taking the processor over on
this host (a version's cutover): the watcher re-seeds from it at once,
rather than at its first delta. A seed is never sent twice for one
revision (deltas of another host's chain do not re-send the same seed).
While a new version builds in the shadow the seed is the serving version's
checkpointed state at revision 0, sent again when that checkpoint moves.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from streamkit.events import ScannedRange, StreamEvent
from streamkit.live_state import LIVE_STATE_CHANGED, LiveSnapshot

__all__ = ["Subscription", "jsonable", "watch_messages"]


class Subscription:
    """A watcher's mailbox: one processor's live-state deltas, bounded by bytes.

    Only the deltas of the watched key are kept (everything else a commit
    carries is dropped as it arrives), each counted by the size of its patch.
    A watcher that falls more than ``max_bytes`` behind has its mailbox
    emptied and :attr:`overflowed` set: it must re-seed from a snapshot.
    """

    def __init__(self, path: str, key: str, max_bytes: int) -> None:
        self.path = path
        self.key = key
        self.max_bytes = max_bytes
        self._deltas: list[dict[str, Any]] = []
        self._bytes = 0
        self._event = asyncio.Event()
        self.overflowed = False
        self.reseed_due = False
        """Set by :meth:`reseed`: the next message is a fresh seed."""

    @property
    def buffered_bytes(self) -> int:
        """The patch bytes waiting to be taken."""
        return self._bytes

    def offer(self, events: Sequence[StreamEvent], scanned: ScannedRange) -> None:
        for event in events:
            delta = _delta_of(event, self.key)
            if delta is None:
                continue
            patch = delta["patch"]
            size = 64 if patch is None else len(json.dumps(patch, separators=(",", ":")))
            if self._deltas and self._bytes + size > self.max_bytes:
                # A slow watcher: its chain breaks by design; it re-seeds.
                self._deltas.clear()
                self._bytes = 0
                self.overflowed = True
            self._deltas.append(delta)
            self._bytes += size
            self._event.set()

    def reseed(self) -> None:
        """Ask for a fresh seed: another engine (a cutover's) serves the processor here now."""
        self._deltas.clear()
        self._bytes = 0
        self.reseed_due = True
        self._event.set()

    async def get(self) -> list[dict[str, Any]]:
        """Wait for deltas (or an overflow, or a re-seed) and take all buffered ones."""
        while not self._deltas and not self.overflowed and not self.reseed_due:
            self._event.clear()
            await self._event.wait()
        deltas, self._deltas = self._deltas, []
        self._bytes = 0
        return deltas


async def watch_messages(
    subscription: Subscription, snapshot: Callable[[], Awaitable[LiveSnapshot]]
) -> AsyncIterator[dict[str, Any]]:
    """The seed, then the deltas of ``subscription``; a broken chain re-seeds from ``snapshot``."""
    rev, state = await snapshot()
    yield {"kind": "seed", "rev": rev, "state": jsonable(state)}
    while True:
        deltas = await subscription.get()
        if subscription.overflowed or subscription.reseed_due:
            subscription.overflowed = subscription.reseed_due = False
            seen, shown = rev, state
            rev, state = await snapshot()
            if _news(seen, shown, rev, state):
                yield {"kind": "seed", "rev": rev, "state": jsonable(state)}
            continue
        for delta in deltas:
            if delta["to"] <= rev:
                continue
            if delta["from"] != rev or delta["patch"] is None:
                seen, shown = rev, state
                rev, state = await snapshot()
                if _news(seen, shown, rev, state):
                    yield {"kind": "seed", "rev": rev, "state": jsonable(state)}
                continue
            rev = delta["to"]
            yield {"kind": "delta", **delta}


def _news(seen: int, shown: Any, rev: int, state: Any) -> bool:
    """Whether a seed at ``rev`` tells a watcher at ``seen`` anything new.

    Revision 0 is a stale seed (a version building in the shadow): it is new
    only when the serving version's checkpointed state moved.
    """
    return rev != seen or (rev == 0 and state != shown)


def _delta_of(event: StreamEvent, slug: str) -> dict[str, Any] | None:
    if event.type != LIVE_STATE_CHANGED or not isinstance(event.payload, dict):
        return None
    payload = event.payload
    if payload.get("key") != slug:
        return None
    start, end = payload.get("from"), payload.get("to")
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    return {"from": start, "to": end, "patch": payload.get("patch")}


def jsonable(value: Any) -> Any:
    """A state as JSON data (a pydantic model dumped in JSON mode)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return value

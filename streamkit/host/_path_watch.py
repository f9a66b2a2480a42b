"""The host's own follower of one stream path: it obeys skip records and feeds watchers.

Each processor follows its path itself (:mod:`._runner`); this follower is
beside them and on the way of no event to a checkpoint. It reads every
commit of the path from the head at the host's start and does two things:

- a ``streamkit.event-skipped`` event whose record is in the store (only
  ``streamkit skip`` writes both) moves the named processor past the event,
  waking a processor stuck retrying it; one without its record is ignored;
- the path's watchers (:class:`~._watch.Subscription`) are offered the range.

Once drained it waits :data:`FAN_OUT_PAUSE` before waiting again, so it
wakes at most about 100 times a second whatever the commit rate. A failed
read is logged and followed again from the last position after a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

import structlog

from streamkit.errors import StreamkitError
from streamkit.events import StreamEvent
from streamkit.host._runner import ProcessorRunner
from streamkit.host._watch import Subscription
from streamkit.log._follow import Follow
from streamkit.log._log import Log
from streamkit.protocols import HostStore
from streamkit.skips import SKIP_EVENT

__all__ = ["FAN_OUT_PAUSE", "PathWatch"]

_log = structlog.get_logger("streamkit.host")

FAN_OUT_PAUSE = 0.01
"""Seconds the host's own follower of a path waits once drained (commits gather meanwhile)."""

FOLLOW_RETRY_SECONDS = 1.0
"""How long it waits before following again after a failed read."""


class PathWatch:
    """The host's follower of ``path`` (see the module docstring)."""

    def __init__(
        self,
        log: Log,
        store: HostStore,
        path: str,
        runners: Sequence[ProcessorRunner],
        subscribers: Mapping[str, Iterable[Subscription]],
    ) -> None:
        self._log = log
        self._store = store
        self._path = path
        self._runners = [runner for runner in runners if runner.path == path]
        self._subscribers = subscribers

    async def run(self, position: int, follower: Follow) -> None:
        """Follow from ``position`` until the log closes (or the task is cancelled)."""
        path = self._path
        while True:
            try:
                async for events, scanned in follower:
                    position = scanned.through
                    for event in events:
                        if event.type == SKIP_EVENT and not event.ephemeral:
                            await self._apply_skip_event(event)
                    for subscriber in self._subscribers.get(path, ()):
                        subscriber.offer(events, scanned)
                    if not follower.pending:
                        # Let commits gather instead of waking for each one, which
                        # would cost the processors' own followers a task switch each.
                        await asyncio.sleep(FAN_OUT_PAUSE)
                return  # the log closed
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.error(
                    "follow.failed", path=path, error=repr(exc), retry_in=FOLLOW_RETRY_SECONDS
                )
                await asyncio.sleep(FOLLOW_RETRY_SECONDS)
                if self._log.closed:
                    return
                follower = self._log.stream(path).follow(position)

    async def _apply_skip_event(self, event: StreamEvent) -> None:
        try:
            found = await self._store.verified_skip(event)
        except StreamkitError as exc:
            _log.warning("skip.check_failed", offset=event.offset, error=exc.message)
            return
        if found is None:
            # No skip row names this event: `streamkit skip` did not write it.
            _log.warning(
                "skip.unverified_ignored",
                offset=event.offset,
                detail="a skip event without its record is not obeyed; only `streamkit skip` "
                "writes skips",
            )
            return
        slug, offset = found
        for runner in self._runners:
            if runner.slug == slug:
                by = event.payload.get("by") if isinstance(event.payload, dict) else None
                runner.skip(offset, by=by, recorded_at=event.offset)

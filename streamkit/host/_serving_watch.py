"""Whether anybody serves each processor a host is configured with: nothing goes unserved unseen.

A host that runs a processor knows it is served. One that does not (the
processor is placed on another host, this host's version was retired by a
cutover, or this code cannot read the log on) trusts that another host
serves it, and a probe asking this host would never learn otherwise: after a
new version's host cut over and stopped, the hosts left with the old code
answer ready while nothing processes the path.

At every heartbeat the acquirer reads who is alive and who holds which
lease; :class:`ServingWatch` takes that picture in. A processor is served
when its serving lease ``(path, slug)`` is held, unreleased, by a live host
(one whose heartbeat is within a lease ttl), this one included. One seen
unserved at :data:`UNSERVED_BEATS` heartbeats in a row is *unserved*:
``status`` says "serving vN runs on no live host", ``/readyz`` is not ready
with that reason, and ``streamkit_processor_unserved`` is 1. One beat is
not enough, because a free lease placed here is taken within the beat that
saw it free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import structlog

from streamkit.host._runner import ProcessorRunner
from streamkit.host._spread import Key, key_of

__all__ = ["UNSERVED_BEATS", "ServingWatch"]

_log = structlog.get_logger("streamkit.host")

UNSERVED_BEATS = 2
"""Heartbeats in a row at which a processor's serving lease was held by no live host before
it counts as unserved."""


class ServingWatch:
    """Per ``(slug, path)`` a host is configured with: how many beats in a row it was unserved."""

    def __init__(self) -> None:
        self._beats: dict[Key, int] = {}
        self._since: dict[Key, float] = {}

    def observe(
        self,
        runners: Sequence[ProcessorRunner],
        live_hosts: Iterable[str],
        holders: Mapping[Key, str],
        now: float,
    ) -> None:
        """One beat's picture: the live hosts, and the owner of each unreleased serving lease."""
        alive = set(live_hosts)
        for runner in runners:
            key = key_of(runner.slug, runner.path)
            holder = holders.get(key)
            if holder is not None and holder in alive:
                if self._beats.pop(key, 0) >= UNSERVED_BEATS:
                    _log.info("processor.served_again", slug=runner.slug, path=runner.path)
                self._since.pop(key, None)
                continue
            beats = self._beats[key] = self._beats.get(key, 0) + 1
            self._since.setdefault(key, now)
            if beats == UNSERVED_BEATS:
                _log.error(
                    "processor.unserved",
                    slug=runner.slug,
                    path=runner.path,
                    serving_version=runner.role.serving_version,
                    holder=holder,
                    detail="its serving lease is held by no live host: nothing processes it; "
                    "start a host that runs the serving version (or roll back to one that runs here)",
                )

    def unserved(self, runner: ProcessorRunner) -> dict[str, Any] | None:
        """``{since, beats, text}`` while ``runner``'s processor counts as unserved, else None."""
        key = key_of(runner.slug, runner.path)
        beats = self._beats.get(key, 0)
        if beats < UNSERVED_BEATS:
            return None
        version = runner.role.serving_version or runner.version
        return {
            "since": self._since.get(key),
            "beats": beats,
            "text": f"serving v{version} runs on no live host",
        }

"""Skips recorded by other processes, obeyed by a running host once a heartbeat.

A skip made through a host is obeyed by it at once. One recorded elsewhere
(``streamkit skip`` when no host answers, another host's operator) is found
in the store at the next heartbeat, rather than by following every path for
the rare skip event; the log line says who skipped and why, read from the
skip event itself. A store that does not answer is logged and asked again
at the next heartbeat.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from streamkit.errors import StreamkitError
from streamkit.host._runner import ProcessorRunner
from streamkit.log import Log
from streamkit.protocols import HostStore

__all__ = ["obey_recorded_skips"]

_log = structlog.get_logger("streamkit.host")


async def obey_recorded_skips(
    log: Log, store: HostStore, runners: Sequence[ProcessorRunner]
) -> None:
    """Make each runner skip what the store says was skipped for it and it has not yet."""
    try:
        recorded = await store.load_skips()
        for runner in runners:
            for offset, at in recorded.get((runner.path, runner.slug), {}).items():
                if offset not in runner.skipped:
                    by, reason = await _skip_record(log, runner.path, at)
                    runner.skip(offset, by=by, recorded_at=at, reason=reason)
    except StreamkitError as exc:
        _log.warning("skip.check_failed", error=exc.message)


async def _skip_record(log: Log, path: str, at: int) -> tuple[object, str | None]:
    """Who skipped and why, from the skip event at offset ``at`` (for the log line)."""
    page = await log.stream(path).read(at - 1, 1)
    payload = page.events[0].payload if page.events else None
    if not isinstance(payload, dict):
        return None, None
    reason = payload.get("reason")
    return payload.get("by"), reason if isinstance(reason, str) else None

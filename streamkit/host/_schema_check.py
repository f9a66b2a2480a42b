"""A host's data check at start: can the code it runs read what the log stores?

The cheap half of ``streamkit schema check`` (:mod:`streamkit.schema_check`)
for every processor the host is configured with, whether or not it will
hold its lease: judged from the log's summary of stored types, so it costs
one small read per path whatever the log's size. ``schema_check`` in the
host's config says what a problem does: ``"warn"`` (the default) logs each
one and shows it in ``status``, ``/metrics`` and the admin page;
``"refuse"`` stops the start with :class:`~streamkit.errors.SchemaCheckFailed`
before any lease is taken; ``"off"`` does not check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import structlog

from streamkit.contract import OnMalformed
from streamkit.errors import SchemaCheckFailed
from streamkit.log import Log
from streamkit.processor import StreamProcessor
from streamkit.schema_check import ProcessorCheck, check_processor

__all__ = ["start_check"]

_log = structlog.get_logger("streamkit.host")

CheckMode = Literal["warn", "refuse", "off"]


async def start_check(
    log: Log,
    processors: Sequence[tuple[StreamProcessor[Any], str, OnMalformed | None]],
    mode: CheckMode,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Check each ``(processor, path, on_malformed)``; per ``(path, slug)``, what status shows.

    Raises :class:`SchemaCheckFailed` under ``"refuse"`` when any has a problem.
    """
    if mode == "off":
        return {}
    summaries: dict[str, Any] = {}
    checks: list[ProcessorCheck] = []
    for processor, path, on_malformed in processors:
        if path not in summaries:
            # The head first: a commit after it is in the summary read next (the summary
            # moves in its commit), so only rows the summary truly misses read as behind.
            head = await log.stream(path).head()
            summaries[path] = (await log.stored_types(path), head)
        stored, head = summaries[path]
        checks.append(
            await check_processor(
                processor.contract, log.stream(path), stored, head, on_malformed=on_malformed
            )
        )
    results = {(check.path, check.slug): shown(check) for check in checks}
    found = [
        f"{slug} on {path}: {problem['text']}"
        for (path, slug), result in results.items()
        for problem in result["problems"]
    ]
    for problem in found:
        _log.warning("host.schema_check", problem=problem, mode=mode)
    if found and mode == "refuse":
        raise SchemaCheckFailed(
            f"the log stores events these processors' code would skip or stall at "
            f"({'; '.join(found)}); the host did not start and nothing was written (deploy "
            'code that reads them, or set schema_check = "warn" to start anyway)',
            details={"problems": found},
        )
    return results


def shown(check: ProcessorCheck) -> dict[str, Any]:
    """What ``status`` shows of one processor's check at start."""
    problems = [
        {
            "type": verdict.stored.type,
            "version": verdict.stored.version,
            "outcome": verdict.outcome,
            "count": verdict.stored.count,
            "first_offset": verdict.stored.first_offset,
            "text": verdict.describe(check.on_malformed),
        }
        for verdict in check.problems
    ]
    if check.summary_behind:
        problems.append(
            {
                "type": None,
                "version": None,
                "outcome": "summary_behind",
                "count": check.head - check.summary_through,
                "first_offset": check.summary_through + 1,
                "text": check.behind_text(),
            }
        )
    return {"ok": check.ok, "problems": problems}

"""A host's data check at start: can the code it runs read what the log stores?

``streamkit schema check`` (:mod:`streamkit.schema_check`) for every
processor the host is configured with, whether or not it will hold its
lease: judged from the log's summary of stored types (one small read per
path whatever the log's size), and each stored (type, version) a processor
reads validated on a sample of its payloads (``[schema] sample``, 200 by
default, each key's scan bounded), so a model that no longer reads what a
producer wrote is caught before a shadow build skips or stalls on it.
``schema_check`` in the host's config says what a problem does:

- ``"auto"`` (the default): a *new version* (another version of its slug
  serves) whose code would skip or stall at events its predecessor already
  reduced (at or below the serving cursor) refuses the start with
  :class:`~streamkit.errors.SchemaCheckFailed` before any lease is taken;
  every other problem is warned of;
- ``"warn"`` logs each one and shows it in ``status``, ``/metrics`` and the
  admin page;
- ``"refuse"`` stops the start on any problem;
- ``"off"`` does not check.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal

import structlog

from streamkit.errors import SchemaCheckFailed
from streamkit.failure_policy import OnMalformed
from streamkit.log import Log
from streamkit.processor import StreamProcessor
from streamkit.protocols import HostStore
from streamkit.schema_check import ProcessorCheck, check_processor

__all__ = ["start_check"]

_log = structlog.get_logger("streamkit.host")

CheckMode = Literal["auto", "warn", "refuse", "off"]

SCAN_PER_SAMPLE = 50
"""Events a key's validation may read per payload it samples: a rare type spread over a long
log is validated on what that many reads met, not on a scan of the whole log at every start."""


async def start_check(
    log: Log,
    store: HostStore,
    processors: Sequence[tuple[StreamProcessor[Any], str, OnMalformed | None]],
    mode: CheckMode,
    sample: int,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Check each ``(processor, path, on_malformed)``; per ``(path, slug)``, what status shows.

    Raises :class:`SchemaCheckFailed` under ``"refuse"`` when any has a
    problem, and under ``"auto"`` when a new version has one in what its
    predecessor reduced.
    """
    if mode == "off":
        return {}
    summaries: dict[str, Any] = {}
    checks: list[ProcessorCheck] = []
    refused: list[str] = []
    for processor, path, on_malformed in processors:
        if path not in summaries:
            # The head first: a commit after it is in the summary read next (the summary
            # moves in its commit), so only rows the summary truly misses read as behind.
            head = await log.stream(path).head()
            summaries[path] = (await log.stored_types(path), head)
        stored, head = summaries[path]
        check = await check_processor(
            processor.contract,
            log.stream(path),
            stored,
            head,
            on_malformed=on_malformed,
            validate=sample or None,
            scan_limit=sample * SCAN_PER_SAMPLE,
            read=functools.partial(log.stream(path).read, include_archive=True),
        )
        checks.append(check)
        if mode == "auto" and check.problems:
            refused += await _read_by_predecessor(store, processor, check)
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
    if refused:
        raise SchemaCheckFailed(
            f"a new version would skip or stall at events the version serving now already "
            f"reduced ({'; '.join(refused)}); the host did not start and nothing was written "
            '(deploy a model or upcaster that reads them, or set schema_check = "warn" to '
            "start anyway and let the new version stall there in the shadow)",
            details={"problems": refused},
        )
    return results


async def _read_by_predecessor(
    store: HostStore, processor: StreamProcessor[Any], check: ProcessorCheck
) -> list[str]:
    """The problems of a new version that lie in what the serving (older) version reduced."""
    contract = processor.contract
    serving, _ = await store.version_rows(contract.slug, contract.version)
    if serving is None or serving.reducer_version == contract.version:
        return []
    cursor = serving.reduced_through_offset
    return [
        f"{check.slug} v{contract.version} on {check.path} (v{serving.reducer_version} serves, "
        f"through {cursor}): {verdict.describe(check.on_malformed)}"
        for verdict in check.problems
        if verdict.stored.first_offset <= cursor
    ]


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

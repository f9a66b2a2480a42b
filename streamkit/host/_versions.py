"""A processor's versions side by side: what an operator looks at before a manual cutover.

:func:`compare_versions` answers, for one processor of a host, every
version's checkpoint row (role, cursor, where it became serving, where it
was replaced) with what that version skipped over its life (the tally kept
with its checkpoint, :mod:`streamkit.engine._skip_tally`: malformed
payloads and failed reduces per type with their first offsets, dropped
events; kept after it stops serving), each version's stored state, a JSON patch from the serving
version's state to each other version's (what the new reduce changes), and
what every running host counts for the version it runs: malformed
payloads (per type), reduce failures, failed batches, events an upcaster
dropped. The counts of other hosts are asked over their control sockets
(a host that does not answer within a second is listed as unreachable, not
left out); the rows and states come from the database.

The states are the checkpoints' JSON as stored (a ``compact_state``
contract leaves fields at their defaults out of it): a version building or
waiting in the shadow writes its row every couple of seconds, so its state
may trail the serving one's by as much; each row says its cursor.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonpatch

from streamkit.backends import registered_sockets
from streamkit.checkpoint import ReduceCheckpoint
from streamkit.control import request_sync
from streamkit.engine import shown_tally
from streamkit.errors import StreamkitError
from streamkit.host._runner import ProcessorRunner
from streamkit.protocols import HostStore

__all__ = ["COUNTED", "compare_versions"]

COUNTED = (
    "malformed_payloads",
    "malformed_by_type",
    "reduce_failures",
    "batch_failures",
    "events_dropped",
)
"""The counters of a status row shown per version."""

_IN_STATUS = {"events_dropped": "dropped_events"}
"""A counter shown under another name than its status row's."""

MAX_PATCH_OPERATIONS = 200
"""The most patch operations listed per version (the count says how many there were)."""

ASK_TIMEOUT = 1.0
"""Seconds another host's control socket is given to answer."""


async def compare_versions(
    store: HostStore,
    runner: ProcessorRunner,
    here: dict[str, Any],
    *,
    db: str,
    served_db: str,
    owner: str,
) -> dict[str, Any]:
    """``{slug, path, serving_version, versions: [...], hosts: [...]}`` (see the module).

    ``here`` is this host's status row of the processor.
    """
    rows = await store.checkpoint_versions(runner.slug)
    tallies = await store.version_incidents(runner.slug)
    serving = next((row for row in rows if row.serving), None)
    serving_state = _state(serving)
    versions = []
    for row in rows:
        state = _state(row)
        entry: dict[str, Any] = {
            "version": row.reducer_version,
            "role": _role(row),
            "cursor": row.reduced_through_offset,
            "state_through": row.state_through_offset,
            "cutover_offset": row.cutover_offset if row.serving else None,
            "retired_at": row.retired_at,
            "skipped": shown_tally(tallies.get(row.reducer_version)),
            "state": state,
        }
        if serving is not None and row is not serving:
            operations = jsonpatch.make_patch(serving_state, state).patch
            entry["differences"] = len(operations)
            entry["patch"] = operations[:MAX_PATCH_OPERATIONS]
        versions.append(entry)
    hosts = [_counts(owner, here)]
    hosts += await _other_hosts(db, served_db, owner, runner)
    return {
        "slug": runner.slug,
        "path": runner.path,
        "serving_version": None if serving is None else serving.reducer_version,
        "versions": versions,
        "hosts": hosts,
    }


def _role(row: ReduceCheckpoint) -> str:
    if row.serving:
        return "serving"
    return "retired" if row.retired_at is not None else "building"


def _state(row: ReduceCheckpoint | None) -> Any:
    if row is None or row.state_json is None:
        return None
    return json.loads(row.state_json)


def _counts(owner: str, row: dict[str, Any]) -> dict[str, Any]:
    return {
        "owner": owner,
        "version": row.get("version"),
        "phase": row.get("phase"),
        "reachable": True,
        **{name: row.get(_IN_STATUS.get(name, name)) for name in COUNTED},
    }


async def _other_hosts(
    db: str, served_db: str, owner: str, runner: ProcessorRunner
) -> list[dict[str, Any]]:
    """The counts of every other registered host running the processor (or why not)."""

    def ask() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for socket in registered_sockets(db, runner.slug):
            try:
                status = request_sync(socket, "status", timeout=ASK_TIMEOUT, db=served_db)
            except (StreamkitError, OSError) as exc:
                found.append({"socket": socket, "reachable": False, "error": str(exc)})
                continue
            other = (status.get("host") or {}).get("owner")
            if other == owner:
                continue
            for row in status.get("processors", []):
                mine = row.get("slug") == runner.slug and row.get("path") == runner.path
                if mine and row.get("phase") is not None:
                    found.append(_counts(str(other), row))
        return found

    return await asyncio.to_thread(ask)

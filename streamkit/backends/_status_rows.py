"""The durable status of processors, assembled from what any backend stores.

``streamkit status`` without a host, and a host under its runtime view,
show one row per known ``(path, slug)``: its checkpoint's version and
cursor, the path's head, the lag in durable events, the lease and the
claim. A backend reads its tables and hands the rows here, so every backend
shows the same shape; :func:`checkpoint_snapshot_of` is ``streamkit
snapshot``'s answer from a stored checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from streamkit.checkpoint import SHADOW_MARK, ReduceCheckpoint, shown_cursor
from streamkit.errors import InvalidRequest
from streamkit.protocols import Lease

__all__ = ["checkpoint_snapshot_of", "status_rows"]


def status_rows(
    leases: Iterable[tuple[Lease, bool]],
    claims: Iterable[tuple[str, str, float]],
    checkpoints: Iterable[tuple[str, ReduceCheckpoint]],
    head_and_lag: Callable[[str, int], tuple[int, int]],
) -> list[dict[str, Any]]:
    """One row per ``(path, slug)``, sorted; ``leases`` come with whether each is held now.

    ``head_and_lag(path, cursor)`` gives the path's durable head and the
    durable events past ``cursor``. A checkpoint whose slug has no lease or
    claim (on any path) gets a row without a path.
    """
    rows: dict[tuple[str | None, str], dict[str, Any]] = {}

    def row(path: str | None, slug: str) -> dict[str, Any]:
        return rows.setdefault(
            (path, slug),
            {
                "path": path,
                "slug": slug,
                "version": None,
                "cursor": None,
                "head": None,
                "lag": None,
                "lease": None,
                "shadow_lease": None,
                "claim_due": None,
            },
        )

    for lease, held in leases:
        data = lease.to_dict()
        data["held"] = held
        slug, shadow, version = lease.slug.partition(SHADOW_MARK)
        if shadow:
            # A version building in the shadow (see streamkit.host._version_role): shown
            # beside the processor it will serve, not as a processor of its own.
            data["version"] = version
            row(lease.path, slug)["shadow_lease"] = data
            continue
        row(lease.path, lease.slug)["lease"] = data
    for path, slug, due in claims:
        row(path, slug)["claim_due"] = due
    for slug, checkpoint in checkpoints:
        targets = [r for (_, s), r in rows.items() if s == slug] or [row(None, slug)]
        for target in targets:
            target["version"] = checkpoint.reducer_version
            target["cursor"] = checkpoint.reduced_through_offset
    for (at, _), data in rows.items():
        if at is None:
            continue
        cursor = data["cursor"]
        head, lag = head_and_lag(at, cursor or 0)
        data["head"] = head
        data["lag"] = lag
        data["cursor"] = shown_cursor(cursor, head)
    return sorted(rows.values(), key=lambda r: (r["path"] or "", r["slug"]))


def checkpoint_snapshot_of(slug: str, checkpoint: ReduceCheckpoint | None) -> dict[str, Any]:
    """``{offset, cursor, state, version, source: "checkpoint"}``; InvalidRequest if there is none.

    ``offset`` is where the stored state was reduced through, ``cursor`` where
    the processor's effects ran through: a large state's write waits for
    later batches, so it may lag the cursor (the processor reduces the events
    between again when it next starts).
    """
    if checkpoint is None:
        raise InvalidRequest(
            f"processor {slug!r} has no checkpoint in this log (it never ran here, or the slug "
            "is misspelt); nothing was read",
            details={"slug": slug},
        )
    state = None if checkpoint.state_json is None else json.loads(checkpoint.state_json)
    return {
        "offset": checkpoint.state_through_offset,
        "cursor": checkpoint.reduced_through_offset,
        "state": state,
        "version": checkpoint.reducer_version,
        "source": "checkpoint",
    }

"""Whether a host is healthy (``/healthz``) and ready (``/readyz``), on facts the host reports.

A health check that cannot go red is not one. Each rule below names a way a
host can look alive (its socket answers, its process runs) while its
processors make no progress, and says which:

- **the database does not answer**: nothing can be read or written;
- **a processor is stalled**: its batches keep failing (the runner said so);
- **a processor is stuck**: it runs here, the head is ahead of its cursor,
  and its cursor has not moved for ``stuck_after`` seconds (a batch hung in
  a handler, say, or a push lost with nothing to repair it);
- **the follow loop stopped**: the log has not looked for other processes'
  commits for ``follow_stale_after`` seconds while processors follow it, so
  appends from elsewhere never reach them.

:func:`assess` is a pure function of the status the host reports and the
follow loop's age: the rules are tested without a server.

Health is liveness: a host rebuilding a processor for hours is healthy (it
works), and a probe that restarted it would throw that work away.
Readiness (:func:`readiness`) is what a load balancer asks: whether every
processor this host runs serves current state, that is, is past its
catch-up and any version re-reduce, not stalled and not left to newer code;
and whether every processor it is configured with is served at all: one
whose serving version runs on no live host (``unserved``, see
``streamkit.host._serving_watch``) makes it not ready, with that reason.

Liveness is about this host's own work only: a version building in the
shadow (``shadow``) that fails never turns ``/healthz`` red; its row, the
metrics and ``/readyz`` show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Health", "assess", "readiness"]


@dataclass(frozen=True)
class Health:
    """The verdict: healthy or not, and why not (one sentence per failed rule)."""

    healthy: bool
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON ``/healthz`` answers with."""
        return {"status": "ok" if self.healthy else "unhealthy", "reasons": self.reasons}


def assess(
    status: dict[str, Any],
    follow_age: float | None,
    *,
    stuck_after: float,
    follow_stale_after: float,
) -> Health:
    """The host's health from its ``status()`` and the log's ``follow_age()``."""
    reasons: list[str] = []
    database = status.get("database") or {}
    if not database.get("reachable", True):
        reasons.append(f"the database does not answer: {database.get('error')}")
    uptime = (status.get("host") or {}).get("uptime") or 0.0
    for row in status.get("processors", []):
        name = f"processor {row['slug']!r} on {row['path']!r}"
        if row.get("shadow"):
            continue  # a build beside the serving version: not this host's serving work
        if row.get("stalled"):
            error = (row.get("last_error") or {}).get("error", "its batches keep failing")
            reasons.append(f"{name} is stalled at offset {row.get('stalled_at')}: {error}")
            continue
        lag = row.get("lag")
        if not row.get("lease_held_here") or not lag:
            continue
        still = row.get("last_batch_age")
        if still is None:
            still = uptime  # no batch yet in this host: standing still since it started
        if still >= stuck_after:
            reasons.append(
                f"{name} is stuck: the head is {lag} event(s) ahead and its cursor has not "
                f"moved for {still:.0f} s (over {stuck_after:g} s)"
            )
    if follow_age is not None and follow_age >= follow_stale_after:
        reasons.append(
            f"the follow loop stopped: the log has not looked for other processes' commits "
            f"for {follow_age:.0f} s (over {follow_stale_after:g} s)"
        )
    return Health(not reasons, reasons)


def readiness(status: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """``(ready, body)``: whether every processor running here serves current state.

    The body lists each processor this host runs with its phase and, when it
    is not ready, why, and each one it does not run that no live host serves.
    A host that runs none (their leases are elsewhere, on live hosts) is
    ready: it serves nothing stale.
    """
    database = status.get("database") or {}
    rows = []
    for row in status.get("processors", []):
        phase = row.get("phase")
        unserved = row.get("unserved")
        if phase is None:
            stopped = row.get("cannot_build")
            if stopped:
                # Its version cannot be built here (history it needs was deleted): the deploy
                # is stuck until an operator decides, so this host is not ready for it.
                phase, why = "cannot-build", f"cannot-build: {stopped['reason']}"
            elif unserved:
                phase, why = "unserved", unserved["text"]
            else:
                continue  # not run here, and served elsewhere
            rows.append(
                {
                    "slug": row["slug"],
                    "path": row["path"],
                    "phase": phase,
                    "ready": False,
                    "why": why,
                }
            )
            continue
        reason: str | None = None
        if row.get("stalled"):
            reason = f"stalled at offset {row.get('stalled_at')}"
        elif row.get("ahead_of_code"):
            reason = "stopped at a payload newer than its code"
        elif phase != "serving":
            progress = row.get("progress") or {}
            reason = f"{phase}: {progress.get('through')} of {progress.get('target')}"
        rows.append(
            {
                "slug": row["slug"],
                "path": row["path"],
                "phase": phase,
                "ready": reason is None,
                "why": reason,
            }
        )
    reachable = database.get("reachable", True)
    ready = reachable and all(item["ready"] for item in rows)
    body: dict[str, Any] = {"status": "ready" if ready else "not ready", "processors": rows}
    if not reachable:
        body["database"] = database.get("error")
    return ready, body

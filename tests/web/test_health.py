"""The health rules on their own: each way a host can look alive while making no progress;
and the readiness rule, which a host that works but does not yet serve current state fails."""

from __future__ import annotations

from typing import Any

from streamkit.web._health import assess, readiness


def row(**fields: Any) -> dict[str, Any]:
    base = {
        "slug": "tally",
        "path": "/",
        "stalled": False,
        "lag": 0,
        "lease_held_here": True,
        "last_batch_age": 1.0,
    }
    return {**base, **fields}


def status(*rows: dict[str, Any], reachable: bool = True, uptime: float = 100.0) -> dict[str, Any]:
    return {
        "database": {"reachable": reachable, "error": None if reachable else "gone"},
        "host": {"uptime": uptime},
        "processors": list(rows),
    }


def check(state: dict[str, Any], follow_age: float | None = 0.1) -> list[str]:
    return assess(state, follow_age, stuck_after=60.0, follow_stale_after=30.0).reasons


def test_a_host_that_keeps_up_is_healthy() -> None:
    """Processors at the head, a fresh follow loop, a database that answers: no reasons."""
    assert check(status(row(), row(slug="other", lag=5, last_batch_age=2.0))) == []


def test_a_lag_is_not_unhealthy_while_the_cursor_moves() -> None:
    """A backlog being worked through (recent batches) is progress, not a fault."""
    assert check(status(row(lag=10_000, last_batch_age=0.5))) == []


def test_a_cursor_standing_still_behind_the_head_is_stuck() -> None:
    """Lag with no batch for stuck_after seconds; with no batch ever, the uptime counts."""
    (reason,) = check(status(row(lag=3, last_batch_age=61.0)))
    assert "stuck" in reason
    (reason,) = check(status(row(lag=3, last_batch_age=None), uptime=61.0))
    assert "stuck" in reason
    assert check(status(row(lag=3, last_batch_age=None), uptime=10.0)) == []


def test_a_processor_run_by_another_host_is_that_host_s_to_report() -> None:
    """Without the lease here, a standing cursor is not this host's fault."""
    assert check(status(row(lag=3, last_batch_age=None, lease_held_here=False))) == []


def test_a_stalled_processor_an_unreachable_database_and_a_dead_follow_loop() -> None:
    """Each is its own reason, all reported together."""
    stalled = row(stalled=True, stalled_at=7, last_error={"error": "boom"})
    reasons = check(status(stalled, reachable=False), follow_age=31.0)
    assert len(reasons) == 3
    assert "does not answer" in reasons[0]
    assert "stalled at offset 7: boom" in reasons[1]
    assert "follow loop stopped" in reasons[2]
    assert check(status(row()), follow_age=None) == []  # nobody follows: nothing to look for


def test_readiness_waits_for_every_processor_run_here_to_serve() -> None:
    """Serving everywhere: ready; one catching up, rebuilding, stalled or left to newer code:
    not ready, each named with why; one run elsewhere is not this host's to judge."""
    serving = row(phase="serving")
    elsewhere = row(slug="far", phase=None, lease_held_here=False)
    assert readiness(status(serving, elsewhere)) == (
        True,
        {
            "status": "ready",
            "processors": [
                {"slug": "tally", "path": "/", "phase": "serving", "ready": True, "why": None}
            ],
        },
    )
    rebuilding = row(slug="v2", phase="rebuilding", progress={"through": 500, "target": 900})
    stalled = row(slug="stuck", phase="catching-up", stalled=True, stalled_at=7)
    ahead = row(slug="old", phase="serving", ahead_of_code={"offset": 9})
    ready, body = readiness(status(serving, rebuilding, stalled, ahead, elsewhere))
    assert not ready
    assert body["status"] == "not ready"
    assert {item["slug"]: item["why"] for item in body["processors"]} == {
        "tally": None,
        "v2": "rebuilding: 500 of 900",
        "stuck": "stalled at offset 7",
        "old": "stopped at a payload newer than its code",
    }


def test_a_host_that_runs_nothing_is_ready_unless_its_database_is_gone() -> None:
    assert readiness(status())[0]
    ready, body = readiness(status(reachable=False))
    assert not ready
    assert body["database"] == "gone"

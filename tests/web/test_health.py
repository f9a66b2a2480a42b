"""The health rules on their own: each way a host can look alive while making no progress."""

from __future__ import annotations

from typing import Any

from streamkit.web._health import assess


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

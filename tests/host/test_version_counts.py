"""What ``processor versions`` shows of each running host: its status row's counters."""

from __future__ import annotations

from streamkit.host._versions import _counts


def test_each_host_s_counts_in_versions_are_read_from_its_status_row() -> None:
    """`events_dropped` is the status row's `dropped_events` (it read as 0, always)."""
    row = {
        "version": "2",
        "phase": "serving",
        "malformed_payloads": 1,
        "malformed_by_type": [],
        "reduce_failures": 2,
        "batch_failures": 0,
        "dropped_events": 3,
    }
    counts = _counts("host-a", row)
    assert (counts["reduce_failures"], counts["events_dropped"]) == (2, 3)

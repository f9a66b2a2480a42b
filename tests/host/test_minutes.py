"""The last hour of a processor a minute at a time: what the admin page charts."""

from __future__ import annotations

from streamkit.host._metrics import ProcessorMetrics
from streamkit.host._minutes import MINUTES, MinuteSeries


def test_minutes_count_events_and_failures_and_leave_out_what_came_before() -> None:
    series = MinuteSeries(1000 * 60 + 5)
    series.events(10, 1000 * 60 + 30)
    series.failure(1000 * 60 + 40)
    series.events(3, 1002 * 60 + 1)
    assert series.series(1002 * 60 + 2) == {
        "minutes": 3,
        "events": [10, 0, 3],
        "failures": [1, 0, 0],
    }


def test_an_hour_later_the_old_minutes_are_gone() -> None:
    series = MinuteSeries(0)
    for minute in range(MINUTES):
        series.events(minute + 1, minute * 60)
    shown = series.series((MINUTES - 1) * 60)
    assert shown["events"] == list(range(1, MINUTES + 1))
    later = series.series((MINUTES + 9) * 60)  # ten minutes on: the first ten fell off
    assert later["minutes"] == MINUTES
    assert later["events"] == [*range(11, MINUTES + 1), *([0] * 10)]
    after_a_gap = series.series(10 * MINUTES * 60)
    assert after_a_gap["events"] == [0] * MINUTES


def test_a_processor_s_metrics_carry_its_last_hour() -> None:
    metrics = ProcessorMetrics(now_monotonic=120.0)
    metrics.batch_done(5, 121.0, None)
    metrics.batch_failed(185.0)
    shown = metrics.to_dict(186.0)
    assert shown["batch_failures"] == 1
    assert shown["last_hour"] == {"minutes": 2, "events": [5, 0], "failures": [0, 1]}

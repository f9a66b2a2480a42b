"""The time rules of recurring schedules: slots, daylight saving time, catch-up from now, jitter."""

from __future__ import annotations

import sys
from datetime import UTC, date, datetime, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streamkit.processors.schedules import (
    Catchup,
    Cron,
    Every,
    Missed,
    due,
    jitter,
    parse_duration,
)
from streamkit.processors.schedules._timing import MAX_COUNTED

from streamkit.errors import InvalidConfig, InvalidRequest

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def at(*parts: int, tz: ZoneInfo | None = None) -> datetime:
    """An aware instant: UTC unless a zone is given (then a wall time, fold 0)."""
    return datetime(*parts, tzinfo=tz or UTC)  # type: ignore[misc]


def take(timing: Cron | Every, after: datetime, count: int) -> list[datetime]:
    return list(islice(timing.forward(after), count))


def walls(slots: list[datetime], zone: ZoneInfo) -> list[str]:
    return [s.astimezone(zone).strftime("%m-%d %H:%M %Z") for s in slots]


# -- durations and Every -----------------------------------------------------------------


def test_durations_read_as_people_write_them_and_anything_else_is_refused() -> None:
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("2d") == timedelta(days=2)
    assert parse_duration(timedelta(minutes=3)) == timedelta(minutes=3)
    for bad in ("", "5", "m5", "5 minutes", "-5m", "1h 30m"):
        with pytest.raises(InvalidRequest, match="is not a duration"):
            parse_duration(bad, "interval")


def test_every_falls_on_its_anchor_grid_whatever_instant_it_starts_from() -> None:
    five = Every("5m")
    assert take(five, at(2026, 3, 1, 10, 2, 7), 3) == [
        at(2026, 3, 1, 10, 5),
        at(2026, 3, 1, 10, 10),
        at(2026, 3, 1, 10, 15),
    ]
    # Strictly after: a slot instant itself is not returned again.
    assert take(five, at(2026, 3, 1, 10, 5), 1) == [at(2026, 3, 1, 10, 10)]
    assert list(islice(five.backward(at(2026, 3, 1, 10, 5)), 2)) == [
        at(2026, 3, 1, 10, 5),
        at(2026, 3, 1, 10, 0),
    ]
    assert five.count(at(2026, 3, 1, 10, 0), at(2026, 3, 1, 11, 0), 1000) == 12
    anchored = Every("1h", anchor=at(2026, 1, 1, 0, 20))
    assert take(anchored, at(2026, 3, 1, 10, 0), 1) == [at(2026, 3, 1, 10, 20)]


def test_every_is_daylight_saving_blind_it_counts_real_time() -> None:
    hourly = Every("1h")
    slots = take(hourly, at(2026, 10, 24, 23, 0), 4)  # Berlin falls back at 01:00 UTC
    assert [b - a for a, b in pairwise(slots)] == [timedelta(hours=1)] * 3


def test_every_refuses_sub_second_intervals_and_naive_instants() -> None:
    with pytest.raises(InvalidRequest, match="shorter than one second"):
        Every("500ms")
    with pytest.raises(InvalidRequest, match="has no time zone"):
        next(Every("1m").forward(datetime(2026, 1, 1)))


# -- Cron and daylight saving time ------------------------------------------------------


def test_a_daily_wall_time_inside_the_spring_gap_fires_once_at_the_end_of_the_gap() -> None:
    nightly = Cron("30 2 * * *", tz="Europe/Berlin")
    slots = take(nightly, at(2026, 3, 27, 12), 3)
    assert walls(slots, BERLIN) == ["03-28 02:30 CET", "03-29 03:00 CEST", "03-30 02:30 CEST"]
    ny = Cron("30 2 * * *", tz="America/New_York")
    assert walls(take(ny, at(2026, 3, 7, 12), 3), NEW_YORK) == [
        "03-08 03:00 EDT",
        "03-09 02:30 EDT",
        "03-10 02:30 EDT",
    ]


def test_a_daily_wall_time_the_fall_repeats_fires_once_at_its_first_occurrence() -> None:
    nightly = Cron("30 2 * * *", tz="Europe/Berlin")
    slots = take(nightly, at(2026, 10, 24, 12), 2)
    assert walls(slots, BERLIN) == ["10-25 02:30 CEST", "10-26 02:30 CET"]
    ny = Cron("30 1 * * *", tz="America/New_York")
    assert walls(take(ny, at(2026, 10, 31, 12), 2), NEW_YORK) == [
        "11-01 01:30 EDT",
        "11-02 01:30 EST",
    ]


def test_gap_and_fold_are_choices_of_each_schedule() -> None:
    skipping = Cron("30 2 * * *", tz="Europe/Berlin", gap="skip")
    assert walls(take(skipping, at(2026, 3, 27, 12), 2), BERLIN) == [
        "03-28 02:30 CET",
        "03-30 02:30 CEST",  # no slot on the 29th: its 02:30 never happened
    ]
    last = Cron("30 2 * * *", tz="Europe/Berlin", fold="last")
    assert walls(take(last, at(2026, 10, 24, 12), 1), BERLIN) == ["10-25 02:30 CET"]


def test_a_timing_with_no_slot_is_refused_and_a_rare_one_is_walked_in_bounds() -> None:
    """A wall time Berlin always skips, with gap "skip", has no slot: refused at once, not
    walked to year 9999 (0.8 s a pass, then OverflowError). A rare one still has its slots."""
    with pytest.raises(InvalidRequest, match="has no slot") as refused:
        Cron("30 2 * 3 0L", tz="Europe/Berlin", gap="skip")
    assert refused.value.details["tz"] == "Europe/Berlin"
    shifted = Cron("30 2 * 3 0L", tz="Europe/Berlin")  # the default gap: after the gap
    assert walls(take(shifted, at(2026, 1, 1), 2), BERLIN) == [
        "03-29 03:00 CEST",
        "03-28 03:00 CEST",
    ]
    leap = Cron("0 0 29 2 *")  # every fourth year
    assert take(leap, at(2026, 1, 1), 2) == [at(2028, 2, 29), at(2032, 2, 29)]
    assert list(islice(leap.backward(at(2026, 1, 1)), 1)) == [at(2024, 2, 29)]
    # Near the end of cronsim's calendar the walk ends, it does not raise.
    assert list(leap.forward(datetime(9996, 3, 1, tzinfo=UTC))) == []


def test_an_hourly_schedule_across_both_transitions() -> None:
    hourly = Cron("0 * * * *", tz="Europe/Berlin")
    # Spring: 02:00 does not exist; it shifts to 03:00, which is one slot with 03:00 itself.
    assert walls(take(hourly, at(2026, 3, 29, 0, 10), 3), BERLIN) == [
        "03-29 03:00 CEST",
        "03-29 04:00 CEST",
        "03-29 05:00 CEST",
    ]
    # Fall: 02:00 happens twice; it is one slot, at the first, then 03:00 CET.
    assert walls(take(hourly, at(2026, 10, 24, 23, 10), 3), BERLIN) == [
        "10-25 02:00 CEST",
        "10-25 03:00 CET",
        "10-25 04:00 CET",
    ]
    ny = Cron("0 * * * *", tz="America/New_York")
    assert walls(take(ny, at(2026, 3, 8, 6, 10), 2), NEW_YORK) == [
        "03-08 03:00 EDT",
        "03-08 04:00 EDT",
    ]
    assert walls(take(ny, at(2026, 11, 1, 4, 10), 3), NEW_YORK) == [
        "11-01 01:00 EDT",
        "11-01 02:00 EST",
        "11-01 03:00 EST",
    ]


ZONES = [
    "America/New_York",
    "Europe/London",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
]


@settings(max_examples=25, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    hour=st.integers(0, 23),
    minute=st.sampled_from([0, 15, 30, 45]),
    year=st.sampled_from([2025, 2026]),
)
def test_a_daily_schedule_fires_once_each_local_day_of_a_year_at_its_time_or_after_a_gap(
    zone: str, hour: int, minute: int, year: int
) -> None:
    """One simulated year: one slot per local date, ascending, at the wall time when it exists."""
    tz = ZoneInfo(zone)
    daily = Cron(f"{minute} {hour} * * *", tz=zone)
    start = datetime(year, 1, 1, tzinfo=tz).astimezone(UTC) - timedelta(seconds=1)
    end = datetime(year + 1, 1, 1, tzinfo=tz).astimezone(UTC) - timedelta(seconds=1)
    slots = []
    for slot in daily.forward(start):
        if slot > end:
            break
        slots.append(slot)
    assert slots == sorted(set(slots))
    days = [s.astimezone(tz).date() for s in slots]
    assert days == [date(year, 1, 1) + timedelta(days=n) for n in range(len(days))]
    assert days[-1] == date(year, 12, 31)
    for slot in slots:
        local = slot.astimezone(tz)
        wanted = local.replace(hour=hour, minute=minute, tzinfo=None)
        if (local.hour, local.minute) != (hour, minute):
            # Only a wall time that did not exist moves, and only to the gap's end.
            gap_wall = wanted.replace(tzinfo=tz)
            assert gap_wall.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wanted
            assert (slot - timedelta(seconds=1)).astimezone(tz).utcoffset() != local.utcoffset()
        else:
            assert local.fold == 0  # a repeated wall time fires at its first occurrence


def test_cron_takes_aliases_six_fields_with_seconds_first_and_refuses_the_rest() -> None:
    assert take(Cron("@hourly"), at(2026, 1, 1, 0, 30), 1) == [at(2026, 1, 1, 1, 0)]
    assert take(Cron("@daily", tz="UTC"), at(2026, 1, 1, 0, 30), 1) == [at(2026, 1, 2)]
    assert take(Cron("*/20 * * * * *"), at(2026, 1, 1), 3) == [
        at(2026, 1, 1, 0, 0, 20),
        at(2026, 1, 1, 0, 0, 40),
        at(2026, 1, 1, 0, 1, 0),
    ]
    with pytest.raises(InvalidRequest, match=r"cron expression '61 \* \* \* \*' is refused"):
        Cron("61 * * * *")
    with pytest.raises(InvalidRequest, match="not in the zone database"):
        Cron("0 3 * * *", tz="Mars/Olympus")
    with pytest.raises(InvalidRequest, match='neither "shift" nor "skip"'):
        Cron("0 3 * * *", gap="later")  # type: ignore[arg-type]


# -- due: catch-up from now --------------------------------------------------------------


def test_on_time_a_slot_fires_and_nothing_is_missed() -> None:
    decided = due(Every("1m"), Catchup(), at(2026, 1, 1, 10, 0, 30), at(2026, 1, 1, 10, 1, 2))
    assert decided.fire == (at(2026, 1, 1, 10, 1),)
    assert decided.missed == ()


def test_skip_fires_only_within_its_grace_and_records_the_rest_as_one_range() -> None:
    asleep = due(Every("1m"), Catchup("skip"), at(2026, 1, 1, 0, 0), at(2026, 1, 2, 0, 0, 30))
    assert asleep.fire == (at(2026, 1, 2, 0, 0),)
    assert asleep.missed == (Missed("window", at(2026, 1, 1, 0, 1), at(2026, 1, 1, 23, 59), 1439),)


def test_latest_fires_the_newest_slot_once_and_coalesces_the_others() -> None:
    nightly = Cron("0 3 * * *", tz="Europe/Berlin")
    decided = due(nightly, Catchup("latest", window="3d"), at(2026, 5, 1), at(2026, 5, 4, 12))
    assert walls(list(decided.fire), BERLIN) == ["05-04 03:00 CEST"]
    assert [(m.reason, m.count) for m in decided.missed] == [("window", 1), ("coalesced", 2)]
    assert walls([decided.missed[1].first, decided.missed[1].last], BERLIN) == [
        "05-02 03:00 CEST",
        "05-03 03:00 CEST",
    ]
    late = due(nightly, Catchup("latest", window="1h"), at(2026, 5, 1), at(2026, 5, 4, 12))
    assert late.fire == ()
    assert [(m.reason, m.count) for m in late.missed] == [("window", 4)]


def test_all_fires_each_slot_in_its_window_up_to_max_runs_the_newest() -> None:
    every = Every("10m")
    decided = due(every, Catchup("all", window="1h", max_runs=4), at(2026, 1, 1), at(2026, 1, 1, 3))
    assert decided.fire == (*tuple(at(2026, 1, 1, 2, m) for m in (30, 40, 50)), at(2026, 1, 1, 3))
    assert decided.missed == (
        Missed("window", at(2026, 1, 1, 0, 10), at(2026, 1, 1, 2, 0), 12),
        Missed("max_runs", at(2026, 1, 1, 2, 10), at(2026, 1, 1, 2, 20), 2),
    )


def test_a_host_asleep_for_a_month_decides_once_without_replaying_each_tick() -> None:
    decided = due(Every("1s"), Catchup("all"), at(2026, 1, 1), at(2026, 2, 1))
    assert len(decided.fire) == 100  # max_runs, the newest
    (window, crowded) = decided.missed
    assert window.reason == "window"
    assert (window.count, window.exact) == (MAX_COUNTED, False)  # a bound, said so
    assert crowded.count == 86_400 - 100
    per_minute = Cron("* * * * *")
    slept = due(per_minute, Catchup("skip"), at(2025, 1, 1), at(2026, 1, 1, 0, 0, 5))
    assert slept.fire == (at(2026, 1, 1),)
    assert slept.missed[0].exact is False


def test_nothing_is_due_when_now_is_not_after_the_last_evaluation() -> None:
    assert due(Every("1s"), Catchup(), at(2026, 1, 1, 1), at(2026, 1, 1, 1)).fire == ()
    assert due(Every("1s"), Catchup(), at(2026, 1, 1, 1), at(2026, 1, 1, 0)).missed == ()


def test_catchup_refuses_unknown_policies_and_runs() -> None:
    with pytest.raises(InvalidRequest, match="none of"):
        Catchup("some")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="max_runs 0"):
        Catchup("all", max_runs=0)
    assert Catchup("latest").window == timedelta(days=1)
    assert Catchup("skip").window == timedelta(minutes=1)


# -- jitter ------------------------------------------------------------------------------


def test_jitter_is_fixed_by_name_and_slot_and_stays_below_its_bound() -> None:
    slot = at(2026, 1, 1, 3)
    most = timedelta(seconds=30)
    first = jitter("nightly", slot, most)
    assert first == jitter("nightly", slot.astimezone(BERLIN), most)  # the instant, not its zone
    assert timedelta(0) <= first < most
    spread = {jitter("nightly", slot + timedelta(days=n), most) for n in range(50)}
    assert len(spread) > 40
    assert jitter("other", slot, most) != first
    assert jitter("nightly", slot, timedelta(0)) == timedelta(0)


def test_without_the_schedules_extra_a_cron_timing_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # as if never installed
    with pytest.raises(InvalidConfig, match=r"streamkit-events\[schedules\]"):
        Cron("0 3 * * *")
    assert take(Every("1h"), at(2026, 1, 1), 1) == [at(2026, 1, 1, 1)]  # Every needs nothing

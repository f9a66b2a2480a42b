"""The time rules of recurring schedules: which instants are slots, and which are due now.

A schedule's *slots* are UTC instants; a slot's identity is that instant.
Two timings make them:

- :class:`Every` (``Every("5m")``): the instants ``anchor + k * interval``
  for every integer ``k``. The anchor defaults to the Unix epoch, so "every
  5 minutes" falls on :00, :05, ... of UTC. Daylight saving time never
  matters.
- :class:`Cron` (``Cron("0 3 * * *", tz="Europe/Berlin")``): the expression
  (parsed by cronsim: five fields, or six with seconds first, plus the
  ``@hourly``-style aliases) is matched against the *wall clock* of ``tz``
  (stdlib :mod:`zoneinfo`), and each matching wall time becomes one instant:

  - a wall time that occurs twice (the clocks go back) is one slot, at its
    first occurrence (``fold="first"``; ``"last"`` takes the second);
  - a wall time that does not occur (the clocks go forward) fires at the
    first instant after the gap (``gap="shift"``), or is no slot at all
    (``gap="skip"``); wall times of one gap that shift to the same instant
    are one slot.

Which slots are due is computed from *now* each time
(:func:`due`): the slots in ``(after, now]``, where ``after`` is the last
instant the schedule was evaluated through. Nothing steps a remembered
iterator through past ticks, so a host that slept for a day computes one
decision, not a day of replays. The catch-up policy (:class:`Catchup`)
says which of those slots fire; every other one is returned as
:class:`Missed` with its reason, so that it can be put on record. Jitter is
deterministic per (schedule, slot) (:func:`jitter`): any host computes the
same firing instant.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from streamkit.errors import InvalidConfig, InvalidRequest

if TYPE_CHECKING:
    from cronsim import CronSim as CronSimType

__all__ = [
    "ALIASES",
    "EPOCH",
    "MAX_COUNTED",
    "WINDOWS",
    "Catchup",
    "Cron",
    "Due",
    "Every",
    "Missed",
    "MissedReason",
    "Timing",
    "due",
    "jitter",
    "parse_duration",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

MAX_COUNTED = 100_000
"""The most missed slots counted one by one; past it a :class:`Missed` count is a lower bound."""

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""The usual cron aliases, as the five-field expressions they stand for."""

# A wall time is looked for this far around an instant: more than any zone's
# offset change, so a slot of a repeated or skipped hour is never passed over.
_MARGIN = timedelta(hours=3)

HORIZON = timedelta(days=366 * 50)
"""How far a cron walk looks for its next (or previous) slot.

A cron expression has no year field, so its slots come back within the
28-year cycle of weekdays and leap days (40 around a century year that is
not a leap year). A walk that finds none within 50 years never will: it
ends there instead of walking to year 9999 on the event loop, and a
definition whose timing has no slot in that horizon is refused."""

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}


MAX_DURATION = timedelta(days=366 * 100)
"""The longest duration a schedule takes (an interval, a window, a jitter): a century."""


def parse_duration(text: str | timedelta, what: str = "duration") -> timedelta:
    """``"90s"``, ``"5m"``, ``"1h30m"``, ``"2d"`` (or a timedelta) as a timedelta; never negative.

    InvalidRequest names ``what`` and the text when it is not such a duration.
    """
    if isinstance(text, timedelta):
        if text < timedelta(0):
            raise InvalidRequest(
                f"{what} {text} is negative; a schedule's durations are zero or more; no schedule was made",
                details={"field": what, "value": str(text)},
            )
        return text
    spoken = text.strip().lower() if isinstance(text, str) else ""
    parts = _DURATION.findall(spoken)
    if not parts or "".join(n + u for n, u in parts) != spoken:
        raise InvalidRequest(
            f"{what} {text!r} is not a duration: write a number and a unit (ms, s, m, h, d, w), "
            'one or more of them, such as "90s", "5m" or "1h30m"; no schedule was made',
            details={"field": what, "value": repr(text)},
        )
    # Summed in microseconds first: a number too large for a timedelta is refused, not an
    # OverflowError.
    micros = sum(int(n) * (_UNITS[u] // timedelta(microseconds=1)) for n, u in parts)
    if micros > MAX_DURATION // timedelta(microseconds=1):
        raise InvalidRequest(
            f"{what} {text!r} is longer than a schedule takes ({MAX_DURATION.days} days at "
            "most); no schedule was made",
            details={"field": what, "value": repr(text)[:200]},
        )
    return timedelta(microseconds=micros)


def _utc(instant: datetime, what: str) -> datetime:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise InvalidRequest(
            f"{what} {instant.isoformat()} has no time zone; a schedule's instants are aware "
            "(UTC, or any zone); no schedule was made",
            details={"field": what, "value": instant.isoformat()},
        )
    return instant.astimezone(UTC)


class Timing(Protocol):
    """What makes a schedule's slots (:class:`Every`, :class:`Cron`)."""

    def forward(self, after: datetime) -> Iterator[datetime]:
        """The slots strictly after ``after`` (UTC), earliest first, without end."""
        ...

    def backward(self, through: datetime) -> Iterator[datetime]:
        """The slots at or before ``through`` (UTC), newest first."""
        ...

    def count(self, after: datetime, through: datetime, most: int) -> int:
        """How many slots lie in ``(after, through]``, counting no further than ``most``."""
        ...

    def spec(self) -> dict[str, Any]:
        """The timing as JSON (what a definition event records)."""
        ...


@dataclass(frozen=True, init=False)
class Every:
    """Slots every ``interval``, at ``anchor + k * interval`` (UTC; see the module)."""

    interval: timedelta
    anchor: datetime

    def __init__(self, interval: str | timedelta, anchor: datetime | None = None) -> None:
        step = parse_duration(interval, "interval")
        if step < timedelta(seconds=1):
            raise InvalidRequest(
                f"interval {interval!r} is shorter than one second; a schedule fires at most "
                "once a second; no schedule was made",
                details={"field": "interval", "value": str(interval)},
            )
        object.__setattr__(self, "interval", step)
        object.__setattr__(self, "anchor", EPOCH if anchor is None else _utc(anchor, "anchor"))

    def _index(self, instant: datetime) -> int:
        """The index k of the newest slot at or before ``instant``."""
        return (instant - self.anchor) // self.interval

    def forward(self, after: datetime) -> Iterator[datetime]:
        k = self._index(_utc(after, "after")) + 1
        while True:
            yield self.anchor + k * self.interval
            k += 1

    def backward(self, through: datetime) -> Iterator[datetime]:
        k = self._index(_utc(through, "through"))
        while True:
            yield self.anchor + k * self.interval
            k -= 1

    def count(self, after: datetime, through: datetime, most: int) -> int:
        counted = self._index(_utc(through, "through")) - self._index(_utc(after, "after"))
        return max(0, min(counted, most))

    def spec(self) -> dict[str, Any]:
        return {
            "every_seconds": self.interval.total_seconds(),
            "anchor": self.anchor.isoformat(),
        }


@dataclass(frozen=True, init=False)
class Cron:
    """Slots where ``expr`` matches the wall clock of ``tz`` (see the module for DST)."""

    expr: str
    tz: str
    gap: Literal["shift", "skip"]
    fold: Literal["first", "last"]
    _zone: ZoneInfo = field(repr=False, compare=False)
    _fields: str = field(repr=False, compare=False)

    def __init__(
        self,
        expr: str,
        tz: str = "UTC",
        *,
        gap: Literal["shift", "skip"] = "shift",
        fold: Literal["first", "last"] = "first",
    ) -> None:
        CronSim, CronSimError = _cronsim()
        if gap not in ("shift", "skip"):
            raise InvalidRequest(
                f'gap {gap!r} is neither "shift" nor "skip"; no schedule was made',
                details={"field": "gap"},
            )
        if fold not in ("first", "last"):
            raise InvalidRequest(
                f'fold {fold!r} is neither "first" nor "last"; no schedule was made',
                details={"field": "fold"},
            )
        try:
            if not isinstance(tz, str) or not 0 < len(tz) <= 100:
                raise ValueError(tz)
            zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise InvalidRequest(
                f"time zone {str(tz)[:100]!r} is not in the zone database (an IANA name such "
                'as "Europe/Berlin" or "UTC"); no schedule was made',
                details={"field": "tz", "value": repr(tz)[:200]},
            ) from exc
        spoken = expr.strip() if isinstance(expr, str) else ""
        fields = ALIASES.get(spoken.lower(), spoken)
        try:
            CronSim(fields, datetime(2000, 1, 1))
        except CronSimError as exc:
            raise InvalidRequest(
                f"cron expression {expr!r} is refused ({exc}): write five fields (minute hour "
                "day-of-month month day-of-week), six with seconds first, or an alias such as "
                "@daily; no schedule was made",
                details={"field": "cron", "value": repr(expr)},
            ) from exc
        object.__setattr__(self, "expr", spoken)
        object.__setattr__(self, "tz", tz)
        object.__setattr__(self, "gap", gap)
        object.__setattr__(self, "fold", fold)
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(self, "_fields", fields)
        if next(self.forward(datetime(2000, 1, 1, tzinfo=UTC)), None) is None:
            raise InvalidRequest(
                f"cron expression {expr!r} in {tz} has no slot: every time it names falls "
                f'where the wall clock of {tz} skips (a daylight saving gap, with gap="skip"), '
                'or never comes; no schedule was made; choose another time or gap="shift"',
                details={"field": "cron", "value": repr(expr), "tz": tz, "gap": gap},
            )

    def _instant(self, wall: datetime) -> datetime | None:
        """The UTC instant of a naive wall time of the zone, by the rules (None: skipped)."""
        zone = self._zone
        first = wall.replace(tzinfo=zone, fold=0)
        last = wall.replace(tzinfo=zone, fold=1)
        if first.utcoffset() == last.utcoffset():
            return first.astimezone(UTC)  # an ordinary wall time
        early, late = first.astimezone(UTC), last.astimezone(UTC)
        if early.astimezone(zone).replace(tzinfo=None) == wall:
            # The wall time occurs twice (fold 0 is the earlier instant): one slot.
            return early if self.fold == "first" else late
        # The wall time falls in a gap: the first instant after it, or no slot.
        if self.gap == "skip":
            return None
        return _gap_end(wall, zone)

    def forward(self, after: datetime) -> Iterator[datetime]:
        CronSim, _ = _cronsim()
        start = _utc(after, "after")
        wall = start.astimezone(self._zone).replace(tzinfo=None) - _MARGIN
        last: datetime | None = None
        ends = _shifted(wall, HORIZON)
        for candidate in _bounded(CronSim(self._fields, wall)):
            if candidate > ends:
                return  # none within the horizon: none at all (see HORIZON)
            instant = self._instant(candidate)
            if instant is None or instant <= start or instant == last:
                continue
            last = instant
            ends = _shifted(candidate, HORIZON)
            yield instant

    def backward(self, through: datetime) -> Iterator[datetime]:
        CronSim, _ = _cronsim()
        end = _utc(through, "through")
        wall = end.astimezone(self._zone).replace(tzinfo=None) + _MARGIN
        last: datetime | None = None
        ends = _shifted(wall, -HORIZON)
        for candidate in _bounded(CronSim(self._fields, wall, reverse=True)):
            if candidate < ends:
                return
            instant = self._instant(candidate)
            if instant is None or instant > end or instant == last:
                continue
            last = instant
            ends = _shifted(candidate, -HORIZON)
            yield instant

    def count(self, after: datetime, through: datetime, most: int) -> int:
        end = _utc(through, "through")
        counted = 0
        for instant in self.forward(after):
            if instant > end or counted >= most:
                break
            counted += 1
        return counted

    def spec(self) -> dict[str, Any]:
        return {"cron": self.expr, "tz": self.tz, "gap": self.gap, "fold": self.fold}


def _shifted(wall: datetime, by: timedelta) -> datetime:
    """``wall + by``, held at the calendar's ends (year 1 or 9999)."""
    try:
        return wall + by
    except OverflowError:
        return datetime.max if by > timedelta(0) else datetime.min


def _bounded(walk: Iterator[datetime]) -> Iterator[datetime]:
    """cronsim's candidates, ending quietly where its calendar does (year 1 or 9999)."""
    while True:
        try:
            yield next(walk)
        except (StopIteration, OverflowError, ValueError):
            return


def _cronsim() -> tuple[type[CronSimType], type[Exception]]:
    """cronsim's walker and its error, or a refusal that names the extra to install."""
    try:
        from cronsim import CronSim, CronSimError
    except ModuleNotFoundError as exc:
        raise InvalidConfig(
            "a Cron timing needs the cronsim package, which is not installed: install the "
            "schedules extra (pip install 'streamkit-events[schedules]'); no schedule was made",
            details={"missing": "cronsim", "extra": "schedules"},
        ) from exc
    return CronSim, CronSimError


def _gap_end(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the gap that swallowed the wall time ``wall``."""
    # Before the gap the zone's offset is fold 0's; the gap ends where the wall
    # time, read with the offset after it, is the instant the offset changed.
    before = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    after = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    low, high = min(before, after), max(before, after)
    # The transition lies in [low, high]: find it to the second.
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == low.astimezone(zone).utcoffset():
            low = middle
        else:
            high = middle
    return high.replace(microsecond=0)


WINDOWS = {"skip": timedelta(minutes=1), "latest": timedelta(days=1), "all": timedelta(days=1)}
"""Each policy's window when none is given."""


@dataclass(frozen=True, init=False)
class Catchup:
    """Which of the slots that came due since the last evaluation fire (see :func:`due`).

    ``policy``:

    - ``"skip"``: a slot fires only while it is less than ``window`` old (a
      grace period: one minute unless given); older ones are missed.
    - ``"latest"``: one run, for the newest slot, if it is less than
      ``window`` old (a day unless given); the others are missed, coalesced
      into it.
    - ``"all"``: each slot less than ``window`` old (a day unless given) fires.

    At most ``max_runs`` fire in one evaluation, the newest; every other slot
    is missed, with its reason.
    """

    policy: Literal["skip", "latest", "all"]
    window: timedelta
    max_runs: int

    def __init__(
        self,
        policy: Literal["skip", "latest", "all"] = "skip",
        *,
        window: str | timedelta | None = None,
        max_runs: int = 100,
    ) -> None:
        if not isinstance(policy, str) or policy not in WINDOWS:
            raise InvalidRequest(
                f'catch-up policy {policy!r} is none of "skip", "latest", "all"; no schedule '
                "was made",
                details={"field": "catchup", "value": repr(policy)},
            )
        if not isinstance(max_runs, int) or isinstance(max_runs, bool) or max_runs < 1:
            raise InvalidRequest(
                f"max_runs {max_runs!r} is not a whole number of at least 1; no schedule was made",
                details={"field": "max_runs", "value": repr(max_runs)},
            )
        object.__setattr__(self, "policy", policy)
        object.__setattr__(
            self,
            "window",
            WINDOWS[policy] if window is None else parse_duration(window, "window"),
        )
        object.__setattr__(self, "max_runs", max_runs)


MissedReason = Literal[
    "window",
    "coalesced",
    "max_runs",
    "paused",
    "overlap",
    "buffer_full",
    "deleted",
    "undeclared",
    "refused",
]
"""Why slots did not fire: :func:`due` gives the first three; the processor the others."""


@dataclass(frozen=True)
class Missed:
    """A run of consecutive slots not fired, and why: ``first`` to ``last``, ``count`` of them.

    ``exact`` is False when there were more than :data:`MAX_COUNTED` (``count``
    is then that bound).
    """

    reason: MissedReason
    first: datetime
    last: datetime
    count: int
    exact: bool = True


@dataclass(frozen=True)
class Due:
    """One evaluation: the slots to fire now (oldest first) and the runs of slots missed."""

    fire: tuple[datetime, ...]
    missed: tuple[Missed, ...]


def _missed(
    timing: Timing, reason: MissedReason, after: datetime, through: datetime
) -> Missed | None:
    """The slots in ``(after, through]`` as one record, or None when there are none."""
    first = next(timing.forward(after), None)
    if first is None or first > through:
        return None
    last = next(timing.backward(through))
    count = timing.count(after, through, MAX_COUNTED + 1)
    return Missed(reason, first, last, min(count, MAX_COUNTED), count <= MAX_COUNTED)


def due(timing: Timing, catchup: Catchup, after: datetime, now: datetime) -> Due:
    """Which slots in ``(after, now]`` fire now and which are missed (see the module).

    Computed from ``now`` alone: the work is bounded by ``max_runs`` and by
    :data:`MAX_COUNTED`, however long ago ``after`` was.
    """
    start, end = _utc(after, "after"), _utc(now, "now")
    if end <= start:
        return Due((), ())
    horizon = max(start, end - catchup.window)
    wanted = 1 if catchup.policy == "latest" else catchup.max_runs
    # The newest slots within the window, newest first, as many as may fire.
    newest: list[datetime] = []
    for instant in timing.backward(end):
        if instant <= horizon or len(newest) == wanted:
            break
        newest.append(instant)
    fire = tuple(reversed(newest))
    missed: list[Missed] = []
    old = _missed(timing, "window", start, horizon)
    if old is not None:
        missed.append(old)
    if fire:
        # Within the window but older than what fires: coalesced (latest) or over max_runs.
        reason: MissedReason = "coalesced" if catchup.policy == "latest" else "max_runs"
        crowded = _missed(timing, reason, horizon, fire[0] - timedelta(microseconds=1))
        if crowded is not None:
            missed.append(crowded)
    return Due(fire, tuple(missed))


def jitter(name: str, slot: datetime, most: timedelta) -> timedelta:
    """A delay in ``[0, most)`` fixed by the schedule's name and the slot: any host computes it."""
    if most <= timedelta(0):
        return timedelta(0)
    key = f"{name}/{_utc(slot, 'slot').isoformat()}".encode()
    fraction = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest()) / 2**64
    return timedelta(microseconds=int(most / timedelta(microseconds=1) * fraction))

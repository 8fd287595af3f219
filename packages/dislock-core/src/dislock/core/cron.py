"""Cron expressions and schedule slots, read in the time zone cron fires in.

A schedule lock's row expires at the next cron boundary, computed from the
database's clock, so machines with skewed clocks agree on their slot; the
expression is read on the wall clock of the zone cron uses (``CRON_TZ``, else local).
Daylight saving time follows vixie/ISC cron and cronie (docs/time-zones.md): every
instant any cron starts the job at is a boundary, so each start gets a slot of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from itertools import pairwise
from typing import TYPE_CHECKING, ClassVar

from dislock.core.errors import ConfigurationError

if TYPE_CHECKING:
    from croniter import croniter

EARLY_FIRE_TOLERANCE = 1.0
"""A start this close before a boundary (at most a quarter of a slot) belongs to the
slot that boundary opens: cron on a host whose clock runs a little ahead of the
database's fires just before the boundary, by the database's clock."""


MAX_CLOCK_SHIFT = timedelta(hours=3)
"""cron treats a local clock change smaller than this as daylight saving time (and
every zone's DST shift is at most 2 h), so a repeated hour lasts less than this."""


UTC = timezone.utc


def check_cron(expression: object, *, name: str = "schedule") -> str:
    """A cron expression croniter accepts (5 fields, or 6 with seconds) that fires."""
    from croniter import CroniterBadDateError  # only schedule users pay for it

    text = _valid(expression, name)
    try:
        # 30 February, or a year field in the past: croniter gives up searching.
        _fires(text, datetime.now(UTC)).get_next(datetime)
    except (CroniterBadDateError, ValueError, OverflowError):
        raise ConfigurationError(f"{name} never fires: {expression!r}") from None
    return text


def _fires(text: str, start: datetime) -> croniter:
    """The fires of ``text`` from ``start``, with cron's day rule: a day whose
    day-of-month or day-of-week field starts with ``*`` must match both fields, only
    two restricted fields match either (``cron(8)`` of vixie/ISC cron and cronie:
    ``0 0 */2 * MON`` fires on odd-dated Mondays); croniter's default is either
    whenever both fields are restricted.  Every slot dislock computes comes from here."""
    from croniter import croniter

    return croniter(text, start, implement_cron_bug=True)


def _valid(expression: object, name: str) -> str:
    from croniter import croniter

    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"{name} must be a cron expression, got {expression!r}")
    text = " ".join(expression.split())  # one line, whatever separated the fields
    if not croniter.is_valid(text):
        why = invalid_because(text)
        raise ConfigurationError(
            f"{name} is not a valid cron expression: {expression!r}" + (f" ({why})" if why else "")
        )
    _refuse_seconds_first(text, name)
    return text


FIELDS = (
    ("minute", 0, 59, ""),
    ("hour", 0, 23, ""),
    ("day-of-month", 1, 31, ""),
    ("month", 1, 12, " or jan-dec"),
    ("day-of-week", 0, 7, " or sun-sat"),
    ("second", 0, 59, ""),
    ("year", 1970, 2099, ""),
)
"""croniter's fields in its order (seconds sixth, a year seventh), with their ranges."""

SHORTCUTS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def invalid_because(text: str) -> str | None:
    """Why croniter refuses ``text`` (one line), naming the field and its range: the
    count of fields, or the first field refused on its own; None if no one field is."""
    from croniter import croniter

    fields = text.split()
    if text.startswith("@"):
        return f"the @ forms are {', '.join(SHORTCUTS)}"
    if not 5 <= len(fields) <= len(FIELDS):
        count = f"{len(fields)} field{'' if len(fields) == 1 else 's'}"
        return (
            f"it has {count}; a schedule has 5: minute hour day-of-month month day-of-week,"
            " then optionally seconds, then optionally a year"
        )
    for index, field in enumerate(fields):
        alone = ["*"] * len(fields)
        alone[index] = field
        if croniter.is_valid(" ".join(alone)):
            continue
        label, low, high, names = FIELDS[index]
        if any(not low <= number <= high for number in _numbers(field)):
            return f"{label} field {field!r} is out of range {low}-{high}"
        return (
            f"{label} field {field!r} is not valid: values are {low}-{high}{names},"
            " with *, ranges a-b, lists a,b and steps */n"
        )
    return None


def _numbers(field: str) -> list[int]:
    """The values a field names (not its steps ``/n``, nor a weekday's ``#n``)."""
    values = [item.split("/")[0].split("#")[0] for item in field.split(",")]
    return [int(number) for value in values for number in re.findall(r"[0-9]+", value)]


EVERY_SECOND = frozenset({"*", "?"})
"""Seconds fields meaning every second of a matching minute."""


def _refuse_seconds_first(text: str, name: str) -> None:
    """Refuse a six- or seven-field expression whose seconds field (croniter's sixth)
    is ``*`` or ``?`` while another field is not: read with seconds last, it starts
    every second of each matching minute, never a job's schedule; it was written
    with seconds first (Quartz, Spring).  ``* * * * * *`` stays accepted."""
    from croniter import croniter

    fields = text.split()
    if len(fields) < 6 or fields[5] not in EVERY_SECOND:
        return
    if all(field in EVERY_SECOND for field in fields[:5]):
        return
    rotated = " ".join(
        "*" if field == "?" else field for field in [*fields[1:6], fields[0], *fields[6:]]
    )
    hint = (
        f"; if the seconds come first, write {rotated!r}"
        if croniter.is_valid(rotated)
        else "; put the seconds last"
    )
    raise ConfigurationError(
        f"{name} {text!r} would start every second of each matching minute: dislock reads "
        "six fields as minute hour day month weekday second (seconds last, as croniter; "
        f"Quartz and Spring put them first){hint}"
    )


def next_fires(expression: str, now: datetime, tz: tzinfo = UTC, count: int = 3) -> list[datetime]:
    """The next ``count`` boundaries of ``expression`` after ``now``, read in ``tz``."""
    fires: list[datetime] = []
    instant = now
    for _ in range(count):
        instant = next_boundary(expression, instant, tz)
        fires.append(instant)
    return fires


def _wall(instant: datetime, tz: tzinfo) -> datetime:
    """The wall-clock reading of ``instant`` in ``tz``, labelled UTC for croniter's
    plain arithmetic (it then knows nothing of daylight saving time)."""
    return instant.astimezone(tz).replace(tzinfo=UTC, fold=0)


def _instants(wall: datetime, tz: tzinfo) -> list[datetime]:
    """The instants (UTC) at which the clock of ``tz`` shows ``wall``: one, two in a
    repeated hour, or, for a time skipped by a spring-forward, the transition."""
    naive = wall.replace(tzinfo=None)
    found = []
    for fold in (0, 1):
        instant = naive.replace(tzinfo=tz, fold=fold).astimezone(UTC)
        if instant.astimezone(tz).replace(tzinfo=None) == naive and instant not in found:
            found.append(instant)
    if found:
        return sorted(found)
    # Skipped: fold=1 reads it with the offset after the transition, fold=0 before.
    after = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)
    before = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)
    low, high = min(after, before), max(after, before)
    offset = high.astimezone(tz).utcoffset()
    while high - low > timedelta(seconds=1):  # the transition lies in (low, high]
        middle = low + (high - low) / 2
        if middle.astimezone(tz).utcoffset() == offset:
            high = middle
        else:
            low = middle
    return [high.replace(microsecond=0)]


def next_boundary(expression: str, now: datetime, tz: tzinfo = UTC) -> datetime:
    """The first cron boundary strictly after ``now`` (an aware datetime), in UTC,
    reading ``expression`` on the wall clock of ``tz``."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    start = now.astimezone(UTC)
    shifts = (-MAX_CLOCK_SHIFT, timedelta(0), MAX_CLOCK_SHIFT)
    # Far from any transition, the first matching wall reading is the next boundary.
    # Near one, the next boundary may read earlier on the wall clock than now does
    # (the second pass of a repeated hour): search from one shift back, and on until
    # no later wall reading can come sooner.
    quiet = len({(start + shift).astimezone(tz).utcoffset() for shift in shifts}) == 1
    wall = _wall(start, tz) - (timedelta(0) if quiet else MAX_CLOCK_SHIFT)
    candidates = _fires(_valid(expression, "schedule"), wall)
    best: datetime | None = None
    while True:
        candidate = candidates.get_next(datetime)
        if not isinstance(candidate, datetime):  # croniter's return type is loose
            raise TypeError(f"croniter returned {candidate!r}")
        if best is not None and candidate - MAX_CLOCK_SHIFT > _wall(best, tz):
            return best
        for instant in _instants(candidate, tz):
            if instant > start and (best is None or instant < best):
                best = instant
        if quiet and best is not None:
            return best


def slot_start(expression: str, end: datetime, tz: tzinfo = UTC) -> datetime:
    """When the slot that ends at ``end`` began: the last cron boundary before it."""
    fires = _fires(_valid(expression, "schedule"), _wall(end, tz) + MAX_CLOCK_SHIFT)
    while True:
        candidate = fires.get_prev(datetime)
        if not isinstance(candidate, datetime):  # croniter's return type is loose
            raise TypeError(f"croniter returned {candidate!r}")
        earlier = [instant for instant in _instants(candidate, tz) if instant < end]
        if earlier:
            return max(earlier)


def begun_too_long_ago(
    expression: str, end: datetime, tz: tzinfo, deadline: float, now: datetime
) -> datetime | None:
    """When the slot ending at ``end`` began, if that was more than ``deadline``
    seconds before ``now`` (its start deadline passed); None while it may start."""
    began = slot_start(expression, end, tz)
    return began if (now - began).total_seconds() > deadline else None


def slot_end(expression: str, now: datetime, tz: tzinfo = UTC) -> datetime:
    """When the slot a start at ``now`` (database clock) belongs to ends, reading
    ``expression`` in ``tz``."""
    first = next_boundary(expression, now, tz)
    second = next_boundary(expression, first, tz)
    tolerance = min(EARLY_FIRE_TOLERANCE, (second - first).total_seconds() / 4)
    return second if (first - now).total_seconds() < tolerance else first


JITTER_SAMPLE = 32
"""Consecutive fires looked at to find a schedule's shortest interval."""


def shortest_interval(expression: str, now: datetime | None = None) -> float:
    """The shortest time between ``expression``'s next few fires, in seconds (on the
    wall clock: DST only shortens one interval)."""
    start = (now or datetime.now(UTC)).astimezone(UTC)
    fires = _fires(_valid(expression, "schedule"), start)
    times = [fires.get_next(float) for _ in range(JITTER_SAMPLE + 1)]
    return min(later - earlier for earlier, later in pairwise(times))


def check_jitter(
    expression: str, jitter_seconds: float, jitter_name: str, schedule_name: str
) -> None:
    """A start-up delay must leave the start in the slot cron fired it for: at most
    half the schedule's shortest interval."""
    if jitter_seconds <= 0:
        return
    interval = shortest_interval(expression)
    if jitter_seconds > interval / 2:
        raise ConfigurationError(
            f"{jitter_name} ({jitter_seconds:g} s) must be at most half the shortest "
            f"interval between the fires of {schedule_name} ({interval:g} s), so at most "
            f"{interval / 2:g} s"
        )


@dataclass(frozen=True, slots=True)
class SlotCandidates:
    """The slot ends a start could belong to, for a database clock near the local one.

    Rather than read the database clock first (a round trip more on every cron
    run), the next few boundaries travel with the acquiring statement, each with
    the latest start that still belongs to it, and the statement picks the first
    end whose latest start its ``NOW()`` has not passed: ``slot_end(NOW())``
    within the covered span; outside, nothing, and the caller reads the clock.
    """

    covered_from: datetime
    ends: list[datetime]
    latest_starts: list[datetime]

    COUNT: ClassVar[int] = 4
    """Ends sent along: a fixed number, so that the statement's text is fixed."""
    BEHIND: ClassVar[float] = 2.0
    """Seconds the database clock may lag the local one and still be covered (it is
    read later than ours, by the statement, so it lags only by clock skew)."""

    @classmethod
    def around(cls, expression: str, local_now: datetime, tz: tzinfo = UTC) -> SlotCandidates:
        """The candidates for a start near ``local_now``, reading ``expression`` in ``tz``."""
        start = local_now.astimezone(UTC) - timedelta(seconds=cls.BEHIND)
        found = [next_boundary(expression, start, tz)]
        while len(found) <= cls.COUNT:  # one more: the last end's tolerance needs it
            found.append(next_boundary(expression, found[-1], tz))
        ends = found[:-1]
        latest = [
            end - timedelta(seconds=min(EARLY_FIRE_TOLERANCE, (after - end).total_seconds() / 4))
            for end, after in zip(ends, found[1:], strict=True)
        ]
        return cls(start, ends, latest)

    def pick(self, now: datetime) -> datetime | None:
        """What the statement picks for a database clock at ``now`` (None: not covered)."""
        if now < self.covered_from:
            return None
        chances = zip(self.ends, self.latest_starts, strict=True)
        return next((end for end, latest in chances if now <= latest), None)

"""Cron expressions and schedule slots, read in the time zone cron fires in.

A schedule lock's row expires at the next cron boundary, computed from the
database's clock rather than the local one, so machines with skewed clocks agree
on which slot they are in.  The cron expression itself is read on the wall clock
of a time zone (``CRON_TZ``, else the host's local zone: the zone cron uses), and
the boundaries are the instants at which cron starts the job there.

Daylight saving time follows cron (vixie/ISC cron and cronie, ``cron(8)``): a
time skipped when clocks spring forward is started at the transition instead,
and a repeated hour gives boundaries on both passes.  cron starts a fixed-time
job only on the first pass and a ``*``-hour/minute job on both; cronie with
``CRON_TZ`` in a zone other than the host's matches both passes and skips the
gap.  Every instant any of them starts the job at is a boundary, so each start
gets a slot of its own; a boundary at which a given cron starts nothing only
makes one slot end early.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone, tzinfo
from typing import NamedTuple

from dislock.core.errors import ConfigurationError

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
    from croniter import CroniterBadDateError, croniter  # only schedule users pay for it

    text = _valid(expression, name)
    try:
        # 30 February, or a year field in the past: croniter gives up searching.
        croniter(text, datetime.now(UTC)).get_next(datetime)
    except (CroniterBadDateError, ValueError, OverflowError):
        raise ConfigurationError(f"{name} never fires: {expression!r}") from None
    return text


def _valid(expression: object, name: str) -> str:
    from croniter import croniter

    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"{name} must be a cron expression, got {expression!r}")
    text = " ".join(expression.split())  # one line, whatever separated the fields
    if not croniter.is_valid(text):
        raise ConfigurationError(f"{name} is not a valid cron expression: {expression!r}")
    _refuse_seconds_first(text, name)
    return text


EVERY_SECOND = frozenset({"*", "?"})
"""Seconds fields meaning every second of a matching minute."""


def _refuse_seconds_first(text: str, name: str) -> None:
    """Refuse a six- or seven-field expression whose seconds field (croniter's sixth,
    the last but an optional year) is ``*`` or ``?`` while another field is not.

    Read with seconds last, it starts every second of each matching minute: never
    a job's schedule.  Read with seconds first (Quartz, Spring), it is
    an ordinary one, whose day-of-week field is ``*`` or ``?``: ``*/10 * * * * *``
    is "every 10 seconds" there, "every second of every tenth minute" here.
    ``* * * * * *`` is every second either way, and stays accepted.
    """
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


# ---------------------------------------------------------------------------
# The zone


class CronZone(NamedTuple):
    """A time zone to read cron expressions in, with the name to show and record."""

    tz: tzinfo
    name: str
    """An IANA name (``America/New_York``) when known, else a description."""
    source: str
    """Where it came from: ``CRON_TZ``, ``TZ``, ``/etc/localtime``, ``argument``..."""


ZONEINFO_DIRS = ("/usr/share/zoneinfo/", "/usr/lib/zoneinfo/", "/usr/share/lib/zoneinfo/")
LOCALTIME = "/etc/localtime"


def zone_name(tz: tzinfo) -> str:
    """The name to show for a ``tzinfo``: its IANA key, else its ``tzname``."""
    key = getattr(tz, "key", None)
    if isinstance(key, str) and key:
        return key
    if tz is UTC:
        return "UTC"
    return str(tz.tzname(None) or tz)


def load_zone(value: object, *, name: str = "cron_tz", source: str = "argument") -> CronZone:
    """An IANA zone name (``Europe/Berlin``; ``:Europe/Berlin`` and a path under the
    zoneinfo directory too, as ``TZ`` allows) or a ``tzinfo``."""
    if isinstance(value, tzinfo):
        return CronZone(value, zone_name(value), source)
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"{name} must be an IANA time zone name like 'Europe/Berlin', got {value!r}"
        )
    key = value.strip().removeprefix(":")
    for directory in ZONEINFO_DIRS:
        if key.startswith(directory):
            key = key[len(directory) :]
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        if key.startswith("/"):  # a zone file by its path, as TZ allows (TZ=/etc/localtime)
            with open(key, "rb") as file:
                return CronZone(ZoneInfo.from_file(file, key=key), key, source)
        tz: tzinfo = ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        fixed = _posix_fixed_offset(key)
        if fixed is not None:
            return CronZone(fixed, key, source)
        # POSIX rules with daylight saving time (EST5EDT,M3.2.0,M11.1.0) are not
        # read: the IANA name says the same and is what the zone database keeps.
        raise ConfigurationError(
            f"{name}={value!r} is not a known IANA time zone (e.g. Europe/Berlin, "
            "America/New_York, UTC)"
        ) from None
    return CronZone(tz, key, source)


_IANA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]{0,29}(?:/[A-Za-z][A-Za-z0-9_+-]{0,29}){0,2}")
"""What a zone name of the tz database looks like (``Europe/Berlin``, ``Etc/GMT-5``,
``America/Argentina/Buenos_Aires``): no leading ``/``, no ``.`` or ``..``, nothing a
path could hide behind."""


def recorded_zone(value: str) -> tzinfo:
    """A zone read from the run history (``cron_tz``), accepted only as an IANA name.

    Any machine that may write the history chooses this text, so it is not read the
    way ``load_zone`` reads the local ``CRON_TZ``: no path (a FIFO named there would
    block the reader), no ``:`` form, no POSIX rule; only a name that ``zoneinfo``
    looks up inside the tz database (it refuses keys that leave it).
    """
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    # Debian's database links "localtime" to /etc/localtime: the host's own zone,
    # outside the database, and not what the machine that recorded it meant.
    if len(value) <= 64 and _IANA_NAME.fullmatch(value) and value != "localtime":
        try:
            return ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass  # a directory of the database, or no such zone
    shown = value if len(value) <= 64 else value[:64] + "..."
    raise ConfigurationError(f"the recorded cron_tz {shown!r} is not an IANA time zone name")


_POSIX_FIXED = re.compile(
    r"(?:[A-Za-z]{3,}|<[A-Za-z0-9+-]{1,}>)([+-]?)(\d{1,2})(?::(\d{2}))?(?::(\d{2}))?"
)


def _posix_fixed_offset(text: str) -> tzinfo | None:
    """A POSIX ``TZ`` without daylight saving time (``UTC0``, ``JST-9``, ``<+0530>-5:30``)
    as a fixed offset; the offset counts hours west of Greenwich."""
    match = _POSIX_FIXED.fullmatch(text)
    if match is None:
        return None
    sign, hours, minutes, seconds = match.groups()
    west = timedelta(hours=int(hours), minutes=int(minutes or 0), seconds=int(seconds or 0))
    if west > timedelta(hours=24):
        return None
    return timezone(west if sign == "-" else -west, text)


def system_zone(localtime: str = LOCALTIME) -> CronZone:
    """The host's zone as the C library reads it without ``TZ``: ``/etc/localtime``
    (its link target names it), or UTC when there is none."""
    from zoneinfo import ZoneInfo

    try:
        target = os.path.realpath(localtime)
        for directory in ZONEINFO_DIRS:
            if target.startswith(directory):
                return load_zone(target[len(directory) :], name=localtime, source=localtime)
        with open(localtime, "rb") as file:  # a copy, not a link: it has no name
            return CronZone(ZoneInfo.from_file(file, key=localtime), localtime, localtime)
    except (OSError, ValueError, ConfigurationError):
        return CronZone(UTC, "UTC", f"no usable {localtime}")


def local_zone(environ: Mapping[str, str] | None = None) -> CronZone:
    """The host's local zone: ``TZ`` if set, else the system zone."""
    env = os.environ if environ is None else environ
    tz_value = env.get("TZ", "").strip()
    if tz_value:
        return load_zone(tz_value, name="TZ", source="TZ")
    return system_zone()


def cron_zone(environ: Mapping[str, str] | None = None) -> CronZone:
    """The zone cron reads a crontab in: ``CRON_TZ`` (cronie's variable) if set, else
    the host's local zone."""
    env = os.environ if environ is None else environ
    value = env.get("CRON_TZ", "").strip()
    if value:
        return load_zone(value, name="CRON_TZ", source="CRON_TZ")
    return local_zone(env)


# ---------------------------------------------------------------------------
# Boundaries


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
    from croniter import croniter

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
    candidates = croniter(_valid(expression, "schedule"), wall)
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
    """The shortest time between consecutive fires of ``expression``, in seconds,
    over its next few fires (on the wall clock; DST only shortens one interval)."""
    from croniter import croniter

    start = (now or datetime.now(UTC)).astimezone(UTC)
    fires = croniter(_valid(expression, "schedule"), start)
    previous = fires.get_next(float)
    shortest = math.inf
    for _ in range(JITTER_SAMPLE):
        current = fires.get_next(float)
        shortest = min(shortest, current - previous)
        previous = current
    return shortest


def check_jitter(
    expression: str, jitter_seconds: float, *, jitter_name: str, schedule_name: str
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


class SlotCandidates:
    """The slot ends a start could belong to, for a database clock near the local one.

    A schedule lock would otherwise read the database clock first and compute its
    slot from that: a round trip more on every cron run.  Instead the next few
    boundaries after ``covered_from`` (a little before the local clock) travel with
    the acquiring statement, each with the latest start that still belongs to it
    (``slot_end``'s early-fire tolerance before it), and the statement picks the
    first end whose latest start its ``NOW()`` has not passed.  That is
    ``slot_end(NOW())`` whenever ``NOW()`` falls between ``covered_from`` and the
    last latest start; outside, nothing is picked and the caller reads the clock.
    """

    __slots__ = ("covered_from", "ends", "latest_starts")

    COUNT = 4
    """Ends sent along: a fixed number, so that the statement's text is fixed."""
    BEHIND = 2.0
    """Seconds the database clock may lag the local one and still be covered (it is
    read later than ours, by the statement, so it lags only by clock skew)."""

    def __init__(
        self, covered_from: datetime, ends: list[datetime], latest_starts: list[datetime]
    ) -> None:
        self.covered_from = covered_from
        self.ends = ends
        self.latest_starts = latest_starts

    @classmethod
    def around(cls, expression: str, local_now: datetime, tz: tzinfo = UTC) -> SlotCandidates:
        """The candidates for a start near ``local_now``, reading ``expression`` in ``tz``
        (the boundaries are ``next_boundary``'s, one after the other)."""
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

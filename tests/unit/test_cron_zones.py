"""Schedule slots read in a time zone, across daylight saving time transitions.

The fires are those of a model of cron, checked minute by minute at fixed instants:
vixie/ISC cron and cronie reading the crontab in the host's zone (``cron(8)``:
a local time change under 3 h runs the fixed-time jobs of a skipped interval at
once and does not run them again in a repeated one; ``*``-hour/minute jobs are
scheduled normally), and cronie with ``CRON_TZ`` on a UTC host (every real minute
matched against the zone's wall clock).  Every fire must get a slot of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from dislock import ConfigurationError
from dislock.core.cron import check_cron, next_boundary, slot_end
from dislock.core.cron_zone import cron_zone, load_zone, local_zone, system_zone

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")

# (zone, spring-forward day, fall-back day)
TRANSITIONS = [
    (NEW_YORK, date(2026, 3, 8), date(2026, 11, 1)),
    (BERLIN, date(2026, 3, 29), date(2026, 10, 25)),
]


def _matches(expression: str, wall: datetime) -> bool:
    return bool(croniter.match(expression, wall.replace(tzinfo=None)))


def _wildcard(expression: str) -> bool:
    minute, hour = expression.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def host_cron_fires(expression: str, tz: ZoneInfo, day: date) -> Iterator[datetime]:
    """When cron reading the crontab in its own zone ``tz`` starts the job, over the
    local day ``day`` (vixie cron's cron.c: virtual time, jumps under 3 hours)."""
    start = datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)
    end = (datetime(day.year, day.month, day.day, tzinfo=tz) + timedelta(days=1)).astimezone(UTC)
    latest = (start - MINUTE).astimezone(tz).replace(tzinfo=None)  # virtual time
    instant = start
    while instant < end:
        wall = instant.astimezone(tz).replace(tzinfo=None)
        jump = wall - latest
        if jump == MINUTE:
            if _matches(expression, wall):
                yield instant
        elif MINUTE < jump < timedelta(hours=3):  # sprang forward
            skipped = [latest + MINUTE * (n + 1) for n in range(int(jump / MINUTE))]
            if _wildcard(expression):
                if _matches(expression, wall):
                    yield instant
            else:
                yield from (instant for minute in skipped if _matches(expression, minute))
        elif jump <= timedelta(0):  # fell back: wildcard jobs only until it catches up
            if _wildcard(expression) and _matches(expression, wall):
                yield instant
            instant += MINUTE
            continue
        latest = wall
        instant += MINUTE


def cron_tz_fires(expression: str, tz: ZoneInfo, day: date) -> Iterator[datetime]:
    """cronie with ``CRON_TZ=tz`` on a UTC host: each real minute matched in ``tz``."""
    start = datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)
    end = (datetime(day.year, day.month, day.day, tzinfo=tz) + timedelta(days=1)).astimezone(UTC)
    instant = start
    while instant < end:
        if _matches(expression, instant.astimezone(tz)):
            yield instant
        instant += MINUTE


def _assert_one_slot_per_fire(expression: str, tz: ZoneInfo, fires: list[datetime]) -> None:
    # The day before and after too: the transition day's first and last fires must
    # not share a slot with their neighbours.
    slots = []
    for fire in fires:
        # cron starts the job within the minute; a late or early start keeps its slot.
        ends = {
            slot_end(expression, fire + late, tz) for late in (timedelta(0), timedelta(seconds=40))
        }
        ends.add(slot_end(expression, fire - timedelta(milliseconds=300), tz))
        assert len(ends) == 1, (fire, ends)
        end = ends.pop()
        assert end > fire
        slots.append(end)
    assert len(set(slots)) == len(fires), [
        (fire.astimezone(tz).isoformat(), end.astimezone(tz).isoformat())
        for fire, end in zip(fires, slots, strict=True)
    ]


def _days_around(day: date) -> list[date]:
    return [day - timedelta(days=1), day, day + timedelta(days=1)]


@pytest.mark.parametrize(("tz", "spring", "fall"), TRANSITIONS, ids=["New_York", "Berlin"])
@pytest.mark.parametrize(
    ("expression", "spring_runs", "fall_runs"),
    # cron(8): the skipped 02:30 runs at the transition; the repeated hour gives an
    # hourly job 25 runs and a fixed 02:30 (outside it) one.
    [("30 2 * * *", 1, 1), ("0 * * * *", 23, 25)],
    ids=["daily", "hourly"],
)
def test_each_host_cron_fire_gets_its_own_slot_across_dst(
    tz: ZoneInfo, spring: date, fall: date, expression: str, spring_runs: int, fall_runs: int
) -> None:
    assert len(list(host_cron_fires(expression, tz, spring))) == spring_runs
    assert len(list(host_cron_fires(expression, tz, fall))) == fall_runs
    for day in (spring, fall):
        fires = [fire for d in _days_around(day) for fire in host_cron_fires(expression, tz, d)]
        _assert_one_slot_per_fire(expression, tz, fires)


@pytest.mark.parametrize(("tz", "spring", "fall"), TRANSITIONS, ids=["New_York", "Berlin"])
@pytest.mark.parametrize(
    "expression", ["30 2 * * *", "0 * * * *", "30 1 * * *", "*/20 * * * *", "0 9-17 * * *"]
)
def test_each_cron_tz_fire_gets_its_own_slot_across_dst(
    tz: ZoneInfo, spring: date, fall: date, expression: str
) -> None:
    for day in (spring, fall):
        fires = [fire for d in _days_around(day) for fire in cron_tz_fires(expression, tz, d)]
        _assert_one_slot_per_fire(expression, tz, fires)


@pytest.mark.parametrize(("tz", "spring", "fall"), TRANSITIONS, ids=["New_York", "Berlin"])
@pytest.mark.parametrize("expression", ["30 1 * * *", "*/20 * * * *", "0 9-17 * * *", "15 2 * * 0"])
def test_other_schedules_get_a_slot_per_host_cron_fire(
    tz: ZoneInfo, spring: date, fall: date, expression: str
) -> None:
    for day in (spring, fall):
        fires = [fire for d in _days_around(day) for fire in host_cron_fires(expression, tz, d)]
        _assert_one_slot_per_fire(expression, tz, fires)


def test_the_repeated_hour_has_a_boundary_on_each_pass() -> None:
    # New York, 1 November 2026: 01:00-01:59 EDT, then 01:00-01:59 EST.
    first_pass = datetime(2026, 11, 1, 5, 0, tzinfo=UTC)  # 01:00 EDT
    second_pass = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)  # 01:00 EST
    assert slot_end("0 * * * *", first_pass, NEW_YORK) == second_pass
    assert slot_end("0 * * * *", second_pass, NEW_YORK) == second_pass + timedelta(hours=1)
    # Mid-way through the first pass, the next boundary reads earlier on the wall clock.
    assert next_boundary("0 * * * *", first_pass + timedelta(minutes=50), NEW_YORK) == second_pass


def test_a_skipped_time_is_a_boundary_at_the_transition() -> None:
    # New York, 8 March 2026: 02:00 EST becomes 03:00 EDT at 07:00 UTC.
    before = datetime(2026, 3, 7, 7, 30, tzinfo=UTC)  # 02:30 EST on the 7th
    transition = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    assert slot_end("30 2 * * *", before, NEW_YORK) == transition
    assert slot_end("30 2 * * *", transition, NEW_YORK) == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)


def test_a_business_hours_job_in_new_york_gets_every_hour() -> None:
    # The example: 0 9-17 on a Wednesday, read in UTC, lost 13:00-17:00.
    fires = [datetime(2026, 6, 3, hour, tzinfo=NEW_YORK).astimezone(UTC) for hour in range(9, 18)]
    ends = [slot_end("0 9-17 * * 1-5", fire, NEW_YORK) for fire in fires]
    assert ends[:-1] == fires[1:]
    assert ends[-1] == datetime(2026, 6, 4, 9, tzinfo=NEW_YORK)


def test_every_minute_of_one_local_hour_on_a_utc_minus_5_host() -> None:
    zone = load_zone("Etc/GMT+5")  # POSIX sign: UTC-5
    fires = [
        datetime(2026, 6, 3, 14, minute, tzinfo=zone.tz).astimezone(UTC) for minute in range(60)
    ]
    ends = [slot_end("* 14 * * *", fire, zone.tz) for fire in fires]
    assert ends[:-1] == fires[1:]
    assert ends[-1] == datetime(2026, 6, 4, 14, tzinfo=zone.tz)


def test_utc_is_the_default_and_fixed_offsets_work() -> None:
    now = datetime(2030, 6, 1, 12, 7, 30, tzinfo=UTC)
    assert next_boundary("0 3 * * *", now) == datetime(2030, 6, 2, 3, tzinfo=UTC)
    plus_5_30 = timezone(timedelta(hours=5, minutes=30))
    assert next_boundary("0 3 * * *", now, plus_5_30) == datetime(2030, 6, 2, 3, tzinfo=plus_5_30)


def test_zone_sources() -> None:
    assert cron_zone({"CRON_TZ": "Europe/Berlin", "TZ": "Asia/Tokyo"}) == (
        BERLIN,
        "Europe/Berlin",
        "CRON_TZ",
    )
    assert cron_zone({"TZ": ":Asia/Tokyo"}).name == "Asia/Tokyo"
    assert local_zone({"TZ": "/usr/share/zoneinfo/Asia/Tokyo"}).name == "Asia/Tokyo"
    assert cron_zone({"CRON_TZ": " ", "TZ": "Etc/GMT+5"}).source == "TZ"
    assert load_zone(BERLIN).name == "Europe/Berlin"
    assert load_zone(UTC).name == "UTC"


@pytest.mark.parametrize(
    ("value", "offset"),
    [("UTC0", 0), ("JST-9", 9 * 60), ("EST5", -5 * 60), ("<+0530>-5:30", 5 * 60 + 30)],
)
def test_posix_tz_without_daylight_saving_is_a_fixed_offset(value: str, offset: int) -> None:
    zone = local_zone({"TZ": value})
    assert zone.name == value
    assert datetime(2026, 7, 1, tzinfo=zone.tz).utcoffset() == timedelta(minutes=offset)


def test_a_zone_file_by_path(tmp_path: object) -> None:
    import pathlib

    copy = pathlib.Path(str(tmp_path)) / "zone"
    copy.write_bytes(pathlib.Path("/usr/share/zoneinfo/Asia/Tokyo").read_bytes())
    zone = cron_zone({"TZ": f":{copy}"})
    assert zone.name == str(copy)
    assert datetime(2026, 1, 1, tzinfo=zone.tz).utcoffset() == timedelta(hours=9)


def test_the_system_zone_comes_from_etc_localtime(tmp_path: object) -> None:
    import pathlib

    base = pathlib.Path(str(tmp_path))
    link = base / "localtime"
    link.symlink_to("/usr/share/zoneinfo/America/New_York")
    assert system_zone(str(link)) == (NEW_YORK, "America/New_York", str(link))
    copy = base / "copied"
    copy.write_bytes(pathlib.Path("/usr/share/zoneinfo/Europe/Berlin").read_bytes())
    copied = system_zone(str(copy))
    assert copied.name == str(copy)
    assert datetime(2026, 7, 1, tzinfo=copied.tz).utcoffset() == timedelta(hours=2)
    assert system_zone(str(base / "missing")).tz is UTC


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("Mars/Olympus", "CRON_TZ='Mars/Olympus' is not a known IANA time zone"),
        ("EST5EDT,M3.2.0,M11.1.0", "is not a known IANA time zone"),
        ("../../etc/passwd", "is not a known IANA time zone"),
        ("/etc/passwd", "is not a known IANA time zone"),
        ("UTC99", "is not a known IANA time zone"),
        ("Europe/Berlin\n", None),
    ],
)
def test_a_bad_zone_is_refused_in_one_line(value: str, words: str | None) -> None:
    if words is None:
        assert cron_zone({"CRON_TZ": value}).name == "Europe/Berlin"
        return
    with pytest.raises(ConfigurationError, match=words.replace("(", r"\(")) as caught:
        cron_zone({"CRON_TZ": value})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("expression", ["0 0 30 2 *", "0 0 31 4 *", "0 0 1 1 * 0 2020"])
def test_a_schedule_that_never_fires_is_refused(expression: str) -> None:
    with pytest.raises(ConfigurationError, match="CRON_SCHEDULE never fires"):
        check_cron(expression, name="CRON_SCHEDULE")


def test_rare_schedules_still_fire() -> None:
    # 29 February, and day-of-month OR day-of-week (cron's rule).
    assert check_cron("0 0 29 2 *") == "0 0 29 2 *"
    assert check_cron("0 0 30 2 1") == "0 0 30 2 1"

"""Six-field cron expressions read seconds last: the ones that only make sense with
seconds first (Quartz, Spring) are refused, with the rewritten form."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from dislock import ConfigurationError, LockContext
from dislock.core.cron import check_cron, next_fires, slot_end, slot_start


@pytest.mark.parametrize(
    ("expression", "rewritten"),
    [
        ("*/10 * * * * *", "* * * * * */10"),  # every 10 s, seconds first
        ("0 */5 * * * *", "*/5 * * * * 0"),  # every 5 min at :00
        ("0 0 * * * *", "0 * * * * 0"),  # hourly
        ("30 15 9 * * *", "15 9 * * * 30"),
        ("0,30 * * * * *", "* * * * * 0,30"),
    ],
)
def test_seconds_first_forms_are_refused_with_the_seconds_last_form(
    expression: str, rewritten: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_cron(expression, name="CRON_SCHEDULE")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"CRON_SCHEDULE {expression!r} would start every second")
    assert f"write {rewritten!r}" in message
    check_cron(rewritten)  # the suggestion itself is accepted


@pytest.mark.parametrize(
    "expression",
    [
        "* * * * * *",  # every second, whichever field comes first
        "* * * * * */1",
        "* * * * * */10",
        "*/5 * * * * 30",
        "0 3 * * * 0",
        "0 3 * * *",
        "*/15 * * * *",
    ],
)
def test_seconds_last_and_five_field_forms_are_accepted(expression: str) -> None:
    assert check_cron(expression) == expression


def test_a_lock_context_refuses_them_too() -> None:
    with pytest.raises(ConfigurationError, match=r"schedule '\*/10 \* \* \* \* \*'"):
        LockContext(
            url="postgresql://localhost/app", lock_key="k", owner="o", schedule="*/10 * * * * *"
        )


def test_next_fires_are_the_next_boundaries_in_the_zone() -> None:
    now = datetime(2026, 3, 7, 12, 0, 30, tzinfo=timezone.utc)
    zone = ZoneInfo("America/New_York")
    fires = next_fires("0 3 * * *", now, zone)
    assert [fire.astimezone(zone).isoformat() for fire in fires] == [
        "2026-03-08T03:00:00-04:00",  # the first day of daylight saving time
        "2026-03-09T03:00:00-04:00",
        "2026-03-10T03:00:00-04:00",
    ]
    assert [f.second for f in next_fires("* * * * * */20", now, timezone.utc)] == [40, 0, 20]


MONDAY_7_DECEMBER = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("expression", "days"),
    [
        # Day-of-month starts with "*": a day matches both fields, as cron fires it
        # (odd-dated Mondays: 21 December, 11 and 25 January), not "odd dates or Mondays".
        ("0 0 */2 * MON", ["Mon 2026-12-21", "Mon 2027-01-11", "Mon 2027-01-25"]),
        ("0 0 */2 * MON,TUE", ["Tue 2026-12-15", "Mon 2026-12-21", "Tue 2026-12-29"]),
        # Day-of-week starts with "*" (Sundays, Wednesdays, Saturdays): the same.
        ("0 0 1,15 * */3", ["Sat 2027-05-01", "Sat 2027-05-15", "Sun 2027-08-01"]),
        # Neither starts with "*": either field matching is enough.
        ("0 0 1,15 * MON", ["Mon 2026-12-14", "Tue 2026-12-15", "Mon 2026-12-21"]),
        ("0 0 1-31/2 * MON", ["Wed 2026-12-09", "Fri 2026-12-11", "Sun 2026-12-13"]),
        ("0 0 * * MON", ["Mon 2026-12-14", "Mon 2026-12-21", "Mon 2026-12-28"]),
    ],
)
def test_the_day_fields_combine_as_cron_combines_them(expression: str, days: list[str]) -> None:
    fires = next_fires(expression, MONDAY_7_DECEMBER)
    assert [fire.strftime("%a %Y-%m-%d") for fire in fires] == days


def test_a_slot_of_odd_dated_mondays_spans_the_mondays_between() -> None:
    end = slot_end("0 0 */2 * MON", MONDAY_7_DECEMBER)
    assert end == datetime(2026, 12, 21, tzinfo=timezone.utc)
    # It began with the last fire, Monday 7 December (odd), not on Sunday the 13th.
    assert slot_start("0 0 */2 * MON", end) == datetime(2026, 12, 7, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("60 * * * *", "minute field '60' is out of range 0-59"),
        ("0 24 * * *", "hour field '24' is out of range 0-23"),
        ("0 3 0 * *", "day-of-month field '0' is out of range 1-31"),
        ("0 3 * 0-12 *", "month field '0-12' is out of range 1-12"),
        ("0 3 * * 1,8", "day-of-week field '1,8' is out of range 0-7"),
        ("* * * * * 60", "second field '60' is out of range 0-59"),
        ("0 3 1 1 * 0 2100", "year field '2100' is out of range 1970-2099"),
        ("1-70/5 * * * *", "minute field '1-70/5' is out of range 0-59"),
        ("0 3 * foo *", "month field 'foo' is not valid: values are 1-12 or jan-dec, with *"),
        ("*/0 * * * *", "minute field '*/0' is not valid: values are 0-59, with *"),
        ("daily", "it has 1 field; a schedule has 5: minute hour day-of-month month day-of-week"),
        ("0 3 * *", "it has 4 fields; a schedule has 5"),
        ("@reboot", "the @ forms are @yearly, @annually, @monthly, @weekly, @daily"),
    ],
)
def test_an_invalid_expression_names_the_field_and_its_range(expression: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_cron(expression, name="CRON_SCHEDULE")
    message = str(caught.value)
    assert "\n" not in message and message.endswith(")")
    assert message.startswith(
        f"CRON_SCHEDULE is not a valid cron expression: {expression!r} ({why}"
    ), message
    if "out of range" in why:
        assert message.endswith(f"({why})")  # the whole reason: nothing after the range

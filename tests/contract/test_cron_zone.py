"""Contract: the schedule is read in the zone cron fires in, slots on the database clock.

``* H * * *`` for the local hour H of a UTC-5 host fires every minute of that hour;
read in UTC it would put the whole hour in one slot, and every run but the first
would be skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from dislock import LockContext, LockNotAcquiredError
from dislock.core.cron import EARLY_FIRE_TOLERANCE
from dislock.core.rows import schedule_key
from tests.support.drivers import AioDriver, CliDriver, Driver, SyncDriver
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
ZONE = "Etc/GMT+5"  # POSIX sign: five hours behind UTC, all year
LAST_SAFE_SECOND = 50


def _this_local_hour(rows: Rows, last_second: int = LAST_SAFE_SECOND) -> tuple[str, datetime]:
    """``* H * * *`` for the current local hour, and the database's now, away from
    the end of an hour (so the next minute is still in hour H) and from the end of
    a minute: a start in a slot's last second (``EARLY_FIRE_TOLERANCE``) counts as
    the next slot's early fire, and the run below takes a few hundred ms."""
    assert 60 - last_second > EARLY_FIRE_TOLERANCE
    now = rows.now()
    local = now.astimezone(ZoneInfo(ZONE))
    while local.minute == 59 or local.second > last_second:
        time.sleep(61 - local.second - local.microsecond / 1e6)
        now = rows.now()
        local = now.astimezone(ZoneInfo(ZONE))
    return f"* {local.hour} * * *", now


def _next_minute(instant: datetime) -> datetime:
    return instant.replace(second=0, microsecond=0) + timedelta(minutes=1)


def test_a_slot_of_the_local_hour_lasts_one_minute(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    schedule, before = _this_local_hour(rows)
    context = make_context(schedule=schedule, cron_tz=ZONE)
    assert driver.run_with_locks(["true"], context, ["schedule"]) == 0
    row = rows.get(schedule_key(context.lock_key))
    assert row is not None
    after = rows.now()
    # Read in UTC, the slot would end at H:00 UTC, hours away.
    assert row.expire_at in {_next_minute(before), _next_minute(after)}


STEP = 10
"""Seconds between the fires of the schedule of the test below: long enough for
four runs (two of them wrapper start-ups) on a loaded machine, short enough that
the test waits seconds, not a minute, for the next slot."""


def _start_of_a_step_in_this_local_hour(rows: Rows) -> tuple[str, datetime]:
    """``* H * * * */STEP`` (croniter's seconds in a sixth field) for the current
    local hour H, and the database's now, taken within a step's first 3 s (clear of
    the early fire of ``EARLY_FIRE_TOLERANCE`` before it) and not in the hour's
    last half minute, so that the next step is still in hour H."""
    while True:
        now = rows.now()
        local = now.astimezone(ZoneInfo(ZONE))
        into = local.second % STEP + local.microsecond / 1e6
        if local.minute == 59 and local.second >= 30:
            time.sleep(61 - local.second)
        elif 0.2 <= into <= 3.0:
            return f"* {local.hour} * * * */{STEP}", now
        else:
            time.sleep((STEP - into + 0.3) if into > 3.0 else 0.2 - into + 0.05)


@pytest.mark.slow
def test_runs_a_slot_apart_in_the_local_hour_both_run(
    make_context: MakeContext, rows: Rows
) -> None:
    """The wrapper under ``TZ`` and under ``CRON_TZ``, and both Python shells with
    ``cron_tz``: two runs a slot apart, each in its own slot.  Read in UTC, the
    schedule's hour would be hours away, and the first run's slot would last until
    then: every second run would be skipped."""
    schedule, now = _start_of_a_step_in_this_local_hour(rows)
    step_end = (
        now.replace(microsecond=0) - timedelta(seconds=now.second % STEP) + timedelta(seconds=STEP)
    )
    cli = CliDriver()
    sync, aio = SyncDriver(), AioDriver()
    try:
        tz_env = {"TZ": ZONE, "CRON_TZ": ""}
        runs: list[tuple[str, Callable[[], int]]] = []
        for name, driver, zone, extra in (
            ("sync", sync, ZONE, {}),
            ("aio", aio, ZONE, {}),
            ("cli CRON_TZ", cli, ZONE, {}),
            ("cli TZ", cli, None, tz_env),
        ):
            context = make_context(schedule=schedule, cron_tz=zone, lock_key=f"zone-{name}")
            runs.append((name, _runner(driver, context, extra)))
        first = {name: run() for name, run in runs}
        assert first == {name: 0 for name, _ in runs}
        # (A start in a slot's last second would have claimed the next slot.)
        early = timedelta(seconds=EARLY_FIRE_TOLERANCE)
        assert rows.now() < step_end - early, "the first runs overran their slot"
        while rows.now() < step_end + timedelta(milliseconds=200):
            time.sleep(0.1)
        second = {name: run() for name, run in runs}
        assert second == {name: 0 for name, _ in runs}
    finally:
        cli.close()
        sync.close()
        aio.close()


def _runner(driver: Driver, context: LockContext, extra_env: dict[str, str]) -> Callable[[], int]:
    """One run of ``true`` under the schedule lock: 0 if it ran, -1 if it was skipped."""

    def run() -> int:
        try:
            if isinstance(driver, CliDriver) and extra_env:
                return _run_cli(driver, context, extra_env)
            return driver.run_with_locks(["true"], context, ["schedule"])
        except LockNotAcquiredError:
            return -1

    return run


def _run_cli(driver: CliDriver, context: LockContext, extra_env: dict[str, str]) -> int:
    import subprocess

    env = {**driver.environment(context, ["schedule"]), **extra_env}
    env = {name: value for name, value in env.items() if value}
    result = subprocess.run(
        [*driver.command(), driver.url_variable, "true"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return -1 if "not running" in result.stderr else 0

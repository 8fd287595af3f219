"""Retries within a slot (``dislock.core.retries``): the marks in the slot row's
``value``, the backoff, and which configurations may ask for retries.  The SQL
that reads the marks runs against PostgreSQL in ``contract/test_retries.py``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from dislock import LockContext
from dislock.core.errors import ConfigurationError
from dislock.core.retries import (
    GRACE_CAP,
    attempt_suffix,
    backoff,
    check_retries,
    grace,
    reopened_suffix,
)

URL = "postgresql://jobs@db.internal/app"


def test_the_first_attempt_writes_the_owner_alone_as_every_version_does() -> None:
    assert attempt_suffix(1) == ""
    assert attempt_suffix(3) == " (attempt 3)"


def test_a_reopened_slot_is_named_by_its_end() -> None:
    end = datetime(2026, 12, 4, 3, 0, tzinfo=timezone.utc)
    assert reopened_suffix(end) == " (failed; retry in slot 1796353200)"


def test_the_delay_doubles_after_each_failed_attempt_up_to_a_cap() -> None:
    assert [backoff(60, attempt) for attempt in (1, 2, 3, 4)] == [60, 120, 240, 480]
    assert backoff(1, 100) == 1024


@pytest.mark.parametrize(
    ("delay", "left", "expected"),
    [
        (60, timedelta(hours=1), 60),  # the delay: another machine's tick, if it ticks as often
        (60, timedelta(minutes=2), 30),  # a quarter of the slot left: most stays for a retry here
        (3600, timedelta(days=1), GRACE_CAP),
        (60, -timedelta(seconds=1), 0),  # (a slot already over leaves nothing to wait for)
    ],
)
def test_the_failed_machine_leaves_the_retry_to_others_for_a_bounded_grace(
    delay: float, left: timedelta, expected: float
) -> None:
    retry_at = datetime(2026, 12, 4, 3, 0, tzinfo=timezone.utc)
    assert grace(delay, retry_at, retry_at + left) == expected


@pytest.mark.parametrize("strategies", [("schedule",), ("schedule", "lease")])
def test_retries_belong_to_a_schedule(strategies: tuple[str, ...]) -> None:
    check_retries(strategies, 3)


def test_a_lease_alone_has_no_slot_to_retry_in() -> None:
    with pytest.raises(ConfigurationError, match=r"retries \(3\) need the schedule strategy"):
        check_retries(("lease",), 3)
    check_retries(("lease",), 0)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"retries": -1}, "retries must be between 0 and 100, got -1"),
        ({"retries": 1.5}, "retries must be a whole number"),
        ({"retries": 101}, "retries must be between 0 and 100"),
        ({"retry_delay_seconds": 0.5}, "retry_delay_seconds must be at least 1"),
    ],
)
def test_retry_settings_out_of_range_are_refused(fields: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigurationError, match=said):
        LockContext(url=URL, lock_key="nightly", schedule="0 3 * * *", **fields)


@pytest.mark.parametrize(
    ("expression", "zone", "end", "began"),
    [
        ("0 3 * * *", "UTC", "2026-12-05T03:00:00+00:00", "2026-12-04T03:00:00+00:00"),
        ("*/5 * * * *", "UTC", "2026-12-04T03:05:00+00:00", "2026-12-04T03:00:00+00:00"),
        ("* * * * * */30", "UTC", "2026-12-04T03:00:30+00:00", "2026-12-04T03:00:00+00:00"),
        # The day of the autumn change: 03:00 Berlin came after it (CET), as on the next day.
        ("0 3 * * *", "Europe/Berlin", "2026-10-26T02:00:00+00:00", "2026-10-25T02:00:00+00:00"),
    ],
)
def test_a_slot_began_at_the_fire_before_its_end(
    expression: str, zone: str, end: str, began: str
) -> None:
    from zoneinfo import ZoneInfo

    from dislock.core.cron import slot_start

    start = slot_start(expression, datetime.fromisoformat(end), ZoneInfo(zone))
    assert start == datetime.fromisoformat(began)


def test_a_start_deadline_needs_a_schedule() -> None:
    with pytest.raises(ConfigurationError, match="start_deadline_seconds needs schedule"):
        LockContext(url=URL, lock_key="nightly", run_ttl_seconds=60, start_deadline_seconds=60)
    with pytest.raises(ConfigurationError, match="start_deadline_seconds needs the schedule"):
        check_retries(("lease",), 0, 60)


@pytest.mark.parametrize(
    ("policy", "supervised", "proves"),
    [("terminate", True, True), ("continue", True, False), ("terminate", False, False)],
    ids=["supervised command", "continue", "guarded block"],
)
def test_an_expired_lease_proves_a_holder_gone_only_when_its_guard_ends_the_command(
    policy: str, supervised: bool, proves: bool
) -> None:
    """Under ``continue`` a command outlives its lease, and a guarded block is never
    killed, so its expiry proves nothing: only a command run_with_locks supervises."""
    from dislock import ScheduleLock, build_locks

    context = LockContext(
        url=URL,
        lock_key="nightly",
        schedule="0 3 * * *",
        run_ttl_seconds=60,
        retries=1,
        lease_loss_policy=policy,  # type: ignore[arg-type]
    )
    (schedule, _) = build_locks(context, "schedule,lease", supervised=supervised)
    assert isinstance(schedule, ScheduleLock)
    assert (schedule.lease_row == "cronjob-lock:lease:nightly") is proves


@pytest.mark.parametrize("owner", ["web-1:42:ab (attempt 0)", "x (late)", "y (done)"])
def test_an_owner_that_reads_as_a_mark_is_refused_with_retries(owner: str) -> None:
    with pytest.raises(ConfigurationError, match="owner must not contain"):
        LockContext(url=URL, lock_key="nightly", schedule="0 3 * * *", owner=owner, retries=1)
    LockContext(url=URL, lock_key="nightly", schedule="0 3 * * *", owner=owner)

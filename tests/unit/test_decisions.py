"""Cron slots, the lease clock and the wrapper's decisions, without a database."""

from __future__ import annotations

import random
import re
from datetime import datetime, timedelta, timezone

import pytest

from dislock import ConfigurationError, LeaseLossPolicy
from dislock.core.context import default_owner
from dislock.core.cron import check_cron, next_boundary, slot_end
from dislock.core.lease_clock import LeaseClock, LeaseSettings, raises_on_exit
from dislock.core.supervision import check_command, exit_status
from dislock.core.waiting import jitter_delay

UTC = timezone.utc
SETTINGS = LeaseSettings(ttl=10.0, interval=3.0, policy=LeaseLossPolicy.TERMINATE)


def test_next_boundary_is_strictly_after_now() -> None:
    on_boundary = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
    assert next_boundary("0 3 * * *", on_boundary) == datetime(2030, 1, 2, 3, 0, tzinfo=UTC)
    just_before = on_boundary - timedelta(microseconds=1)
    assert next_boundary("0 3 * * *", just_before) == on_boundary


def test_next_boundary_ignores_the_session_time_zone() -> None:
    instant = datetime(2030, 6, 1, 12, 7, 30, tzinfo=UTC)
    plus14 = instant.astimezone(timezone(timedelta(hours=14)))
    minus12 = instant.astimezone(timezone(timedelta(hours=-12)))
    expected = datetime(2030, 6, 1, 12, 15, tzinfo=UTC)
    for now in (instant, plus14, minus12):
        assert next_boundary("*/15 * * * *", now) == expected


def test_seconds_field_cron() -> None:
    now = datetime(2030, 1, 1, 0, 0, 1, 500000, tzinfo=UTC)
    assert next_boundary("* * * * * */2", now) == datetime(2030, 1, 1, 0, 0, 2, tzinfo=UTC)


@pytest.mark.parametrize("expression", ["", "* * *", "61 * * * *", "every minute", None])
def test_bad_cron_is_a_configuration_error(expression: object) -> None:
    with pytest.raises(ConfigurationError):
        check_cron(expression)


def test_lease_clock_deadline_is_the_ttl_from_the_send_time_less_a_margin() -> None:
    clock = LeaseClock(SETTINGS, acquired_at=100.0)
    assert clock.deadline == 109.0  # TTL 10 s, less a margin of 10 % (at most 1 s)
    assert clock.delay_until_renewal(101.0) == pytest.approx(2.0)
    assert clock.renewed(sent_at=103.0, now=103.2, rows=1)
    assert clock.deadline == 112.0
    assert clock.next_renewal == 106.0
    assert not clock.lost
    short = LeaseClock(LeaseSettings(1.0, 0.2, LeaseLossPolicy.TERMINATE), acquired_at=0.0)
    assert short.deadline == pytest.approx(0.9)
    long = LeaseClock(LeaseSettings(600.0, 10.0, LeaseLossPolicy.TERMINATE), acquired_at=0.0)
    assert long.deadline == 599.0


def test_lease_clock_loses_on_zero_rows() -> None:
    clock = LeaseClock(SETTINGS, acquired_at=100.0)
    assert not clock.renewed(sent_at=103.0, now=103.1, rows=0)
    assert clock.lost and "no longer ours" in (clock.lost_reason or "")


def test_lease_clock_loses_on_a_renewal_returning_after_the_deadline() -> None:
    clock = LeaseClock(SETTINGS, acquired_at=100.0)
    assert not clock.renewed(sent_at=103.0, now=109.5, rows=1)
    assert clock.lost and "after the local deadline" in (clock.lost_reason or "")
    assert clock.deadline == 109.0  # a late success does not extend anything


def test_lease_clock_counts_the_deadline_itself_as_past() -> None:
    # One instant, one answer: what is_lost() says at the deadline, a renewal that
    # returns at it and the guard's check of it agree.
    clock = LeaseClock(SETTINGS, acquired_at=100.0)
    assert not clock.past_deadline(109.0 - 1e-6)
    assert clock.past_deadline(109.0)
    assert clock.lost_reason is None  # asking records nothing
    assert not clock.renewed(sent_at=103.0, now=109.0, rows=1)
    assert "0.000 s after the local deadline" in (clock.lost_reason or "")


def test_lease_clock_retries_a_failed_renewal_until_the_deadline() -> None:
    clock = LeaseClock(SETTINGS, acquired_at=100.0)
    assert clock.failed(OSError("connection reset"), now=103.0)  # still held
    assert not clock.lost
    assert clock.last_error == "OSError: connection reset"
    # The next attempt comes sooner than a heartbeat: a quarter of what is left.
    assert clock.delay_until_renewal(103.0) == pytest.approx(6.0 / 4)
    assert clock.attempt_timeout(103.0) == 3.0  # one heartbeat
    assert clock.failed(OSError("again"), now=108.9)
    assert clock.delay_until_renewal(108.9) == pytest.approx(0.05)  # never faster than that
    assert clock.attempt_timeout(108.9) == pytest.approx(0.1)  # never past the deadline
    assert clock.renewed(sent_at=108.95, now=109.0 - 1e-6, rows=1)  # made it in time
    assert clock.deadline == pytest.approx(117.95)


def test_lease_clock_loses_when_failures_reach_the_deadline() -> None:
    clock = LeaseClock(SETTINGS, acquired_at=100.0)
    assert clock.failed(OSError("down"), now=105.0)
    assert not clock.failed(OSError("still down"), now=109.0)
    assert clock.lost
    assert "before the local deadline" in (clock.lost_reason or "")
    assert "still down" in (clock.lost_reason or "")


def test_lease_clock_expiry_and_a_lost_lease_stays_lost() -> None:
    idle = LeaseClock(SETTINGS, acquired_at=100.0)
    assert not idle.check_deadline(108.9)
    assert idle.check_deadline(109.0)
    assert not idle.renewed(sent_at=109.0, now=109.1, rows=0)  # the first reason is kept
    assert "deadline" in (idle.lost_reason or "")

    taken = LeaseClock(SETTINGS, acquired_at=100.0)
    assert not taken.renewed(sent_at=101.0, now=101.1, rows=0)
    assert taken.lost and not taken.renewed(sent_at=102.0, now=102.1, rows=1)
    assert "no longer ours" in (taken.lost_reason or "")


@pytest.mark.parametrize(
    ("policy", "lost", "block_failed", "raises"),
    [
        (LeaseLossPolicy.TERMINATE, True, False, True),
        (LeaseLossPolicy.TERMINATE, True, True, False),
        (LeaseLossPolicy.TERMINATE, False, False, False),
        (LeaseLossPolicy.CONTINUE, True, False, False),
    ],
)
def test_lease_lost_error_only_when_terminating_after_a_clean_block(
    policy: LeaseLossPolicy, lost: bool, block_failed: bool, raises: bool
) -> None:
    assert raises_on_exit(policy, lost=lost, block_failed=block_failed) is raises


def test_exit_status_maps_signals_like_a_shell() -> None:
    assert exit_status(0) == 0
    assert exit_status(3) == 3
    assert exit_status(-15) == 143


def test_jitter_delay_stays_in_range() -> None:
    rng = random.Random(7)
    delays = [jitter_delay(2.0, rng) for _ in range(500)]
    assert all(0.0 <= d <= 2.0 for d in delays)
    assert max(delays) > 1.5 and min(delays) < 0.5
    assert jitter_delay(0.0) == 0.0


def test_default_owner_is_host_pid_and_unique() -> None:
    first, second = default_owner(), default_owner()
    assert re.fullmatch(r".+:\d+:[0-9a-f]{8}", first)
    assert first != second


@pytest.mark.parametrize("command", [[], "echo hi", None])
def test_check_command_rejects_non_lists(command: object) -> None:
    with pytest.raises(ConfigurationError):
        check_command(command)  # type: ignore[arg-type]


def test_heartbeat_never_lets_the_deadline_pass_between_renewals() -> None:
    # interval == TTL is allowed, but renewing only at the TTL would be too late.
    flat = LeaseClock(LeaseSettings(60.0, 60.0, LeaseLossPolicy.TERMINATE), acquired_at=0.0)
    assert flat.deadline == 59.0
    assert flat.next_renewal == 29.5  # half of what the deadline leaves
    tiny = LeaseClock(LeaseSettings(1.0, 1.0, LeaseLossPolicy.TERMINATE), acquired_at=0.0)
    assert tiny.next_renewal == pytest.approx(0.45)
    usual = LeaseClock(LeaseSettings(60.0, 10.0, LeaseLossPolicy.TERMINATE), acquired_at=0.0)
    assert usual.next_renewal == 10.0  # a sensible interval is kept as it is


def test_a_start_just_before_a_boundary_belongs_to_the_slot_it_opens() -> None:
    boundary = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
    hourly = "0 * * * *"
    early = boundary - timedelta(milliseconds=300)  # a host clock a little ahead
    late = boundary + timedelta(milliseconds=300)
    assert slot_end(hourly, early) == boundary + timedelta(hours=1)
    assert slot_end(hourly, late) == boundary + timedelta(hours=1)
    assert slot_end(hourly, boundary - timedelta(seconds=5)) == boundary  # really the old slot
    # Per-second cron: the tolerance shrinks to a quarter of a slot.
    assert slot_end("* * * * * *", boundary - timedelta(milliseconds=300)) == boundary
    assert slot_end("* * * * * *", boundary - timedelta(milliseconds=100)) == boundary + timedelta(
        seconds=1
    )


@pytest.mark.parametrize(
    ("expression", "zone", "local"),
    [
        ("0 3 * * *", "UTC", datetime(2030, 3, 1, 2, 59, 59, 400000, tzinfo=UTC)),
        ("*/5 * * * *", "UTC", datetime(2030, 3, 1, 2, 59, 59, 400000, tzinfo=UTC)),
        ("* * * * *", "UTC", datetime(2030, 3, 1, 2, 59, 59, 400000, tzinfo=UTC)),
        ("* * * * * */2", "UTC", datetime(2030, 3, 1, 2, 59, 59, 400000, tzinfo=UTC)),
        ("0 0 29 2 *", "UTC", datetime(2030, 3, 1, 2, 59, 59, 400000, tzinfo=UTC)),
        # Berlin springs forward at 01:00 UTC on 31 March 2030 (02:00 -> 03:00 local)
        # and falls back at 01:00 UTC on 27 October 2030 (03:00 -> 02:00 local).
        ("30 2 * * *", "Europe/Berlin", datetime(2030, 3, 31, 0, 59, 58, tzinfo=UTC)),
        ("*/15 * * * *", "Europe/Berlin", datetime(2030, 10, 27, 0, 59, 58, tzinfo=UTC)),
        ("0 2 * * *", "Europe/Berlin", datetime(2030, 10, 27, 0, 59, 58, tzinfo=UTC)),
    ],
)
def test_slot_candidates_pick_what_slot_end_computes(
    expression: str, zone: str, local: datetime
) -> None:
    # The schedule lock lets the database pick among these by its NOW(): the pick
    # must be slot_end's answer wherever the database clock is covered, and None
    # (read the clock instead) elsewhere, never another slot.
    from zoneinfo import ZoneInfo

    from dislock.core.cron import SlotCandidates

    tz = ZoneInfo(zone)
    candidates = SlotCandidates.around(expression, local, tz)
    assert len(candidates.ends) == SlotCandidates.COUNT
    rng = random.Random(expression)
    offsets = [rng.uniform(-5, 30) for _ in range(200)]
    # The edges: on boundaries, and within the early-fire tolerance before them.
    offsets += [(end - local).total_seconds() + d for end in candidates.ends for d in (0, -0.5)]
    covered = 0
    for offset in offsets:
        db_now = local + timedelta(seconds=offset)
        picked = candidates.pick(db_now)
        if picked is None:
            assert db_now < candidates.covered_from or db_now > candidates.latest_starts[-1]
        else:
            covered += 1
            assert picked == slot_end(expression, db_now, tz), (expression, db_now)
    assert covered > 0


def test_slot_candidates_cover_the_local_clock() -> None:
    from dislock.core.cron import SlotCandidates

    local = datetime(2030, 3, 1, 12, 0, 30, tzinfo=UTC)
    for expression in ("* * * * *", "* * * * * *", "0 3 * * *"):
        candidates = SlotCandidates.around(expression, local)
        assert candidates.covered_from == local - timedelta(seconds=SlotCandidates.BEHIND)
        for offset in (-SlotCandidates.BEHIND, 0.0, 0.5, 1.0):
            db_now = local + timedelta(seconds=offset)
            assert candidates.pick(db_now) == slot_end(expression, db_now)
        assert candidates.pick(local - timedelta(seconds=SlotCandidates.BEHIND + 1)) is None

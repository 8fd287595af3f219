"""Waiting and slot decisions of dislock-core, without a database."""

from __future__ import annotations

from typing import Any

import pytest

from dislock import ConfigurationError, LockContext
from dislock.core import waiting
from dislock.core.config import parse_auto_flag


def test_delays_are_jittered_around_the_cadence_and_never_pass_the_deadline() -> None:
    low = waiting.WaitPlan(10.0, started_at=100.0, poll_seconds=0.5, rand=lambda: 0.0)
    high = waiting.WaitPlan(10.0, started_at=100.0, poll_seconds=0.5, rand=lambda: 1.0)
    assert low.next_delay(100.0, listening=False) == pytest.approx(0.25)
    assert high.next_delay(100.0, listening=False) == pytest.approx(0.75)
    # While listening, polls are only the safety net for a holder that died.
    assert high.next_delay(100.0, listening=True) == pytest.approx(3.0)
    # Close to the deadline the delay is cut to it; past it the wait is over.
    assert high.next_delay(109.9, listening=True) == pytest.approx(0.1)
    assert high.next_delay(110.0, listening=False) is None
    assert waiting.WaitPlan(0.0, started_at=5.0).next_delay(5.0, listening=False) is None


def test_wake_ups_are_read_no_closer_than_the_spacing() -> None:
    reads = waiting.WakeReads()
    assert reads.pause(100.0) == 0.0  # the first wake-up is read at once
    reads.read(100.0)
    assert reads.pause(100.0) == pytest.approx(waiting.WAKE_SPACING)
    assert reads.pause(100.0 + waiting.WAKE_SPACING / 2) == pytest.approx(waiting.WAKE_SPACING / 2)
    assert reads.pause(100.0 + waiting.WAKE_SPACING) == 0.0
    assert reads.pause(200.0) == 0.0


def test_the_wake_up_read_is_one_read_by_primary_key() -> None:
    text = waiting.held_query(("s", "locks")).as_string(None)
    assert text == (
        'SELECT count(*) >= %(slots)s FROM "s"."locks" WHERE key = ANY(%(keys)s::text[])'
        " AND expire_at > NOW()"
    )
    assert waiting.held_query(("s", "locks")) is waiting.held_query(("s", "locks"))  # built once
    assert waiting.read_held([(True,)]) is True
    assert waiting.read_held([(False,)]) is False


def test_waiting_and_slots_need_a_lease() -> None:
    waiting.check_waiting(("lease",), 5.0, 3)
    waiting.check_waiting(("schedule", "lease"), 5.0, 3)
    waiting.check_waiting(("schedule",), 0.0, 1)
    with pytest.raises(ConfigurationError, match="waiting"):
        waiting.check_waiting(("schedule",), 0.5, 1)
    with pytest.raises(ConfigurationError, match="2 slots"):
        waiting.check_waiting(("schedule",), 0.0, 2)


@pytest.mark.parametrize(
    ("free", "attempts", "slots", "retry"),
    [(0, 1, 5, False), (1, 1, 5, False), (2, 1, 5, True), (4, 4, 5, True), (4, 5, 5, False)],
)
def test_a_lost_race_for_a_slot_is_retried_only_while_another_may_be_free(
    free: int, attempts: int, slots: int, retry: bool
) -> None:
    assert waiting.slot_retry(free=free, attempts=attempts, slots=slots) is retry


def test_slot_keys_and_the_key_a_wake_payload_digests() -> None:
    assert waiting.slot_keys("job", 3) == [
        "cronjob-lock:lease:job",
        "cronjob-lock:lease#2:job",
        "cronjob-lock:lease#3:job",
    ]
    assert waiting.wake_key("job") == "cronjob-lock:lease:job"  # the same for every slot


def test_auto_flag() -> None:
    assert parse_auto_flag("L", "auto") is None
    assert parse_auto_flag("L", "") is None
    assert parse_auto_flag("L", "on") is True
    assert parse_auto_flag("L", "0") is False
    with pytest.raises(ConfigurationError, match="L must be auto"):
        parse_auto_flag("L", "sometimes")


def context(**overrides: Any) -> LockContext:
    fields: dict[str, Any] = {
        "url": "postgresql://localhost/db",
        "table_parts": ["key_value"],
        "lock_key": "job",
        "owner": "me",
    }
    return LockContext(**{**fields, **overrides})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"wait_seconds": -1}, "wait_seconds must not be negative"),
        ({"wait_seconds": "soon"}, "wait_seconds must be a number"),
        ({"wait_seconds": float("nan")}, "wait_seconds must be a finite"),
        ({"wait_poll_seconds": 0}, "wait_poll_seconds must be greater than 0"),
        ({"wait_listen": "yes"}, "wait_listen must be True, False or None"),
        ({"slots": 0}, "slots must be between 1 and 1000, got 0"),
        ({"slots": 1001}, "slots must be between 1 and 1000"),
        ({"slots": 2.5}, "slots must be a whole number"),
    ],
)
def test_context_validates_waiting_fields(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        context(**overrides)


def test_context_normalises_waiting_fields() -> None:
    made = context(wait_seconds="2.5", slots="3")
    assert (made.wait_seconds, made.slots, made.wait_listen) == (2.5, 3, None)
    assert "wait_seconds=2.5" in repr(made) and "slots=3" in repr(made)

"""What a lock knows between statements, whichever its flavour
(``dislock.core.lease_state``, ``dislock.core.schedule_state``), and a schedule
slot's statements after its run, followed without a database.

The same paths run against PostgreSQL in ``contract/test_locks.py`` (refusals),
``contract/test_retries.py`` and ``cli/test_retries.py`` (reopening and
marking a slot done).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from dislock.core.acquisition import Given
from dislock.core.answers import Acquired
from dislock.core.context import LockContext
from dislock.core.errors import ConfigurationError, LockDelayedError, LockNotAcquiredError
from dislock.core.lease_clock import LeaseClock
from dislock.core.lease_state import LeaseState
from dislock.core.patience import SlotEnd
from dislock.core.renewal import Renewal
from dislock.core.schedule_state import ScheduleState
from dislock.core.unknown_outcome import HeldRows
from tests.unit.test_acquisition import LOST, URL, Database, lease_context

SLOT_END = datetime(2026, 12, 4, 3, 5, tzinfo=timezone.utc)


class Flag:
    """A loss event with nothing to wait on (the flavours' events carry one)."""

    def __init__(self) -> None:
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


class Hub:
    def __init__(self) -> None:
        self.lost: list[Renewal] = []

    def declare_lost(self, renewal: Renewal) -> None:
        self.lost.append(renewal)


NOW = 1000.0
"""The states' monotonic clock: stopped."""


def given() -> Given:
    """A stopped clock, the local wall clock in the slot ending at ``SLOT_END``, and
    rows held by no other test."""
    return Given(lambda: NOW, lambda: SLOT_END - timedelta(seconds=30), HeldRows())


def lease_state(**fields: Any) -> LeaseState[Hub, Flag]:
    return LeaseState(lease_context(**fields), Flag(), given())


def test_a_lease_not_taken_says_why_held_delayed_replacing_or_waited() -> None:
    state = lease_state()
    error = state._not_taken()
    assert type(error) is LockNotAcquiredError
    assert str(error) == "lease 'cronjob-lock:lease:nightly' is held by another owner"
    state._replacing = "web-3:1:aa"
    assert "was not handed over by web-3:1:aa" in str(state._not_taken())
    until = datetime(2026, 12, 4, 3, 0, 40, tzinfo=timezone.utc)
    state._delayed_until = until
    delayed = state._not_taken()
    assert isinstance(delayed, LockDelayedError) and delayed.until == until
    slots = lease_state(slots=3, wait_seconds=5.0)
    assert str(slots._not_taken()) == (
        "all 3 slots of lease 'cronjob-lock:lease:nightly' are held (waited 5 s)"
    )


def test_a_lease_is_lost_once_its_deadline_passes_and_declared_once_asked() -> None:
    state = lease_state()
    before = (state.holding, state.deadline, state.is_lost())
    assert before == (False, None, False)
    clock = LeaseClock(state.settings, acquired_at=NOW - 60.0)  # its 30 s are over
    hub = Hub()
    state._held = state._holding_now(hub, clock, 11)
    assert state.fence == 11 and state.holding and state.deadline == clock.deadline
    assert state.is_lost() and not state.lease_lost.is_set()  # a pure query
    assert state.declare_if_lost() is False  # the hub sets the event; this one only declares
    assert hub.lost == [state._held.renewal]
    assert state.lost_reason is not None and "deadline" in state.lost_reason


def test_a_lease_not_held_has_no_deadline_to_follow_nor_renewals_nor_replacement() -> None:
    state = lease_state()
    state.follow_deadline(print)  # nothing held: nothing to follow, nothing raised
    assert (state.renewals, state.replacing, state.lost_reason) == (0, False, None)


def test_a_held_lease_is_followed_renewed_and_may_be_replaced() -> None:
    state = lease_state()
    clock = LeaseClock(state.settings, acquired_at=NOW)
    state._held = state._holding_now(Hub(), clock, None)
    follower: list[float] = []
    state.follow_deadline(follower.append)
    assert state._held.renewal.on_renewed == follower.append
    clock.renewed(sent_at=NOW + 1.0, now=NOW + 1.1, rows=1)
    assert (state.renewals, state.replacing, state.is_lost()) == (1, False, False)
    clock.renewed(sent_at=NOW + 2.0, now=NOW + 2.1, rows=0)  # found gone, not read since
    assert state.replacing
    state.follow_deadline(None)
    assert state._held.renewal.on_renewed is None


def test_a_lease_is_lost_once_its_event_is_set_held_or_not() -> None:
    state = lease_state()
    state.lease_lost.set()
    assert state.is_lost() and state.declare_if_lost()


@pytest.mark.parametrize(("released", "seen_until"), [(True, NOW), (False, NOW + 60.0)])
def test_a_lease_let_go_unreleased_may_still_be_seen_live_for_two_ttls(
    released: bool, seen_until: float
) -> None:
    """A row a read found while it may still have been this process's earlier lease
    is not taken for a new acquisition's (``dislock.core.unknown_outcome``)."""
    state = lease_state()
    row = (("locks",), state.key, state.context.owner)
    state.given.held.add(*row)
    state._let_go(state.key, released=released)
    assert not state.given.held.claim(*row, read_sent_at=seen_until - 0.5)
    assert state.given.held.claim(*row, read_sent_at=seen_until + 0.5)


class LetGo(HeldRows):
    """Rows that note each lease let go: its key, and until when it is seen and kept."""

    def __init__(self) -> None:
        super().__init__()
        self.let_go_calls: list[tuple[str, float, float]] = []

    def let_go(
        self,
        table_parts: tuple[str, ...],
        key: str,
        owner: str,
        *,
        visible_until: float,
        forget_at: float,
    ) -> None:
        self.let_go_calls.append((key, visible_until, forget_at))
        super().let_go(table_parts, key, owner, visible_until=visible_until, forget_at=forget_at)


@pytest.mark.parametrize(("released", "seen_until"), [(True, NOW), (False, NOW + 60.0)])
def test_a_lease_let_go_is_forgotten_three_ttls_later(released: bool, seen_until: float) -> None:
    """No read judged three TTLs after a lease was let go can still be using it."""
    rows = LetGo()
    state: LeaseState[Hub, Flag] = LeaseState(lease_context(), Flag(), given()._replace(held=rows))
    state._let_go(state.key, released=released)
    assert rows.let_go_calls == [(state.key, seen_until, NOW + 90.0)]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"wait_seconds": 0.5}, "is held by another owner (waited 0.5 s)"),
        ({"slots": 2}, "all 2 slots of lease 'cronjob-lock:lease:nightly' are held"),
        ({"lease_mode": "group", "slots": 2}, "group 'nightly' is full: all 2 slots are held"),
    ],
)
def test_what_a_lease_held_elsewhere_says(fields: dict[str, Any], said: str) -> None:
    assert said in str(lease_state(**fields)._not_taken())


def test_a_lease_of_slots_delayed_after_a_failover_says_so_and_how_long_it_waited() -> None:
    state = lease_state(slots=2, wait_seconds=3.0)
    state._delayed_until = datetime(2026, 12, 4, 3, 0, 40, tzinfo=timezone.utc)
    error = state._not_taken()
    assert isinstance(error, LockDelayedError)
    assert str(error).startswith("no slot of lease 'cronjob-lock:lease:nightly'")
    assert str(error).endswith(" (waited 3 s)")


def schedule_state(**fields: Any) -> ScheduleState:
    fields.setdefault("retries", 2)
    fields.setdefault("retry_delay_seconds", 60.0)
    context = LockContext(
        url=URL, table_parts=["locks"], lock_key="nightly", next_run_time=SLOT_END, **fields
    )
    state = ScheduleState(context, given())
    state.expires_at = SLOT_END
    return state


def test_a_schedule_lock_needs_a_slot_end() -> None:
    with pytest.raises(ConfigurationError, match="next_run_time or schedule"):
        ScheduleState(LockContext(url=URL, table_parts=["locks"], lock_key="nightly"), given())


def test_a_slot_taken_is_noted_with_its_attempt(caplog: pytest.LogCaptureFixture) -> None:
    state = schedule_state()
    with caplog.at_level(logging.INFO, logger="dislock"):
        state._took(Acquired(True, 5, None, None, attempt=2), SLOT_END)
    assert (state.fence, state.attempt, state.expires_at) == (5, 2, SLOT_END)
    assert state._taken_as == f"{state.context.owner} (attempt 2)"
    assert "(attempt 2 of 3)" in caplog.text
    plain = schedule_state(retries=0)
    plain._took(Acquired(True, None, None, None), SLOT_END)
    assert plain._taken_as is None and plain.attempt == 1
    first = schedule_state()
    first._took(Acquired(True, None, None, None), SLOT_END)  # no attempt said: the first
    assert (first.attempt, first._taken_as) == (1, first.context.owner)
    # Claimed in the rows given, so that no other lock of this process claims it again.
    row = (("locks",), first.key, first.context.owner)
    assert not first.given.held.claim(*row, read_sent_at=NOW, slot_end=SLOT_END)


@pytest.mark.parametrize(
    ("fields", "ends_at"),
    [
        ({"schedule": "*/5 * * * *"}, SLOT_END),  # the slot of the wall clock given
        ({"next_run_time": SLOT_END + timedelta(hours=1)}, SLOT_END + timedelta(hours=1)),
        (
            {"next_run_time": SLOT_END + timedelta(hours=1), "schedule": "*/5 * * * *"},
            SLOT_END + timedelta(hours=1),
        ),
    ],
    ids=["schedule", "next_run_time", "both"],
)
def test_a_slots_patience_ends_with_the_slot(fields: dict[str, Any], ends_at: datetime) -> None:
    context = LockContext(url=URL, table_parts=["locks"], lock_key="nightly", **fields)
    slot = ScheduleState(context, given())._slot_of_now()()
    assert slot == SlotEnd("nightly", ends_at, SLOT_END - timedelta(seconds=30))


@pytest.mark.parametrize(
    ("attempt", "replies", "steps", "said"),
    [
        (
            1,
            [SLOT_END - timedelta(minutes=3)],
            ["reopen"],
            # This machine's grace: a quarter of the three minutes left (under the delay).
            f"another machine from {(SLOT_END - timedelta(minutes=3)).isoformat()},"
            f" on this one from {(SLOT_END - timedelta(seconds=135)).isoformat()}",
        ),
        (2, [None], ["reopen"], "the slot ends before another attempt could start"),
        (2, [LOST], ["reopen"], "could not be left to the next attempt"),
        (3, [], [], "no attempt is left in this slot"),
    ],
)
def test_a_failed_attempt_reopens_its_slot_if_one_is_left(
    attempt: int,
    replies: list[object],
    steps: list[str],
    said: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = schedule_state()
    state.attempt = attempt
    reopen = {"key": state.key, "value": "web-3:1:aa (attempt 1)", "expire_at": SLOT_END}
    db = Database(list(replies), {"reopen": reopen})
    with caplog.at_level(logging.WARNING, logger="dislock"):
        db.run(state._reopening("web-3:1:aa (attempt 1)", "failed"))
    assert db.steps == steps
    assert f"attempt {attempt} of 3 in this slot failed" in caplog.text
    assert said in caplog.text
    assert "hunter2" not in caplog.text


@pytest.mark.parametrize("reply", [None, LOST])
def test_a_successful_attempt_marks_its_slot_done_best_effort(
    reply: object, caplog: pytest.LogCaptureFixture
) -> None:
    state = schedule_state()
    done = {"key": state.key, "value": "web-3:1:aa (attempt 1)", "expire_at": SLOT_END}
    db = Database([reply], {"done": done})
    with caplog.at_level(logging.WARNING, logger="dislock"):
        db.run(state._marking_done("web-3:1:aa (attempt 1)"))
    assert db.steps == ["done"]
    assert ("could not mark this slot's successful attempt done" in caplog.text) is (reply is LOST)

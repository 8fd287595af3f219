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
from dislock.core.lease import LeaseClock
from dislock.core.lease_state import LeaseState
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


@pytest.mark.parametrize(
    ("attempt", "replies", "steps", "said"),
    [
        (1, [SLOT_END - timedelta(minutes=3)], ["reopen"], "attempt 2 may start on any machine"),
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

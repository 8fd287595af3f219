"""Contract: ``retries`` (``LOCK_RETRIES``) gives a schedule slot whose run failed
more attempts, each taken by whichever machine comes next after the delay, on
every implementation of ``run_with_locks``.

Every run here is another owner (another machine, as the slot row sees it). The
slot is a day long, so no boundary falls inside a test; where a test must not
wait out a retry delay, it makes the row's time run out (``Rows.expire``), as
waiting would.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LockContext, LockNotAcquiredError
from dislock.core.retries import GRACE_CAP, grace, slot_end_of
from dislock.core.rows import lease_key, schedule_key
from tests.support.drivers import Driver
from tests.support.eventually import eventually
from tests.support.rows import Rows, history_runs

MakeContext = Callable[..., LockContext]
DAILY = "0 0 * * *"


def _attempt(marker: Path, status: int) -> list[str]:
    """A command that appends its attempt number to ``marker`` and exits ``status``."""
    return ["sh", "-c", f'echo "$DISLOCK_ATTEMPT" >> "{marker}"; exit {status}']


def _attempts(marker: Path) -> list[str]:
    return marker.read_text().split() if marker.exists() else []


@pytest.mark.parametrize("strategies", [["schedule"], ["schedule", "lease"]])
def test_a_failed_run_is_retried_by_another_machine_after_the_delay_and_once_only(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path, strategies: list[str]
) -> None:
    marker = tmp_path / "attempts"
    settings = {"schedule": DAILY, "retries": 2, "retry_delay_seconds": 600}
    if "lease" in strategies:
        settings |= {"run_ttl_seconds": 5.0, "lease_interval_seconds": 0.5}
    key = schedule_key(make_context(**settings).lock_key)

    assert driver.run_with_locks(_attempt(marker, 3), make_context(**settings), strategies) == 3
    row = rows.get(key)
    assert row is not None and not row.expired, "a failed attempt leaves its slot for later"
    assert "(failed; retry in slot " in row.value
    # Not before the delay (ten minutes from the failure's end): another machine is refused.
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(_attempt(marker, 0), make_context(**settings), strategies)
    assert _attempts(marker) == ["1"]

    rows.expire(key)  # the delay has passed
    assert driver.run_with_locks(_attempt(marker, 0), make_context(**settings), strategies) == 0
    assert _attempts(marker) == ["1", "2"]
    row = rows.get(key)
    # With a lease, the success is marked in the row before the lease is released.
    done = " (attempt 2) (done)" if "lease" in strategies else " (attempt 2)"
    assert row is not None and not row.expired and row.value.endswith(done), row
    # A success closes the slot: no third attempt, though one was allowed.
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(_attempt(marker, 0), make_context(**settings), strategies)
    assert _attempts(marker) == ["1", "2"]


def test_a_slot_whose_attempts_all_failed_stays_taken(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path
) -> None:
    marker = tmp_path / "attempts"
    settings = {"schedule": DAILY, "retries": 1, "retry_delay_seconds": 1}
    key = schedule_key(make_context(**settings).lock_key)
    assert driver.run_with_locks(_attempt(marker, 4), make_context(**settings), ["schedule"]) == 4

    def retried() -> bool:
        try:
            status = driver.run_with_locks(
                _attempt(marker, 5), make_context(**settings), ["schedule"]
            )
        except LockNotAcquiredError:
            return False
        assert status == 5
        return True

    # The second attempt, once the second's delay has passed (the machine's own pace).
    eventually(retried, timeout=60, interval=0.5)
    assert _attempts(marker) == ["1", "2"]
    row = rows.get(key)
    assert row is not None and not row.expired and row.value.endswith(" (attempt 2)")
    assert "(failed" not in row.value, "no attempt is left, so the slot is not reopened"
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(_attempt(marker, 0), make_context(**settings), ["schedule"])
    assert _attempts(marker) == ["1", "2"]


def test_without_retries_a_failed_run_keeps_its_slot(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path
) -> None:
    marker = tmp_path / "attempts"
    context = make_context(schedule=DAILY)
    assert driver.run_with_locks(_attempt(marker, 3), context, ["schedule"]) == 3
    row = rows.get(schedule_key(context.lock_key))
    assert row is not None and not row.expired and "(failed" not in row.value
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(_attempt(marker, 0), make_context(schedule=DAILY), ["schedule"])
    assert _attempts(marker) == ["1"]


def test_a_lease_left_unreleased_after_a_success_is_not_taken_for_a_vanished_holder(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path
) -> None:
    """As if the wrapper had been killed between its command's success and its release:
    the lease row is its owner's again, expired and unreleased, which is what a dead
    holder leaves.  The slot was marked done before the release, so nothing retries it."""
    marker = tmp_path / "attempts"
    settings = {
        "schedule": DAILY,
        "retries": 2,
        "retry_delay_seconds": 1,
        "run_ttl_seconds": 5.0,
        "lease_interval_seconds": 0.5,
    }
    first = make_context(**settings)
    assert driver.run_with_locks(_attempt(marker, 0), first, ["schedule", "lease"]) == 0
    slot = rows.get(schedule_key(first.lock_key))
    assert slot is not None and slot.value.endswith(" (done)"), slot
    owner = slot.value.removesuffix(" (done)")
    rows.db.execute(
        sql.SQL(
            "UPDATE {} SET value = %s, expire_at = NOW() - interval '1 minute' WHERE key = %s"
        ).format(rows.table),
        (owner, lease_key(first.lock_key)),
    )
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(_attempt(marker, 0), make_context(**settings), ["schedule", "lease"])
    assert _attempts(marker) == ["1"]


# -- a retry goes to another machine first ---------------------------------------

YEARLY_SLOT = "0 0 1 1 *"
"""A slot that ends on January 1st: a quarter of what is left of it is longer than the
grace's cap, unless the test runs in the last twenty minutes of the year."""


def _on(host: str) -> str:
    """An owner token of a run on ``host``, as the default token starts."""
    return f"{host}:{uuid.uuid4().int % 100000}:{uuid.uuid4().hex[:8]}"


def _move_retry_time(rows: Rows, key: str, seconds_ago: float) -> datetime:
    """Make the reopened row's retry time ``seconds_ago`` (as waiting would): the new one."""
    row = rows.db.execute(
        sql.SQL(
            "UPDATE {} SET expire_at = NOW() - make_interval(secs => %s) WHERE key = %s"
            " RETURNING expire_at"
        ).format(rows.table),
        (seconds_ago, key),
    ).fetchone()
    assert row is not None
    moved: datetime = row[0]
    return moved


@pytest.mark.parametrize("strategies", [["schedule"], ["schedule", "lease"]])
def test_the_machine_whose_attempt_failed_leaves_the_retry_to_another_for_its_grace(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path, strategies: list[str]
) -> None:
    marker = tmp_path / "attempts"
    settings = {"schedule": YEARLY_SLOT, "retries": 2, "retry_delay_seconds": 600}
    if "lease" in strategies:
        settings |= {"run_ttl_seconds": 5.0, "lease_interval_seconds": 0.5}
    failed = make_context(owner=_on("machine-a"), **settings)
    key = schedule_key(failed.lock_key)
    assert driver.run_with_locks(_attempt(marker, 3), failed, strategies) == 3
    retry_at = _move_retry_time(rows, key, 0)  # the delay has passed
    row = rows.get(key)
    assert row is not None and "(failed; retry in slot " in row.value, row
    slot = slot_end_of(row.value, row.expire_at)
    again = make_context(owner=_on("machine-a"), **settings)
    with pytest.raises(LockNotAcquiredError, match="leaves attempt 2 to another until") as told:
        driver.run_with_locks(_attempt(marker, 0), again, strategies)
    assert _attempts(marker) == ["1"]
    found = re.search(r"to another until (\S+)", str(told.value))
    assert found is not None, told.value
    # The grace the wrapper told of as the attempt failed is the one the claim keeps.
    until = datetime.fromisoformat(found.group(1))
    kept = retry_at + timedelta(seconds=grace(600, retry_at, slot))
    assert abs(until - kept) < timedelta(seconds=1) and kept > retry_at, (until, kept)

    other = make_context(owner=_on("machine-b"), **settings)
    assert driver.run_with_locks(_attempt(marker, 0), other, strategies) == 0
    assert _attempts(marker) == ["1", "2"]


def test_the_machine_whose_attempt_failed_takes_the_retry_after_its_grace(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path
) -> None:
    marker = tmp_path / "attempts"
    settings = {"schedule": YEARLY_SLOT, "retries": 2, "retry_delay_seconds": 600}
    failed = make_context(owner=_on("machine-a"), **settings)
    key = schedule_key(failed.lock_key)
    assert driver.run_with_locks(_attempt(marker, 3), failed, ["schedule"]) == 3
    _move_retry_time(rows, key, GRACE_CAP + 1)  # no other machine came for longer than any grace
    again = make_context(owner=_on("machine-a"), **settings)
    assert driver.run_with_locks(_attempt(marker, 0), again, ["schedule"]) == 0
    assert _attempts(marker) == ["1", "2"]


# -- the start deadline ----------------------------------------------------------

YEARLY = "0 0 1 1 *"
"""Its slot began on January 1st: an hour's deadline has passed unless the test runs
in the first hour of the year (then the first test below would fail, not pass)."""


@pytest.mark.parametrize("strategies", [["schedule"], ["schedule", "lease"]])
def test_a_slot_past_its_start_deadline_is_not_started_and_is_marked_late_once(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    tmp_path: Path,
    strategies: list[str],
) -> None:
    marker = tmp_path / "attempts"
    settings: dict[str, Any] = {"schedule": YEARLY, "start_deadline_seconds": 3600}
    if "lease" in strategies:
        settings |= {"run_ttl_seconds": 5.0, "lease_interval_seconds": 0.5}
    context = make_context(history=True, **settings)
    with pytest.raises(LockNotAcquiredError, match="its start deadline"):
        driver.run_with_locks(_attempt(marker, 0), context, strategies)
    row = rows.get(schedule_key(context.lock_key))
    assert row is not None and not row.expired and row.value.endswith(" (late)")
    # Another machine, late too, and one that has no deadline at all: neither starts it.
    no_deadline = {name: value for name, value in settings.items() if "deadline" not in name}
    for late_or_not in ({**settings, "history": True}, no_deadline):
        with pytest.raises(LockNotAcquiredError):
            driver.run_with_locks(_attempt(marker, 0), make_context(**late_or_not), strategies)
    assert not marker.exists()
    (run,) = history_runs(db, history, context.lock_key)
    assert run["outcome"] == "late" and run["ordered"] and run["slot_end"] is not None


def test_a_slot_within_its_start_deadline_starts(
    driver: Driver, make_context: MakeContext, tmp_path: Path
) -> None:
    marker = tmp_path / "attempts"
    context = make_context(schedule=YEARLY, start_deadline_seconds=366 * 86400)
    assert driver.run_with_locks(_attempt(marker, 0), context, ["schedule"]) == 0
    assert _attempts(marker) == ["1"]

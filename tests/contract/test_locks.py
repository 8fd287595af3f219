"""Contract: what every implementation's locks guarantee, against a real PostgreSQL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import (
    ConfigurationError,
    LeaseLossPolicy,
    LeaseLostError,
    LockContext,
    LockNotAcquiredError,
)
from dislock.core.cron import next_boundary
from dislock.core.limits import set_max_ttl
from dislock.core.rows import lease_key, schedule_key
from tests.support.clock import clear_of_boundary
from tests.support.drivers import CliDriver, CliHolding, Driver
from tests.support.eventually import eventually, wait_for
from tests.support.rows import Rows, released_owner

MakeContext = Callable[..., LockContext]
# Frequent renewals; a TTL that leaves a loaded machine over a second of stalled
# renewals before the lease is lost (the local deadline is 90 % of the TTL).
LEASE = {"run_ttl_seconds": 2.0, "lease_interval_seconds": 0.2}
YEARLY = "0 0 1 1 *"  # a slot that will not end during a test
python_api = pytest.mark.needs("python-api")


# --- schedule -----------------------------------------------------------------


def test_schedule_slot_admits_one_start(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    first = make_context(schedule=YEARLY)
    driver.hold(first, ["schedule"]).release()

    with pytest.raises(LockNotAcquiredError):
        driver.hold(make_context(schedule=YEARLY), ["schedule"])

    row = rows.get(schedule_key(first.lock_key))
    assert row is not None
    assert driver.is_owner_token(row.value, first)
    assert (row.expire_at.month, row.expire_at.day, row.expire_at.hour) == (1, 1, 0)
    assert not row.expired


def test_schedule_slot_is_acquirable_again_once_it_ends(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    first = make_context(schedule=YEARLY)
    driver.hold(first, ["schedule"]).release()
    with pytest.raises(LockNotAcquiredError):
        driver.hold(make_context(schedule=YEARLY), ["schedule"])

    rows.expire(schedule_key(first.lock_key))
    second = make_context(schedule=YEARLY)
    driver.hold(second, ["schedule"]).release()
    row = rows.get(schedule_key(second.lock_key))
    assert row is not None and not row.expired


@python_api
def test_schedule_slot_with_explicit_end_expires_then(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    # Room for the first start and the refused one before the slot ends, on a
    # loaded machine (a slot that ended before its start is not claimed at all).
    ends = rows.now() + timedelta(seconds=3)
    first = make_context(next_run_time=ends)
    driver.hold(first, ["schedule"]).release()
    row = rows.get(schedule_key(first.lock_key))
    assert row is not None and row.expire_at == first.next_run_time
    with pytest.raises(LockNotAcquiredError):
        driver.hold(make_context(next_run_time=rows.now() + timedelta(hours=1)), ["schedule"])
    assert rows.now() < ends, "the refusal came after the slot's end: it proves nothing"

    while rows.now() <= ends:
        time.sleep(0.05)
    second = make_context(next_run_time=rows.now() + timedelta(hours=1))
    driver.hold(second, ["schedule"]).release()
    row = rows.get(schedule_key(second.lock_key))
    assert row is not None and row.value == second.owner


def test_schedule_slot_computed_from_cron_on_database_clock(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    # Far enough from the next boundary that the start cannot fall in the next slot.
    before = clear_of_boundary(rows, "*/5 * * * *", seconds=30)
    context = make_context(schedule="*/5 * * * *")
    driver.hold(context, ["schedule"]).release()
    row = rows.get(schedule_key(context.lock_key))
    assert row is not None
    assert row.expire_at == next_boundary("*/5 * * * *", before)
    assert row.expire_at.minute % 5 == 0
    assert row.expire_at.second == 0 and row.expire_at.microsecond == 0


@python_api
def test_schedule_lock_class_directly(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    slot_end = rows.now() + timedelta(hours=1)
    driver.hold_lock("schedule", make_context(next_run_time=slot_end)).release()
    with pytest.raises(LockNotAcquiredError):
        driver.hold_lock("schedule", make_context(next_run_time=slot_end))


@python_api
def test_schedule_lock_needs_a_slot_end(driver: Driver, make_context: MakeContext) -> None:
    with pytest.raises(ConfigurationError, match="next_run_time or schedule"):
        driver.hold(make_context(), ["schedule"])


# --- lease --------------------------------------------------------------------


def test_lease_excludes_a_second_holder(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    first = make_context(**LEASE)
    held = driver.hold(first, ["lease"])
    with pytest.raises(LockNotAcquiredError):
        driver.hold(make_context(**LEASE), ["lease"])
    row = rows.get(lease_key(first.lock_key))
    assert row is not None and driver.is_owner_token(row.value, first) and not row.expired
    held.release()


def test_lease_released_on_exit_is_acquirable_at_once(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    first = make_context(run_ttl_seconds=60.0, lease_interval_seconds=10.0)
    driver.hold(first, ["lease"]).release()
    row = rows.get(lease_key(first.lock_key))
    assert row is not None and row.expired
    # Marked as released by its owner, which an expiry would not be.
    released_by = released_owner(row.value)
    assert released_by is not None and driver.is_owner_token(released_by, first)

    second = make_context(run_ttl_seconds=60.0, lease_interval_seconds=10.0)
    driver.hold(second, ["lease"]).release()


def test_renewals_keep_the_lease_past_its_ttl(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    held = driver.hold(context, ["lease"])
    time.sleep(2.5 * LEASE["run_ttl_seconds"])
    with pytest.raises(LockNotAcquiredError):
        driver.hold(make_context(**LEASE), ["lease"])
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and driver.is_owner_token(row.value, context) and not row.expired
    assert held.lease_lost_event_set() is False
    held.release()


def test_stolen_lease_sets_event_raises_on_exit_and_leaves_thief_alone(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    held = driver.hold(context, ["lease"])
    key = lease_key(context.lock_key)
    rows.steal(key)
    stolen = rows.get(key)

    assert held.wait_lease_lost(timeout=10.0)
    with pytest.raises(LeaseLostError):
        held.release()
    assert rows.get(key) == stolen


@python_api
def test_lease_lock_class_raises_lease_lost_error(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    held = driver.hold_lock("lease", context)
    rows.steal(lease_key(context.lock_key))
    assert held.wait_lease_lost(timeout=10.0)
    with pytest.raises(LeaseLostError):
        held.release()


@python_api
def test_exception_from_the_block_is_never_masked(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    held = driver.hold(context, ["lease"])
    rows.steal(lease_key(context.lock_key))
    assert held.wait_lease_lost(timeout=10.0)
    with pytest.raises(KeyError, match="from the block"):
        held.release(KeyError("from the block"))


@python_api
def test_exception_from_the_block_still_releases_the_lease(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    held = driver.hold(context, ["lease"])
    with pytest.raises(RuntimeError, match="boom"):
        held.release(RuntimeError("boom"))
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired


def test_continue_policy_only_logs_the_loss(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(lease_loss_policy=LeaseLossPolicy.CONTINUE, **LEASE)
    held = driver.hold(context, ["lease"])
    python_api = "python-api" in driver.features
    # The Python session's event is there under CONTINUE too; the wrapper has none.
    assert held.lease_lost_event_set() is (False if python_api else None)
    key = lease_key(context.lock_key)
    rows.steal(key)
    stolen = rows.get(key)
    if python_api:
        assert held.wait_lease_lost(timeout=10.0)  # for the block to see, if it cares
    else:
        assert isinstance(held, CliHolding)
        eventually(lambda: "lost" in held.said(), message="the wrapper never reported the loss")
    held.release()  # no LeaseLostError, and the work was not stopped
    assert rows.get(key) == stolen


@python_api
def test_continue_policy_logs_a_warning(
    driver: Driver, make_context: MakeContext, rows: Rows, caplog: pytest.LogCaptureFixture
) -> None:
    context = make_context(lease_loss_policy=LeaseLossPolicy.CONTINUE, **LEASE)
    held = driver.hold(context, ["lease"])
    rows.steal(lease_key(context.lock_key))
    assert held.wait_lease_lost(timeout=10.0)  # the renewer saw it, however slowly

    def warned() -> bool:
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        return any("lost" in message for message in warnings)

    # The renewer logs just after it sets the event, from its own thread.
    try:
        eventually(warned, timeout=10.0, message="no WARNING that the lease was lost")
    finally:
        held.release()


@python_api
def test_lease_lock_without_ttl_fails_before_connecting(driver: Driver) -> None:
    context = LockContext(
        url="postgresql://nobody@127.0.0.1:1/none",
        table_parts=["key_value"],
        lock_key="k",
        owner="o",
    )
    with pytest.raises(ValueError, match="run_ttl_seconds and lease_interval_seconds"):
        driver.hold_lock("lease", context)


# --- combined -----------------------------------------------------------------


def test_combined_locks_release_the_lease_and_keep_the_slot(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(schedule=YEARLY, **LEASE)
    held = driver.hold(context, ["lease", "schedule"])
    assert held.lease_lost_event_set() is False
    held.release()
    schedule_row = rows.get(schedule_key(context.lock_key))
    lease_row = rows.get(lease_key(context.lock_key))
    assert schedule_row is not None and not schedule_row.expired
    assert lease_row is not None and lease_row.expired


def test_combined_takes_the_slot_before_the_lease(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    runner = make_context(**LEASE)
    held = driver.hold(runner, ["lease"])  # a long run from an earlier slot

    late = make_context(schedule=YEARLY, **LEASE)
    with pytest.raises(LockNotAcquiredError):
        driver.hold(late, ["schedule", "lease"])
    # The slot was claimed first, so no other machine starts in it either.
    slot = rows.get(schedule_key(late.lock_key))
    assert slot is not None and driver.is_owner_token(slot.value, late)
    assert not slot.expired
    held.release()


def test_taken_slot_means_no_lease_is_touched(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    driver.hold(make_context(schedule=YEARLY), ["schedule"]).release()
    late = make_context(schedule=YEARLY, **LEASE)
    with pytest.raises(LockNotAcquiredError):
        driver.hold(late, ["schedule", "lease"])
    assert rows.get(lease_key(late.lock_key)) is None


# --- tables -------------------------------------------------------------------


def test_unqualified_table_name(
    driver: Driver, make_context: MakeContext, db: psycopg.Connection[Any], rows: Rows
) -> None:
    table = f"Locks {uuid.uuid4().hex[:6]}"  # mixed case and a space: quoted, not folded
    db.execute(
        sql.SQL(
            "CREATE TABLE {} (key text PRIMARY KEY, value text NOT NULL,"
            " expire_at timestamptz NOT NULL)"
        ).format(sql.Identifier(table))
    )
    try:
        context = make_context(table_parts=[table], **LEASE)
        driver.hold(context, ["lease"]).release()
        found = db.execute(
            sql.SQL("SELECT value FROM {} WHERE key = %s").format(sql.Identifier(table)),
            (lease_key(context.lock_key),),
        ).fetchone()
        assert found is not None
        owner = released_owner(found[0])
        assert owner is not None and driver.is_owner_token(owner, context)
    finally:
        db.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))


# --- run_with_locks -----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["true"], 0),
        (["sh", "-c", "exit 3"], 3),
        (["sh", "-c", "kill -KILL $$"], 128 + 9),
    ],
)
def test_run_with_locks_returns_the_command_status(
    driver: Driver, make_context: MakeContext, argv: list[str], status: int
) -> None:
    assert driver.run_with_locks(argv, make_context(**LEASE), ["lease"]) == status


def test_run_with_locks_does_not_run_the_command_when_the_slot_is_taken(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Any
) -> None:
    driver.hold(make_context(schedule=YEARLY), ["schedule"]).release()
    marker = tmp_path / "ran"
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(["touch", str(marker)], make_context(schedule=YEARLY), ["schedule"])
    assert not marker.exists()


def test_run_with_locks_terminates_the_command_when_the_lease_is_lost(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Any
) -> None:
    import threading

    context = make_context(**LEASE)
    started = tmp_path / "started"
    result: dict[str, Any] = {}
    argv = ["sh", "-c", f"touch {started}; exec sleep 60"]

    def run() -> None:
        result["status"] = driver.run_with_locks(argv, context, ["lease"])

    runner = threading.Thread(target=run)
    runner.start()
    wait_for(started)
    rows.steal(lease_key(context.lock_key))
    runner.join(timeout=30)
    assert not runner.is_alive()
    assert result["status"] == 75


def test_run_with_locks_continue_policy_lets_the_command_finish(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import threading

    earlier = driver.stderr_logs() if isinstance(driver, CliDriver) else set()

    def loss_reported() -> bool:
        # The wrapper's stderr, or this process's log for the Python APIs.
        if isinstance(driver, CliDriver):
            return any("lost" in log.read_text() for log in driver.stderr_logs() - earlier)
        return any(r.levelname == "WARNING" and "lost" in r.getMessage() for r in caplog.records)

    context = make_context(lease_loss_policy="continue", **LEASE)
    started, finish = tmp_path / "started", tmp_path / "finish"
    argv = [
        "sh",
        "-c",
        f"touch {started}; while [ ! -e {finish} ]; do sleep 0.05; done; exit 4",
    ]
    result: dict[str, Any] = {}
    runner = threading.Thread(
        target=lambda: result.update(status=driver.run_with_locks(argv, context, ["lease"]))
    )
    runner.start()
    wait_for(started)  # else the steal below would find no row to take
    rows.steal(lease_key(context.lock_key))
    eventually(loss_reported, message="the lease's loss was never reported")
    assert runner.is_alive()
    finish.touch()
    runner.join(timeout=30)
    assert result["status"] == 4


def test_a_lease_over_the_maximum_is_refused_as_such_while_the_key_is_held_elsewhere(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    rows: Rows,
) -> None:
    # The row written by hand: the lock starts on a new connection and reads the row
    # first, and that read must not hide the refusal of a TTL over the maximum.
    db.execute(set_max_ttl(lock_table, 60))
    context = make_context(run_ttl_seconds=120, lease_interval_seconds=10)
    key = lease_key(context.lock_key)
    db.execute(
        sql.SQL(
            "INSERT INTO {} VALUES (%s, 'another-machine', NOW() + interval '1 minute')"
        ).format(sql.Identifier(*lock_table)),
        (key,),
    )
    with pytest.raises(ConfigurationError, match="longer than this table's maximum of 60 s"):
        driver.hold(context, ["lease"])
    row = rows.get(key)
    assert row is not None and row.value == "another-machine" and not row.expired

"""Contract: a fleet-wide pause and the run history, on every implementation."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LockContext, LockNotAcquiredError, LockPausedError
from dislock.core.history import history_table
from dislock.core.pause import pausing
from dislock.core.rows import lease_key, pause_key, schedule_key
from tests.support.drivers import Driver
from tests.support.rows import Rows, history_runs

MakeContext = Callable[..., LockContext]
# Frequent renewals; a TTL that leaves a loaded machine over a second of stalled
# renewals before the lease is lost (the local deadline is 90 % of the TTL).
LEASE = {"run_ttl_seconds": 2.0, "lease_interval_seconds": 0.2}
YEARLY = "0 0 1 1 *"


def pause(
    db: psycopg.Connection[Any],
    table: tuple[str, ...],
    key: str,
    reason: str,
    seconds: float | None = None,
) -> None:
    """What `dislockctl pause` writes."""
    paused = pausing(table, key, reason, seconds=seconds)
    db.execute(paused.query, paused.params)


@pytest.mark.parametrize("strategies", [["schedule"], ["lease"], ["schedule", "lease"]])
def test_a_paused_key_is_skipped_with_its_reason_and_nothing_written(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    rows: Rows,
    tmp_path: Path,
    strategies: list[str],
) -> None:
    context = make_context(schedule=YEARLY, **LEASE)
    pause(db, lock_table, context.lock_key, "db migration")
    marker = tmp_path / "ran"
    with pytest.raises(LockNotAcquiredError) as caught:
        driver.run_with_locks(["touch", str(marker)], context, strategies)
    assert "paused until resumed: db migration" in str(caught.value)
    if "python-api" in driver.features:
        assert isinstance(caught.value, LockPausedError)
        assert caught.value.reason == "db migration"
    assert not marker.exists()
    assert rows.get(schedule_key(context.lock_key)) is None
    assert rows.get(lease_key(context.lock_key)) is None


def test_a_pause_does_not_stop_other_keys_and_ends_by_itself_or_on_resume(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
) -> None:
    paused = make_context(**LEASE)
    other = make_context(lock_key=paused.lock_key + "-other", **LEASE)
    pause(db, lock_table, paused.lock_key, "", seconds=3600)
    driver.hold(other, ["lease"]).release()
    with pytest.raises(LockNotAcquiredError, match="paused until 2"):
        driver.hold(paused, ["lease"])
    Rows(db, lock_table).expire(pause_key(paused.lock_key))  # the hour is over
    driver.hold(paused, ["lease"]).release()

    pause(db, lock_table, paused.lock_key, "again")
    with pytest.raises(LockNotAcquiredError, match="again"):
        driver.hold(paused, ["lease"])
    db.execute(
        sql.SQL("DELETE FROM {} WHERE key = %s").format(sql.Identifier(*lock_table)),
        (pause_key(paused.lock_key),),
    )  # what `dislockctl resume` does
    driver.hold(paused, ["lease"]).release()


def test_a_held_key_is_not_reported_as_paused(driver: Driver, make_context: MakeContext) -> None:
    first, second = make_context(**LEASE), make_context(**LEASE)
    held = driver.hold(first, ["lease"])
    try:
        with pytest.raises(LockNotAcquiredError) as caught:
            driver.hold(second, ["lease"])
        assert "paused" not in str(caught.value)
        assert not isinstance(caught.value, LockPausedError)
    finally:
        held.release()


def test_history_records_each_run_with_its_outcome(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
) -> None:
    context = make_context(history=True, schedule="* * * * * */1", **LEASE)
    before = Rows(db, ("pg_catalog", "x")).now()
    assert driver.run_with_locks(["true"], context, ["lease"]) == 0
    assert driver.run_with_locks(["sh", "-c", "exit 3"], context, ["lease"]) == 3
    assert driver.run_with_locks(["sh", "-c", "kill -TERM $$"], context, ["lease"]) == 143
    recorded = history_runs(db, history, context.lock_key)
    assert [(r["outcome"], r["exit_code"], r["signal"]) for r in recorded] == [
        ("ok", 0, None),
        ("failed", 3, None),
        ("killed", 143, 15),
    ]
    for run in recorded:
        assert run["modes"] == "lease" and run["slot_end"] is None
        assert run["host"] == socket.gethostname() and run["pid"] > 0
        assert driver.is_owner_token(run["owner"], context)
        assert run["started_at"] >= before and run["ordered"]
        assert context.cron_zone is not None  # the zone the schedule is read in
        assert run["cron"] == "* * * * * */1" and run["cron_tz"] == context.cron_zone.name


def test_history_records_the_schedule_slot(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
) -> None:
    context = make_context(history=True, schedule=YEARLY)
    assert driver.run_with_locks(["true"], context, ["schedule"]) == 0
    with pytest.raises(LockNotAcquiredError):
        driver.run_with_locks(["true"], context, ["schedule"])  # a skip is not a run
    (run,) = history_runs(db, history, context.lock_key)
    assert run["modes"] == "schedule" and run["outcome"] == "ok"
    assert (run["slot_end"].month, run["slot_end"].day, run["slot_end"].hour) == (1, 1, 0)


@pytest.mark.needs("python-api")
def test_history_of_a_block_that_failed_or_lost_its_lease(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    rows: Rows,
) -> None:
    context = make_context(history=True, **LEASE)
    held = driver.hold(context, ["lease"])
    with pytest.raises(KeyError):
        held.release(KeyError("from the block"))
    held = driver.hold(context, ["lease"])
    rows.steal(lease_key(context.lock_key))
    assert held.wait_lease_lost(10)
    with pytest.raises(Exception, match="lost"):
        held.release()
    assert [r["outcome"] for r in history_runs(db, history, context.lock_key)] == [
        "failed",
        "lease_lost",
    ]


def test_a_history_that_cannot_be_written_does_not_stop_the_run(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    context = make_context(history=True, **LEASE)  # no history table was created
    marker = tmp_path / "ran"
    assert driver.run_with_locks(["touch", str(marker)], context, ["lease"]) == 0
    assert marker.exists()
    found = db.execute(
        "SELECT to_regclass(%s)", (sql.Identifier(*history_table(lock_table)).as_string(None),)
    ).fetchone()
    assert found == (None,)


def test_a_pause_is_not_waited_for_and_stops_every_slot(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    rows: Rows,
) -> None:
    """A paused key is refused at once, even to a run that would wait for the lease,
    and whichever slot of an N-holder lease would have been free."""
    import time

    waiting = make_context(wait_seconds=30.0, **LEASE)
    slotted = make_context(slots=3, **LEASE)
    pause(db, lock_table, waiting.lock_key, "maintenance")
    started = time.monotonic()
    with pytest.raises(LockNotAcquiredError, match="maintenance"):
        driver.hold(waiting, ["lease"])
    assert time.monotonic() - started < 20  # not the 30 s wait (generous: a loaded machine)
    with pytest.raises(LockNotAcquiredError, match="paused until resumed: maintenance"):
        driver.hold(slotted, ["lease"])
    assert rows.get(lease_key(waiting.lock_key)) is None


# -- the run history of a lock entered on its own (the Python API) ----------------


def recorded(db: psycopg.Connection[Any], table: tuple[str, ...], key: str) -> list[Any]:
    return db.execute(
        sql.SQL("SELECT modes, outcome, slot_end FROM {} WHERE lock_key = %s ORDER BY id").format(
            sql.Identifier(*table)
        ),
        (key,),
    ).fetchall()


@pytest.mark.needs("python-api")
@pytest.mark.parametrize("kind", ["schedule", "lease"])
def test_a_lock_entered_on_its_own_records_its_run(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    kind: str,
) -> None:
    context = make_context(history=True, schedule=YEARLY, **LEASE)
    driver.hold_lock(kind, context).release()
    ((modes, outcome, slot_end),) = recorded(db, history, context.lock_key)
    assert modes == kind and outcome == "ok"
    assert (slot_end is not None) == (kind == "schedule")


@pytest.mark.needs("python-api")
def test_acquire_locks_records_one_run_for_all_its_locks(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
) -> None:
    context = make_context(history=True, schedule=YEARLY, **LEASE)
    holding = driver.hold(context, ["schedule", "lease"])
    with pytest.raises(ValueError, match="boom"):
        holding.release(ValueError("boom"))
    ((modes, outcome, _),) = recorded(db, history, context.lock_key)
    assert modes == "schedule,lease" and outcome == "failed"


@pytest.mark.parametrize("strategy", ["schedule", "lease"])
def test_a_key_held_elsewhere_and_paused_is_reported_as_paused(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    strategy: str,
) -> None:
    # Another machine's live row, written by hand so that the lock starts on a new
    # connection, where it reads the row before sending the acquiring statement:
    # that read must leave the answer to the statement when the key is paused.
    context = make_context(schedule=YEARLY, **LEASE)
    key = (schedule_key if strategy == "schedule" else lease_key)(context.lock_key)
    db.execute(
        sql.SQL("INSERT INTO {} VALUES (%s, 'another-machine', NOW() + interval '1 day')").format(
            sql.Identifier(*lock_table)
        ),
        (key,),
    )
    pause(db, lock_table, context.lock_key, "held and paused")
    with pytest.raises(LockNotAcquiredError, match="paused until resumed: held and paused"):
        driver.hold(context, [strategy])

"""Contract: what a run is told of "since when" (``dislock.core.slot_context``): its
slot's start and end, and its key's last successful run, read from the history by
the run's start statement; in the command's environment on every implementation,
and on the session and the locks of the Python API."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql

from dislock import LockContext
from dislock.core.cron import slot_end, slot_start
from dislock.core.slot_context import utc_text
from tests.support.drivers import Driver

MakeContext = Callable[..., LockContext]
YEARLY = "0 0 1 1 *"
ZONE = "Etc/GMT-6"  # UTC+6: a slot's start in UTC is not midnight
LEASE = {"run_ttl_seconds": 5.0, "lease_interval_seconds": 0.5}
NAMES = ("DISLOCK_SLOT_START", "DISLOCK_SLOT_END", "DISLOCK_LAST_SUCCESS")
# The command writes the three variables, "-" for one unset.
SHOWN = 'for name in {}; do printenv "$name" || echo -; done > "$0"'.format(" ".join(NAMES))


def told(driver: Driver, context: LockContext, strategies: list[str], out: Path) -> list[str]:
    """The three variables the command was given (None: unset)."""
    assert driver.run_with_locks(["sh", "-c", SHOWN, str(out)], context, strategies) == 0
    return out.read_text().splitlines()


def earlier_run(
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    key: str,
    outcome: str,
    started_at: datetime,
    slot_end: datetime | None = None,
    cron: tuple[str, str] | None = None,
) -> None:
    """A run of another machine, as its history row reads."""
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, slot_end, owner, host, pid, started_at, ended_at,"
            " outcome, cron, cron_tz) VALUES (%s, %s, %s, 'elsewhere', 'other-host', 1, %s, %s,"
            " %s, %s, %s)"
        ).format(sql.Identifier(*history)),
        (
            key,
            "lease" if slot_end is None else "schedule",
            slot_end,
            started_at,
            started_at + timedelta(seconds=5),
            outcome,
            *(cron or (None, None)),
        ),
    )


def this_slot(db: psycopg.Connection[Any], history: tuple[str, ...], key: str) -> datetime:
    """The slot end the run recorded (the database clock picked it)."""
    row = db.execute(
        sql.SQL("SELECT slot_end FROM {} WHERE owner <> 'elsewhere' AND lock_key = %s").format(
            sql.Identifier(*history)
        ),
        (key,),
    ).fetchone()
    assert row is not None and row[0] is not None
    return row[0]  # type: ignore[no-any-return]


def newest_start(db: psycopg.Connection[Any], history: tuple[str, ...]) -> datetime:
    """When the newest run of the history started."""
    query = sql.SQL("SELECT max(started_at) FROM {}").format(sql.Identifier(*history))
    row = db.execute(query).fetchone()
    assert row is not None and row[0] is not None
    return row[0]  # type: ignore[no-any-return]


def test_a_schedule_run_is_told_its_slot_and_its_last_successful_slot(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    tmp_path: Path,
) -> None:
    context = make_context(history=True, schedule=YEARLY, cron_tz=ZONE)
    assert context.cron_zone is not None
    tz = context.cron_zone.tz
    a_year_ago = datetime.now(timezone.utc) - timedelta(days=366)
    first = slot_end(YEARLY, a_year_ago, tz)  # a slot before this one
    # Its success started late in its slot; a failure and another key's success came after.
    earlier_run(db, history, context.lock_key, "ok", first - timedelta(days=300), first,
                (YEARLY, ZONE))  # fmt: skip
    earlier_run(db, history, context.lock_key, "failed", first, first + timedelta(days=1))
    earlier_run(db, history, context.lock_key + "-other", "ok", first + timedelta(days=2))
    start, end, last = told(driver, context, ["schedule"], tmp_path / "told")
    taken = this_slot(db, history, context.lock_key)
    assert (start, end) == (utc_text(slot_start(YEARLY, taken, tz)), utc_text(taken))
    assert re.fullmatch(r"\d{4}-12-31T18:00:00\+00:00", start), start  # midnight at UTC+6
    assert last == utc_text(slot_start(YEARLY, first, tz))


def test_the_first_run_of_a_key_has_no_last_success(
    driver: Driver,
    make_context: MakeContext,
    history: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unset, even when an outer run's value was inherited."""
    monkeypatch.setenv("DISLOCK_LAST_SUCCESS", "2000-01-01T00:00:00+00:00")
    context = make_context(history=True, schedule=YEARLY, **LEASE)
    start, end, last = told(driver, context, ["schedule", "lease"], tmp_path / "told")
    assert start != "-" and end != "-" and last == "-"


def test_a_lease_run_is_told_when_the_last_success_started_and_no_slot(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISLOCK_SLOT_START", "2000-01-01T00:00:00+00:00")
    context = make_context(history=True, **LEASE)
    began = datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=timezone.utc)
    earlier_run(db, history, context.lock_key, "ok", began)
    earlier_run(db, history, context.lock_key, "lease_lost", began + timedelta(hours=1))
    assert told(driver, context, ["lease"], tmp_path / "told") == [
        "-",
        "-",
        "2026-03-04T05:06:07.890000+00:00",
    ]
    # The run just recorded is the last success of the next.
    now = newest_start(db, history)
    assert told(driver, context, ["lease"], tmp_path / "again")[2] == utc_text(now)


def test_without_the_history_nothing_is_read(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    tmp_path: Path,
) -> None:
    context = make_context(schedule=YEARLY)
    earlier_run(db, history, context.lock_key, "ok", datetime.now(timezone.utc))
    start, end, last = told(driver, context, ["schedule"], tmp_path / "told")
    assert start != "-" and end != "-" and last == "-"


@pytest.mark.needs("python-api")
@pytest.mark.parametrize("entered", ["session", "lock"])
def test_the_session_and_the_lock_say_the_same(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    entered: str,
) -> None:
    context = make_context(history=True, schedule=YEARLY, cron_tz=ZONE)
    assert context.cron_zone is not None
    tz = context.cron_zone.tz
    began = datetime(2025, 6, 1, tzinfo=timezone.utc)
    earlier_run(db, history, context.lock_key, "ok", began)  # a lease run's: no slot
    if entered == "session":
        holding = driver.hold(context, ["schedule"])
    else:
        holding = driver.hold_lock("schedule", context)
    held = cast(Any, holding).entered
    holding.release()
    slot_end = this_slot(db, history, context.lock_key)
    assert held.slot_end == slot_end and held.slot_end.tzinfo is not None
    assert held.slot_start == slot_start(YEARLY, slot_end, tz)
    assert held.last_success == began and held.last_success.tzinfo is not None


@pytest.mark.needs("python-api")
def test_a_lease_lock_on_its_own_is_told_its_last_success(
    driver: Driver, make_context: MakeContext, db: psycopg.Connection[Any], history: tuple[str, ...]
) -> None:
    context = make_context(history=True, **LEASE)
    holding = driver.hold_lock("lease", context)
    assert cast(Any, holding).entered.last_success is None
    holding.release()
    began = newest_start(db, history)
    holding = driver.hold_lock("lease", context)
    assert cast(Any, holding).entered.last_success == began
    holding.release()

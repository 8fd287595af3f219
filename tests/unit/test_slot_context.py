"""What a run is told of "since when" (``dislock.core.slot_context``), without a database:
which start a last success counts from, and the variables' text."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from dislock import LockContext
from dislock.core.history import RunStart, read_run_start
from dislock.core.slot_context import last_success, slot_variables

SLOT_END = datetime(2026, 12, 7, 3, tzinfo=timezone.utc)
STARTED = datetime(2026, 12, 6, 3, 0, 4, tzinfo=timezone.utc)


def context(**fields: object) -> LockContext:
    return LockContext(url="postgresql://u@h/db", lock_key="k", owner="o", **fields)  # type: ignore[arg-type]


def test_a_slot_of_this_schedule_counts_from_its_start_any_other_run_from_its_own() -> None:
    nightly = context(schedule="0 3 * * *", cron_tz="UTC")
    ours = RunStart(1, (STARTED, SLOT_END, "0 3 * * *", "UTC"))
    assert last_success(nightly, ours) == SLOT_END - timedelta(days=1)
    for other in [("0 4 * * *", "UTC"), ("0 3 * * *", "Europe/Berlin"), (None, None)]:
        assert last_success(nightly, RunStart(1, (STARTED, SLOT_END, *other))) == STARTED
    assert last_success(context(), ours) == STARTED  # a lease-only run
    assert last_success(nightly, RunStart(1)) is None is last_success(nightly, None)


def test_an_answer_of_older_history_functions_has_no_last_success() -> None:
    assert read_run_start([(7,)]) == RunStart(7)
    assert read_run_start([(7, None, None, None, None)]) == RunStart(7)
    assert read_run_start([(7, STARTED, None, None, None)]).last == (STARTED, None, None, None)


def test_the_variables_are_utc_with_their_offset_and_none_is_unset() -> None:
    berlin = datetime(2026, 12, 7, 4, tzinfo=ZoneInfo("Europe/Berlin"))
    assert slot_variables(berlin, None, STARTED) == {
        "DISLOCK_SLOT_START": "2026-12-07T03:00:00+00:00",
        "DISLOCK_SLOT_END": None,
        "DISLOCK_LAST_SUCCESS": "2026-12-06T03:00:04+00:00",
    }

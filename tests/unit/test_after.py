"""``after`` (``dislock.core.after``) without a database: the check sent before a
slot is claimed, what its answer decides, the statements, and the refusals."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from dislock.core import after
from dislock.core.acquisition import Ask, Given, Noted
from dislock.core.answers import Acquired
from dislock.core.context import LockContext
from dislock.core.errors import ConfigurationError, LockNotAcquiredError
from dislock.core.history import RunEnd, end
from dislock.core.patience import ConnectPatience
from dislock.core.schedule_state import claiming_schedule_slot
from dislock.core.unknown_outcome import HeldRows

NOW = datetime(2026, 12, 3, 12, 30, 5, tzinfo=timezone.utc)
SLOT_START = datetime(2026, 12, 3, 12, tzinfo=timezone.utc)
GIVEN = Given(lambda: 0.0, lambda: NOW, HeldRows())


def _context(**fields: Any) -> LockContext:
    settings: dict[str, Any] = {
        "url": "postgresql://h/db",
        "lock_key": "report",
        "schedule": "0 * * * *",
        "cron_tz": "UTC",
        "history": True,
        "after": ["export", "load"],
    }
    return LockContext(**{**settings, **fields})


def test_a_key_without_a_success_in_the_slot_refuses_it_before_the_claim() -> None:
    context = _context()
    steps = claiming_schedule_slot(context, "k", ConnectPatience(0, 0.0), given=GIVEN)
    clock = next(steps)
    assert isinstance(clock, Ask)
    check = steps.send(NOW)
    assert isinstance(check, Ask)
    assert check.exchange.params == {"keys": ["export", "load"], "since": SLOT_START}
    with pytest.raises(LockNotAcquiredError, match="waits for 'load'") as refused:
        steps.send("load")
    assert isinstance(refused.value, after.DependencyPending)
    assert refused.value.key == "load"


def test_every_key_succeeded_then_the_slot_is_claimed() -> None:
    steps = claiming_schedule_slot(_context(), "k", ConnectPatience(0, 0.0), given=GIVEN)
    next(steps)
    steps.send(NOW)
    claim = steps.send(None)
    assert isinstance(claim, Ask)
    assert claim.exchange.params["key"] == "k"
    assert isinstance(steps.send(Acquired(True, None, None, None, timeline=1)), Noted)
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    assert done.value.value[1] == datetime(2026, 12, 3, 13, tzinfo=timezone.utc)


def test_the_check_reads_successes_started_in_the_slot_in_the_order_named() -> None:
    text = after.pending(("s", "h"), ["a"], SLOT_START).query.as_string(None)
    assert '"s"."h"' in text and "run.started_at >= %(since)s" in text
    assert "run.outcome = 'ok'" in text and "ORDER BY dep.n LIMIT 1" in text
    assert after.read_pending([("a",)]) == "a"
    assert after.read_pending([]) is None


def test_the_end_of_a_run_wakes_the_jobs_after_it_only_when_it_succeeded() -> None:
    # The plain statement, and the history function's call with the plain one to fall
    # back on (the function returns the same wake-up: sql/history_functions.sql).
    called = end(("h",), 1, RunEnd("ok", 0))
    assert called.fallback is not None and "h_dislock_end" in called.query.as_string(None)
    text = called.fallback.query.as_string(None)
    assert "RETURNING CASE WHEN outcome = 'ok' THEN pg_notify('dislock_release'," in text
    assert "tableoid::text || ':after:'" in text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"history": False}, "after reads the keys' successful runs from the history"),
        ({"schedule": None, "cron_tz": None}, "it needs schedule"),
        ({"after": "export"}, "after must be a list of lock keys"),
        ({"after": ["a", "a"]}, "after names a key twice"),
        ({"after": [""]}, "after"),
    ],
)
def test_refused_settings(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _context(**fields)


def test_the_variable_reads_keys_between_commas() -> None:
    assert after.parse_after(" a , b") == ("a", "b")
    with pytest.raises(ConfigurationError, match="empty key"):
        after.parse_after("a,")
    assert _context(after=[]).after == ()

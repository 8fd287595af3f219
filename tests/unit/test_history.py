"""Run history and pause decisions, without a database."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from dislock import ConfigurationError, LockContext, LockPausedError
from dislock.cli.lock_rows import ListedRow, LockRow
from dislock.core.history import (
    RunEnd,
    create_history,
    end_of_block,
    end_of_command,
    history_table,
    read_run_id,
)
from dislock.core.history import end as end_exchange
from dislock.core.history import start as start_exchange
from dislock.core.pause import UNTIL_RESUMED, describe_until, paused_error
from dislock.core.rows import FORCED_MARK, RELEASED_MARK, pause_key, pause_key_of


def test_outcome_of_a_wrapped_command() -> None:
    assert end_of_command(0, 0, lease_lost=False) == RunEnd("ok", 0)
    assert end_of_command(3, 3, lease_lost=False) == RunEnd("failed", 3)
    assert end_of_command(-15, 143, lease_lost=False) == RunEnd("killed", 143, 15)
    # A command exiting 143 by itself was not killed.
    assert end_of_command(143, 143, lease_lost=False) == RunEnd("failed", 143)
    assert end_of_command(-15, 75, lease_lost=True) == RunEnd("lease_lost", 75, 15)
    assert end_of_command(None, 75, lease_lost=True) == RunEnd("lease_lost", 75)
    assert end_of_block(None, lease_lost=False) == RunEnd("ok")
    assert end_of_block(KeyError("x"), lease_lost=False) == RunEnd("failed")
    assert end_of_block(None, lease_lost=True) == RunEnd("lease_lost")
    ending = end_exchange(("h",), 5, RunEnd("killed", 137, 9))
    assert ending.fallback is not None
    assert ending.fallback.params == {"id": 5, "outcome": "killed", "exit_code": 137, "signal": 9}
    # The function takes every argument, the tails and a late end's time as NULL.
    assert ending.params == {
        **ending.fallback.params,
        "ended_at": None,
        "stdout_tail": None,
        "stderr_tail": None,
    }


def test_history_table_name_and_quoting() -> None:
    assert history_table(("key_value",)) == ("key_value_history",)
    assert history_table(("ops", "Locks")) == ("ops", "Locks_history")
    assert history_table(("ops", "locks"), ["audit", "runs"]) == ("audit", "runs")
    with pytest.raises(ConfigurationError, match="63-byte"):
        history_table(("x" * 60,))
    hostile = ('kv"; DROP TABLE users; --',)
    text = " ".join(s.as_string(None) for s in create_history(history_table(hostile)))
    assert '"kv""; DROP TABLE users; --_history"' in text
    assert "(lock_key, started_at DESC)" in text and "(started_at)" in text
    start = start_exchange(
        ("h",),
        lock_key="k",
        modes=["schedule", "lease"],
        slot_end=None,
        owner="o",
        host="m",
        pid=7,
        cron="* * * * *",
    )
    assert start.fallback is not None and "NOW()" in start.fallback.query.as_string(None)
    assert start.params["modes"] == "schedule,lease"
    assert start.read([(42,)]) == (42, None) and read_run_id([(42,)]) == 42
    ending = end_exchange(("h",), 42, RunEnd("ok", 0))
    assert ending.fallback is not None
    assert "ended_at = NOW()" in ending.fallback.query.as_string(None)
    assert ending.read([]) is None


def test_context_validates_history_settings() -> None:
    base: dict[str, Any] = {
        "url": "postgresql://u@h/db",
        "table_parts": ["kv"],
        "lock_key": "k",
        "owner": "o",
    }
    assert LockContext(**base, history=True, history_table=["ops", "runs"]).history_table == (
        "ops",
        "runs",
    )
    with pytest.raises(ConfigurationError, match="history must be True or False"):
        LockContext(**{**base, "history": "yes"})
    with pytest.raises(ConfigurationError):
        LockContext(**base, history_table=["a", "b", "c"])


def test_pause_keys_and_messages() -> None:
    assert pause_key("nightly") == "cronjob-lock:pause:nightly"
    assert pause_key_of("cronjob-lock:lease:a:b") == "cronjob-lock:pause:a:b"
    assert pause_key_of("cronjob-lock:schedule:x") == "cronjob-lock:pause:x"
    until = datetime(2026, 12, 1, 6, tzinfo=timezone.utc)
    error = paused_error("nightly", "migration", until)
    assert isinstance(error, LockPausedError) and (error.reason, error.until) == (
        "migration",
        until,
    )
    assert str(error) == "'nightly' is paused until 2026-12-01T06:00:00+00:00: migration"
    assert str(paused_error("n", "", UNTIL_RESUMED)) == "'n' is paused until resumed"
    assert describe_until(None) == "until resumed"
    # An end NOW() + 2h computed: to the nearest second, as the wrapper and ls print it.
    assert describe_until(until.replace(microsecond=499_999)) == "until 2026-12-01T06:00:00+00:00"
    late = until.replace(second=59, microsecond=500_000)
    assert describe_until(late) == "until 2026-12-01T06:01:00+00:00"
    assert str(paused_error("n", "", late)) == "'n' is paused until 2026-12-01T06:01:00+00:00"


def test_row_states() -> None:
    now = datetime.now(timezone.utc)

    def row(key: str, value: str, left: float) -> LockRow:
        return LockRow.from_row(ListedRow(key, value, now, left, None))

    assert row("cronjob-lock:lease:a", "o", 5).state == "held"
    released = row("cronjob-lock:lease:a", "o" + RELEASED_MARK, -1)
    assert (released.state, released.owner, released.forced) == ("released", "o", False)
    forced = row("cronjob-lock:schedule:a", "o" + FORCED_MARK, -1)
    assert (forced.state, forced.owner, forced.forced) == ("released", "o", True)
    assert row("cronjob-lock:lease:a", "o", -1).state == "expired"
    assert row("cronjob-lock:schedule:a", "o", -1).state == "ended"
    assert row("cronjob-lock:pause:a", "why", 60).state == "paused"
    # A live row whose owner token happens to end like the mark is still held by it.
    assert row("cronjob-lock:lease:a", "x" + RELEASED_MARK, 5).owner == "x" + RELEASED_MARK

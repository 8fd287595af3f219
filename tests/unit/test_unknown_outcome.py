"""The decisions about an acquisition whose answer was lost (``dislock.core.unknown_outcome``)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg import errors

from dislock.core.context import default_owner
from dislock.core.errors import NotSent, StatementTimeout
from dislock.core.patience import ConnectPatience
from dislock.core.unknown_outcome import (
    HeldRows,
    Mine,
    judge,
    made_by_this_process,
    outcome_unknown,
)

TABLE = ("public", "key_value")
NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "error",
    [
        psycopg.OperationalError("consuming input failed: server closed the connection"),
        errors.AdminShutdown("terminating connection due to administrator command"),
    ],
)
def test_a_broken_or_unanswered_statement_may_have_taken_effect(error: Exception) -> None:
    assert outcome_unknown(error)


@pytest.mark.parametrize(
    "error",
    [
        errors.InsufficientPrivilege("permission denied for table key_value"),
        errors.UndefinedColumn('column "fence" does not exist'),
        errors.DiskFull("could not extend file"),  # an OperationalError the server answered
        NotSent("never sent"),
        StatementTimeout("no answer within 2.00 s; cancelled"),  # the server confirmed it
        ValueError("not a database failure"),
    ],
)
def test_a_statement_the_server_refused_did_nothing(error: Exception) -> None:
    assert not outcome_unknown(error)


def test_only_an_owner_this_process_made_is_proof() -> None:
    assert made_by_this_process(default_owner())
    assert not made_by_this_process("host:12345")
    assert not made_by_this_process("backup-job")
    host, pid, nonce = default_owner().rsplit(":", 2)
    assert not made_by_this_process(f"{host}:{int(pid) + 1}:{nonce}")  # a forked child's parent
    assert not made_by_this_process(f"other-{host}:{pid}:{nonce}")


def _mine(key: str) -> Mine:
    return Mine(key, 3, NOW + timedelta(minutes=1), 1)


def test_the_verdicts() -> None:
    owner = default_owner()
    held = HeldRows()
    nothing = judge([], table_parts=TABLE, owner=owner, held=held)
    assert nothing.taken is None and nothing.send_again
    taken = judge([_mine("a")], table_parts=TABLE, owner=owner, held=held)
    assert taken.taken == _mine("a") and not taken.send_again
    untrusted = judge([_mine("a")], table_parts=TABLE, owner="host:1", held=held)
    assert untrusted.taken is None and not untrusted.send_again
    # Of two slot rows of the owner, the one the process does not hold already.
    held.add(TABLE, "a", owner)
    slots = judge([_mine("a"), _mine("b")], table_parts=TABLE, owner=owner, held=held)
    assert slots.taken == _mine("b")
    alone = judge([_mine("a")], table_parts=TABLE, owner=owner, held=held)
    assert alone.taken is None and not alone.send_again
    held.discard(TABLE, "a", owner)
    assert judge([_mine("a")], table_parts=TABLE, owner=owner, held=held).taken == _mine("a")


def test_a_schedule_slot_is_held_until_it_ends() -> None:
    held = HeldRows()
    now = datetime.now(timezone.utc)
    held.add(TABLE, "slot", "o", until=now + timedelta(hours=1))
    held.add(TABLE, "old", "o", until=now - timedelta(seconds=1))
    assert held.holds(TABLE, "slot", "o")
    assert not held.holds(TABLE, "old", "o")
    assert not held.holds(("other", "t"), "slot", "o")
    held.add(TABLE, "new", "o", until=now + timedelta(hours=1))
    assert len(held) == 2  # the ended slot was forgotten


def test_finding_out_stays_within_the_patience() -> None:
    patience = ConnectPatience(10.0, 100.0, random.Random(1))
    # The first loss: no pause (the reconnection has its own); later ones back off.
    assert patience.answer_lost("lease 'k'", 101.0, attempt_started=100.5) == 0.0
    delay = patience.answer_lost("lease 'k'", 102.0, attempt_started=101.5)
    assert delay is not None and 0 < delay <= 0.05
    assert patience.answer_lost("lease 'k'", 110.0, attempt_started=109.0) is None
    error = patience.lost_answer_error("OperationalError: server closed the connection", 110.0)
    assert error.lost_answer_of == "lease 'k'" and error.attempts == 3
    assert error.unreachable_for == pytest.approx(9.5)
    assert "the connection was lost during the acquisition of lease 'k'" in str(error)
    assert "outcome is unknown" in str(error)
    patience.answer_found()
    assert patience.lost_answer_of is None

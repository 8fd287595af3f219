"""The decisions about an acquisition whose answer was lost (``dislock.core.unknown_outcome``)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import errors

from dislock.core.context import default_owner
from dislock.core.errors import DatabaseUnreachableError, NotSent, StatementTimeout
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
        DatabaseUnreachableError(
            "no connection could be opened to send it",
            detail="connection refused",
            unreachable_for=1.0,
            attempts=2,
            patience=1.0,
        ),
        StatementTimeout("no answer within 2.00 s; cancelled"),  # not read after: see docs
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


def _mine(key: str, ends: datetime = NOW + timedelta(minutes=1)) -> Mine:
    return Mine(key, 3, ends, 1)


def _judge(
    found: list[Mine], owner: str, held: HeldRows, read_sent_at: float = 100.0, **slot: Any
) -> Any:
    return judge(
        found, table_parts=TABLE, owner=owner, read_sent_at=read_sent_at, held=held, **slot
    )


def test_the_verdicts() -> None:
    owner = default_owner()
    held = HeldRows()
    nothing = _judge([], owner, held)
    assert nothing.taken is None and nothing.send_again
    untrusted = _judge([_mine("a")], "host:1", held)
    assert untrusted.taken is None and not untrusted.send_again
    taken = _judge([_mine("a")], owner, held)
    assert taken.taken == _mine("a") and not taken.send_again
    # Claimed as it was judged: another lock of the process that read it too
    # (both answers lost at once) does not take it as well.
    again = _judge([_mine("a")], owner, held)
    assert again.taken is None and not again.send_again
    # Of two slot rows of the owner, the one the process does not hold already.
    slots = _judge([_mine("a"), _mine("b")], owner, held)
    assert slots.taken == _mine("b")


def test_a_lease_let_go_is_not_taken_by_a_read_that_may_have_seen_it() -> None:
    owner = default_owner()
    held = HeldRows()
    held.add(TABLE, "a", owner)
    # Released (confirmed) at 100: a read sent before may have seen the row live.
    held.let_go(TABLE, "a", owner, visible_until=100.0, forget_at=1e12)
    assert _judge([_mine("a")], owner, held, read_sent_at=99.0).taken is None
    assert _judge([_mine("a")], owner, held, read_sent_at=100.5).taken == _mine("a")
    # Left without a confirmed release: live, for all we know, until it expires.
    held.let_go(TABLE, "b", owner, visible_until=160.0, forget_at=1e12)
    assert _judge([_mine("b")], owner, held, read_sent_at=120.0).taken is None
    assert _judge([_mine("b")], owner, held, read_sent_at=161.0).taken == _mine("b")


def test_what_may_be_forgotten_is_looked_for_at_most_once_an_interval() -> None:
    held = HeldRows(prune_interval=3600.0)
    for n in range(3):  # forgettable at once, but only the first let_go scans (empty)
        held.let_go(TABLE, f"k{n}", "o", visible_until=0.0, forget_at=0.0)
    assert len(held) == 3
    eager = HeldRows(prune_interval=0.0)
    for n in range(3):
        eager.let_go(TABLE, f"k{n}", "o", visible_until=0.0, forget_at=0.0)
    assert len(eager) == 1  # each scan forgot the one before


def test_a_schedule_slot_is_judged_by_its_end() -> None:
    owner = default_owner()
    held = HeldRows()
    earlier, later = NOW + timedelta(minutes=1), NOW + timedelta(minutes=2)
    # A live row of an earlier slot (a database clock behind ours) is not the new
    # slot's, and no sign that the statement took anything.
    other = _judge([_mine("s", earlier)], owner, held, slot_ends=[later])
    assert other.taken is None and other.send_again
    taken = _judge([_mine("s", later)], owner, held, slot_ends=[earlier, later])
    assert taken.taken == _mine("s", later)
    # A second run in that slot finds the first one's row: not its own.
    second = _judge([_mine("s", later)], owner, held, slot_ends=[later])
    assert second.taken is None and not second.send_again


def test_slots_are_remembered_a_day_past_their_end() -> None:
    held = HeldRows(prune_interval=0.0)
    now = datetime.now(timezone.utc)
    held.add(TABLE, "s", "o", slot_end=now - timedelta(hours=1))  # a clock ahead of the db's
    held.add(TABLE, "old", "o", slot_end=now - timedelta(days=2))
    assert not held.claim(TABLE, "s", "o", read_sent_at=0.0, slot_end=now - timedelta(hours=1))
    held.add(TABLE, "new", "o", slot_end=now + timedelta(hours=1))
    assert len(held) == 2  # the slot over for two days was forgotten
    assert held.claim(TABLE, "s", "o", read_sent_at=0.0, slot_end=now)  # another slot's end


def test_finding_out_stays_within_the_patience() -> None:
    patience = ConnectPatience(10.0, 100.0, random.Random(1))
    # The first loss: no pause (the reconnection has its own); later ones back off.
    assert patience.answer_lost("lease 'k'", 101.0, attempt_started=100.5) == 0.0
    delay = patience.answer_lost("lease 'k'", 102.0, attempt_started=101.5)
    assert delay is not None and 0 < delay <= 0.05
    assert patience.answer_lost("lease 'k'", 110.0, attempt_started=109.0) is None
    error = patience.gave_up("OperationalError: server closed the connection", 110.0)
    assert error.lost_answer_of == "lease 'k'" and error.attempts == 3
    assert error.unreachable_for == pytest.approx(9.5)
    assert "the connection was lost during the acquisition of lease 'k'" in str(error)
    assert "outcome is unknown" in str(error)
    patience.answer_found()
    assert patience.lost_answer_of is None

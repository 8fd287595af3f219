"""A schedule slot picked by the database clock inside the acquiring statement.

``ScheduleLock`` sends the slot ends around the local clock along with its upsert
(``Statements.acquire_by_clock``) instead of reading ``NOW()`` first; these
tests check the statement against a real server, and the fallback round trip
when the server's clock is outside what was sent.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

import psycopg
import pytest

from dislock import LockContext, LockNotAcquiredError, ScheduleLock
from dislock.core.cron import SlotCandidates, slot_end
from dislock.core.lock_statements import statements
from dislock.core.rows import schedule_key
from tests.conftest import as_sent
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]


KEY = "cronjob-lock:schedule:k"
"""A schedule row key: the lock functions take only dislock's row keys."""


def _claim(
    db: psycopg.Connection[Any], table: tuple[str, str], key: str, candidates: SlotCandidates
) -> tuple[bool, Any]:
    """Run the statement: whether it took the slot, and the slot end it picked."""
    exchange = as_sent(statements(table).acquire_by_clock(key, "me", candidates))
    row = db.execute(exchange.query.as_string(db), exchange.params).fetchone()
    assert row is not None  # always one row
    taken, token, paused_for, paused_until, timeline, delayed_until, end = row
    assert token is None and paused_for is None and paused_until is None
    assert delayed_until is None  # no failover here
    assert isinstance(timeline, int) and timeline >= 1  # the lock delay's, as every claim
    return taken, end


def test_the_statement_claims_the_slot_of_the_database_clock(
    db: psycopg.Connection[Any], lock_table: tuple[str, str], rows: Rows
) -> None:
    before = rows.now()
    candidates = SlotCandidates.around("* * * * * */2", datetime.now(timezone.utc))
    taken, end = _claim(db, lock_table, KEY, candidates)
    after = rows.now()
    assert taken is True
    # The slot of the statement's NOW(), somewhere between the two reads (which a
    # loaded machine can set more than one 2-second slot apart).
    assert slot_end("* * * * * */2", before) <= end <= slot_end("* * * * * */2", after)
    assert end.second % 2 == 0 and end.microsecond == 0
    row = rows.get(KEY)
    assert row is not None and row.value == "me" and row.expire_at == end
    # Within the same slot, another claim takes nothing and leaves the row alone.
    again, again_end = _claim(db, lock_table, KEY, candidates)
    if again_end == end:  # (unless the 2-second slot ended in between)
        assert again is False
        assert rows.get(KEY) == row


def test_a_database_clock_outside_the_candidates_picks_and_takes_nothing(
    db: psycopg.Connection[Any], lock_table: tuple[str, str], rows: Rows
) -> None:
    for far in (timedelta(days=1), timedelta(days=-1)):
        candidates = SlotCandidates.around("*/5 * * * *", datetime.now(timezone.utc) + far)
        assert _claim(db, lock_table, KEY, candidates) == (False, None)
    assert rows.get(KEY) is None


def test_schedule_lock_reads_the_clock_when_ours_is_far_off(
    make_context: MakeContext, rows: Rows, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the local clock ran a day ahead of the database's.
    around = SlotCandidates.around

    def skewed(expression: str, local_now: datetime, tz: tzinfo = timezone.utc) -> SlotCandidates:
        return around(expression, local_now + timedelta(days=1), tz)

    monkeypatch.setattr(SlotCandidates, "around", skewed)
    context = make_context(schedule="0 3 * * *", cron_tz="Asia/Tokyo")
    assert context.cron_zone is not None
    tokyo = context.cron_zone.tz
    before = rows.now()
    with ScheduleLock(context) as lock:
        after = rows.now()
    # 03:00 in Tokyo, from the database clock read when ours was found far off.
    assert lock.expires_at in {
        slot_end("0 3 * * *", before, tokyo),
        slot_end("0 3 * * *", after, tokyo),
    }
    assert lock.expires_at is not None and lock.expires_at.astimezone(tokyo).hour == 3
    row = rows.get(schedule_key(context.lock_key))
    assert row is not None and row.value == context.owner and row.expire_at == lock.expires_at
    with pytest.raises(LockNotAcquiredError):
        ScheduleLock(
            make_context(schedule="0 3 * * *", cron_tz="Asia/Tokyo", owner="o")
        ).__enter__()

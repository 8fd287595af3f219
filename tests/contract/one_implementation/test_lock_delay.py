"""The lock delay after a failover (dislock.core.failover), on the shared server.

A change of timeline is simulated by rewriting the recorded one, which is what a
promoted standby looks like to the acquiring statement; the real failover is in
tests/reliability/test_failover.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LeaseLock, LockContext, LockNotAcquiredError, ScheduleLock
from dislock.aio import LeaseLock as AioLeaseLock
from dislock.cli.lock_rows import listing
from dislock.cli.sending import send
from dislock.core.failover import TIMELINE_KEY, TTL_KEY_PREFIX
from dislock.core.rows import lease_key
from tests.conftest import as_sent
from tests.support.rows import Rows

LONGEST = timedelta(seconds=30)
"""The longest TTL the tests below use: a lock delay lasts that long."""


def metadata(db: psycopg.Connection[Any], table: tuple[str, str]) -> dict[str, tuple[str, float]]:
    rows = db.execute(
        sql.SQL(
            "SELECT key, value, EXTRACT(EPOCH FROM (expire_at - NOW()))::float8 FROM {}"
            " WHERE key LIKE 'dislock:%%'"
        ).format(sql.Identifier(*table))
    ).fetchall()
    return {key: (value, left) for key, value, left in rows}


def ttl_record(db: psycopg.Connection[Any]) -> str:
    """The key of the TTL record of the role the tests lock as."""
    row = db.execute("SELECT current_user").fetchone()
    assert row is not None
    return TTL_KEY_PREFIX + str(row[0])


def new_timeline(db: psycopg.Connection[Any], table: tuple[str, str]) -> None:
    """What the lock table shows after a failover: a timeline that is not the server's."""
    db.execute(
        sql.SQL("UPDATE {} SET value = '999' WHERE key = %s").format(sql.Identifier(*table)),
        (TIMELINE_KEY,),
    )


def end_the_delay(db: psycopg.Connection[Any], table: tuple[str, str]) -> None:
    """The failover noticed long ago: every key's delay is over."""
    db.execute(
        sql.SQL("UPDATE {} SET expire_at = 'epoch' WHERE key = %s").format(sql.Identifier(*table)),
        (TIMELINE_KEY,),
    )


def lease(make_context: Callable[..., LockContext], key: str, ttl: float = 2.0) -> LeaseLock:
    return LeaseLock(make_context(lock_key=key, run_ttl_seconds=ttl, lease_interval_seconds=0.3))


def test_the_first_lock_records_the_timeline_and_starts_no_delay(
    make_context: Callable[..., LockContext],
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
) -> None:
    with lease(make_context, "a"):
        pass
    with lease(make_context, "b"):  # at once: no delay
        pass
    found = metadata(db, lock_table)
    assert found[TIMELINE_KEY][1] <= 0
    assert int(found[TIMELINE_KEY][0]) >= 1
    assert float(found[ttl_record(db)][0]) == 2.0


def test_an_acquisition_that_began_before_the_first_record_is_not_delayed(
    make_context: Callable[..., LockContext], database_url: str, lock_table: tuple[str, str]
) -> None:
    """Machines racing on a fresh table: one statement's NOW() (its transaction's start)
    can come before another's commit of the first timeline record, which it still
    sees.  That record starts no delay, so it must refuse nothing.  (Seen under cron:
    one of three machines mailed "lock delay after a database failover" on a new table.)
    The early start is made to happen: the second acquisition runs in a transaction
    begun before the first lock took its row."""
    from dislock.core.lock_statements import statements

    exchange = as_sent(statements(lock_table).acquire_for(lease_key("second"), "second-owner", 2.0))
    with psycopg.connect(database_url, prepare_threshold=None) as early:  # not autocommit
        early.execute("SELECT now()")  # the transaction, and its NOW(), start here
        time.sleep(0.05)  # strictly before the record below, whatever the clock's grain
        with lease(make_context, "first"):  # records the timeline, with no delay
            pass
        answer = send(early, exchange)
        early.rollback()
    assert answer.delayed_until is None, answer
    assert answer.acquired, answer


def test_a_new_timeline_keeps_missing_and_expired_rows_for_the_longest_ttl(
    make_context: Callable[..., LockContext],
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    rows: Rows,
) -> None:
    with lease(make_context, "long", ttl=LONGEST.total_seconds()):
        pass
    with lease(make_context, "short", ttl=2.0):
        pass
    held = lease(make_context, "held", ttl=2.0)
    held.__enter__()
    try:
        new_timeline(db, lock_table)
        seen_from = rows.now()  # the delay starts at a NOW() after this one
        slot = make_context(
            lock_key="slot", next_run_time=datetime.now(timezone.utc) + timedelta(hours=1)
        )
        by_clock = make_context(lock_key="cron-slot", schedule="* * * * *")
        for lock in (
            lease(make_context, "fresh"),  # the first to see the new timeline starts the delay
            lease(make_context, "short"),
            ScheduleLock(slot),
            ScheduleLock(by_clock),  # the slot picked by the database clock, in the statement
        ):
            # Said as a lock delay, not as a lock someone else holds.
            with pytest.raises(LockNotAcquiredError) as refused:
                lock.__enter__()
            message = str(refused.value)
            assert "lock delay after a database failover" in message, message
            ends = datetime.fromisoformat(message.split("not taken before ")[1].split(": lock")[0])
            # The longest TTL from when the first lock saw the new timeline (bounded
            # by the clock's reads, not by how fast a loaded machine got here).
            assert seen_from + LONGEST <= ends <= rows.now() + LONGEST
        value, _ = metadata(db, lock_table)[TIMELINE_KEY]
        assert value != "999"  # the server's timeline, recorded by the first to see it
        # Recorded with the instant it was noticed; the longest TTL ever used, not
        # the acquirer's 2 s, from then on: the delay ends then.
        recorded = rows.get(TIMELINE_KEY)
        assert recorded is not None and recorded.expire_at + LONGEST == ends
        assert seen_from <= recorded.expire_at <= rows.now()
        time.sleep(2.5)  # past the held lease's TTL: its renewals are not delayed
        assert not held.is_lost()
    finally:
        held.__exit__(None, None, None)
    end_the_delay(db, lock_table)
    with lease(make_context, "fresh"):
        pass


@pytest.mark.asyncio
async def test_the_delay_holds_for_asyncio_too(
    make_context: Callable[..., LockContext],
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
) -> None:
    context = make_context(lock_key="k", run_ttl_seconds=2.0, lease_interval_seconds=0.3)
    async with AioLeaseLock(context):
        pass
    new_timeline(db, lock_table)
    with pytest.raises(LockNotAcquiredError, match="lock delay after a database failover"):
        async with AioLeaseLock(context):
            pass


def test_a_shorter_ttl_does_not_shorten_the_recorded_longest(
    make_context: Callable[..., LockContext],
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
) -> None:
    for ttl in (5.0, 2.0, 7.5, 3.0):
        with lease(make_context, f"k{ttl}", ttl=ttl):
            pass
    assert float(metadata(db, lock_table)[ttl_record(db)][0]) == 7.5


def test_metadata_rows_are_not_listed_as_locks(
    make_context: Callable[..., LockContext],
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
) -> None:
    with lease(make_context, "listed"):
        pass
    keys = [row.key for row in send(db, listing(lock_table))]
    assert keys == ["cronjob-lock:lease:listed"]
    assert set(metadata(db, lock_table)) == {TIMELINE_KEY, ttl_record(db)}


def test_no_slot_of_an_n_holder_lease_is_free_during_the_delay(
    make_context: Callable[..., LockContext],
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    rows: Rows,
) -> None:
    def slotted() -> LeaseLock:
        return LeaseLock(
            make_context(lock_key="n", run_ttl_seconds=2.0, lease_interval_seconds=0.3, slots=3)
        )

    with slotted():
        pass
    new_timeline(db, lock_table)
    with pytest.raises(LockNotAcquiredError, match=r"no slot of lease .* lock delay after"):
        slotted().__enter__()
    end_the_delay(db, lock_table)
    with slotted() as lock:
        assert lock.key.startswith("cronjob-lock:lease:n")

"""Contract: faults every implementation must survive (or report) the same way."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dislock import LeaseLostError, LockContext, LockNotAcquiredError
from dislock.core.errors import StatementTimeout
from dislock.core.rows import lease_key, schedule_key
from tests.support.clock import clear_of_boundary
from tests.support.drivers import Driver
from tests.support.eventually import eventually
from tests.support.rows import Row, Rows

MakeContext = Callable[..., LockContext]
TTL, INTERVAL = 1.5, 0.2


def test_row_locked_by_another_transaction_loses_the_lease_by_its_deadline(
    driver: Driver, make_context: MakeContext, rows: Rows, database_url: str
) -> None:
    context = make_context(run_ttl_seconds=TTL, lease_interval_seconds=INTERVAL)
    held = driver.hold(context, ["lease"])
    with psycopg.connect(database_url, prepare_threshold=None) as blocker:  # not autocommit
        blocker.execute(
            sql.SQL("SELECT * FROM {} WHERE key = %s FOR UPDATE").format(rows.table),
            (lease_key(context.lock_key),),
        )
        # The local deadline fires within the TTL of the last renewal; a hang would
        # last as long as the blocker (the whole test).  Generous: a loaded machine,
        # and the wrapper must also stop its command and exit.
        assert held.wait_lease_lost(timeout=TTL + 10.0)
        started = time.monotonic()
        with pytest.raises(LeaseLostError):
            held.release()
        assert time.monotonic() - started < 8.0  # leaving does not wait for the blocker
        blocker.rollback()


@pytest.mark.needs("python-api")
@pytest.mark.direct_postgres
def test_terminated_backend_is_replaced_and_the_lease_kept(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    tagged_url: str,
) -> None:
    # The lock's connections carry an application name of their own: killing every
    # 'dislock' backend would kill those of the tests another xdist worker runs.
    context = make_context(url=tagged_url, run_ttl_seconds=2.0, lease_interval_seconds=0.2)
    held = driver.hold(context, ["lease"])
    killed = db.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = %s AND pid <> pg_backend_pid()",
        (conninfo_to_dict(tagged_url)["application_name"],),
    ).fetchone()
    assert killed is not None and killed[0] >= 1
    before = rows.get(lease_key(context.lock_key))
    assert before is not None

    def renewed_past(earlier: Row) -> Row | None:
        row = rows.get(lease_key(context.lock_key))
        return row if row is not None and row.expire_at > earlier.expire_at else None

    # Renewals go on over a new connection: wait for one to land after the kill (a
    # loaded machine can take a while to reconnect; the TTL bounds the lease itself).
    after = eventually(lambda: renewed_past(before), message="no renewal after the kill")
    later = after
    for _ in range(2):  # and more heartbeats on it
        later = eventually(partial(renewed_past, later), message="renewals stopped")
    assert held.lease_lost_event_set() is False
    assert before is not None and after is not None
    assert after.value == before.value and after.expire_at > before.expire_at
    held.release()  # no LeaseLostError


@pytest.mark.parametrize("zones", [("+14", "-12"), ("-12", "+14")])
def test_session_time_zones_do_not_change_the_slot(
    driver: Driver, make_context: MakeContext, rows: Rows, database_url: str, zones: Any
) -> None:
    def in_zone(offset: str) -> str:
        params = conninfo_to_dict(database_url)
        # POSIX zone names count the other way: Etc/GMT-14 is UTC+14.
        posix = f"Etc/GMT{'-' if offset.startswith('+') else '+'}{offset[1:]}"
        params["options"] = f"-c TimeZone={posix}"
        return make_conninfo("", **params)

    # Both starts in one slot: far enough from its end for two slow starts.
    clear_of_boundary(rows, "*/5 * * * *", seconds=30)
    first = make_context(url=in_zone(zones[0]), schedule="*/5 * * * *")
    driver.hold(first, ["schedule"]).release()
    slot = rows.get(schedule_key(first.lock_key))
    assert slot is not None
    assert slot.expire_at.minute % 5 == 0 and slot.expire_at.second == 0
    with pytest.raises(LockNotAcquiredError):  # the same slot, seen from the other zone
        driver.hold(make_context(url=in_zone(zones[1]), schedule="*/5 * * * *"), ["schedule"])


@pytest.mark.needs("python-api")
@pytest.mark.slow
def test_a_thousand_renewals_on_one_lease(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    """Also what PgBouncer in transaction mode sees (CI runs this suite through it):
    far more executions than psycopg's auto-prepare threshold of five."""
    # The TTL only bounds a stall of the renewer (a loaded machine): 3 s.
    context = make_context(run_ttl_seconds=3.0, lease_interval_seconds=0.005)
    held = driver.hold(context, ["lease"])
    key = lease_key(context.lock_key)
    first = rows.get(key)
    eventually(
        lambda: driver.renewals(held) >= 1000,
        timeout=60,
        interval=0.5,
        message=lambda: f"{driver.renewals(held)} renewals, not 1000",
    )
    assert held.lease_lost_event_set() is False
    last = rows.get(key)
    assert first is not None and last is not None and last.expire_at > first.expire_at
    held.release()


def test_acquisition_blocked_by_a_locked_row_gives_up_in_bounded_time(
    driver: Driver, make_context: MakeContext, rows: Rows, database_url: str
) -> None:
    first = make_context(run_ttl_seconds=TTL, lease_interval_seconds=INTERVAL)
    driver.hold(first, ["lease"]).release()  # the row exists, and is free
    with psycopg.connect(database_url, prepare_threshold=None) as blocker:
        blocker.execute(
            sql.SQL("SELECT * FROM {} WHERE key = %s FOR UPDATE").format(rows.table),
            (lease_key(first.lock_key),),
        )
        started = time.monotonic()
        # Each try is cancelled at its statement timeout and handed back, and the tries
        # are ridden out within the connect patience (a row a commit waiting for its
        # synchronous standby still locks is a failover's passing answer).
        with pytest.raises((StatementTimeout, RuntimeError), match="answered so for"):
            driver.hold(
                make_context(
                    run_ttl_seconds=TTL,
                    lease_interval_seconds=INTERVAL,
                    connect_patience_seconds=2.0,
                ),
                ["lease"],
            )
        # The patience, not the blocker's whole life (generous: a CLI start on a loaded
        # machine).
        assert time.monotonic() - started < 20.0
        blocker.rollback()


@pytest.mark.needs("python-api")
def test_a_slot_that_already_ended_is_not_claimed(
    driver: Driver, make_context: MakeContext, rows: Rows
) -> None:
    ended = make_context(next_run_time=rows.now() - timedelta(seconds=1))
    with pytest.raises(LockNotAcquiredError, match="already ended"):
        driver.hold(ended, ["schedule"])
    assert rows.get(schedule_key(ended.lock_key)) is None

"""Contract: a server that refuses connections past a cap (here a role's ``CONNECTION
LIMIT``, all of it in use) is waited out, for ``connect_patience_seconds`` at most,
and then reported; the lock is never reported as held elsewhere for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from dislock import LockContext
from dislock.core.sql import lease_key, schedule_key
from tests.support.drivers import Driver, Holding
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
LIMIT = 2

# Behind the CI's PgBouncer every client is the pooler's one server role.
pytestmark = pytest.mark.direct_postgres


@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_a_lock_waits_for_a_free_connection_then_takes_it(
    driver: Driver, make_context: MakeContext, rows: Rows, limited_url: str, strategy: str
) -> None:
    context = make_context(
        url=limited_url,
        schedule="0 0 1 1 *",
        run_ttl_seconds=10,
        lease_interval_seconds=1,
        connect_patience_seconds=30,
    )
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    outcome: list[Holding | BaseException] = []

    def take() -> None:
        try:
            outcome.append(driver.hold(context, [strategy]))
        except BaseException as exc:
            outcome.append(exc)

    taker = threading.Thread(target=take)
    try:
        taker.start()
        time.sleep(1.5)
        assert outcome == []  # still waiting, neither failed nor "held elsewhere"
    finally:
        for blocker in blockers:
            blocker.close()
    taker.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], Holding), outcome
    key = lease_key(context.lock_key) if strategy == "lease" else schedule_key(context.lock_key)
    row = rows.get(key)
    assert row is not None and not row.expired
    outcome[0].release()


@pytest.mark.needs("python-api")
def test_refusals_are_raised_once_the_patience_runs_out(
    driver: Driver, make_context: MakeContext, limited_url: str
) -> None:
    context = make_context(
        url=limited_url, run_ttl_seconds=10, lease_interval_seconds=1, connect_patience_seconds=1.0
    )
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="too many connections"):
            driver.hold(context, ["lease"])
        assert time.monotonic() - started >= 1.0
    finally:
        for blocker in blockers:
            blocker.close()


@pytest.mark.needs("python-api")
def test_a_schedule_lock_stops_waiting_when_its_slot_ends(
    driver: Driver, make_context: MakeContext, limited_url: str
) -> None:
    from datetime import datetime, timedelta, timezone

    ends = datetime.now(timezone.utc) + timedelta(seconds=1.0)
    context = make_context(url=limited_url, next_run_time=ends, connect_patience_seconds=60)
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="too many connections"):
            driver.hold(context, ["schedule"])
        assert time.monotonic() - started < 10  # the slot's end, not the 60 s patience
    finally:
        for blocker in blockers:
            blocker.close()

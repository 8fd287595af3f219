"""Contract: a host that never answers (frozen, partitioned, the primary lost in a
failover) costs a patient lock one short connect timeout per try, not its patience:
the URL's next host is tried, and a URL where no host answers is reported once the
patience (or the slot) has run out, saying for how long the database was unreachable."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from dislock import DatabaseUnreachableError, LockContext
from dislock.core.rows import lease_key, schedule_key
from tests.support.drivers import Driver
from tests.support.proxy import SilentHost
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]

# The URLs are built around the server's own address, not a pooler's.
pytestmark = pytest.mark.direct_postgres


@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_a_silent_first_host_is_passed_over_within_the_patience(
    driver: Driver, make_context: MakeContext, database_url: str, rows: Rows, strategy: str
) -> None:
    with SilentHost() as silent:
        # The URL gives each host 20 s; the patience is 15 s: only short tries decide in time.
        context = make_context(
            url=silent.first_of(database_url, connect_timeout="20"),
            schedule="0 0 1 1 *",
            run_ttl_seconds=10,
            lease_interval_seconds=1,
            connect_patience_seconds=15,
        )
        started = time.monotonic()
        holding = driver.hold(context, [strategy])
        elapsed = time.monotonic() - started
    try:
        assert elapsed < 15, f"decided after {elapsed:.1f} s"
        key = lease_key(context.lock_key) if strategy == "lease" else schedule_key(context.lock_key)
        row = rows.get(key)
        assert row is not None and not row.expired
    finally:
        holding.release()


@pytest.mark.needs("python-api")
def test_a_url_whose_host_never_answers_is_reported_after_the_patience(
    driver: Driver, make_context: MakeContext, database_url: str
) -> None:
    with SilentHost() as silent:
        context = make_context(
            url=silent.alone(database_url),
            run_ttl_seconds=10,
            lease_interval_seconds=1,
            connect_patience_seconds=3,
        )
        started = time.monotonic()
        with pytest.raises(DatabaseUnreachableError, match="timeout expired") as failed:
            driver.hold(context, ["lease"])
        elapsed = time.monotonic() - started
    error = failed.value
    assert isinstance(error, psycopg.OperationalError)  # what callers caught before
    assert 3 <= elapsed < 3 + 2 + 10  # the patience, then at most one more try (2 s) and slack
    assert error.unreachable_for >= 3 and error.attempts >= 2
    assert error.slot_end is None
    assert str(error).startswith("the database was unreachable for ")


@pytest.mark.needs("python-api")
def test_a_schedule_lock_reports_the_slot_that_ended_while_no_host_answered(
    driver: Driver, make_context: MakeContext, database_url: str
) -> None:
    ends = datetime.now(timezone.utc) + timedelta(seconds=3)
    with SilentHost() as silent:
        context = make_context(
            url=silent.alone(database_url), next_run_time=ends, connect_patience_seconds=60
        )
        started = time.monotonic()
        with pytest.raises(DatabaseUnreachableError) as failed:
            driver.hold(context, ["schedule"])
        elapsed = time.monotonic() - started
    assert elapsed < 30  # the slot's end, not the 60 s patience
    assert failed.value.slot_end == ends and failed.value.lock_key == context.lock_key
    assert f"the schedule slot of {context.lock_key!r} ending {ends.isoformat()} ended" in str(
        failed.value
    )

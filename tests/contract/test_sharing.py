"""Contract: the locks of one process share one connection and one batched renewer.

Each test gives its locks a URL with an application name of its own, so that
``pg_stat_activity`` shows exactly the connections they opened.  That needs a
direct connection: PgBouncer's server connections are not the clients'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from dislock import LeaseLostError, LockContext
from dislock.core.rows import lease_key
from tests.support.backends import backends, settled_backends
from tests.support.drivers import Driver, Holding
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 1.5, "lease_interval_seconds": 0.2}

pytestmark = [pytest.mark.needs("python-api"), pytest.mark.direct_postgres]


def hold_leases(driver: Driver, make_context: MakeContext, url: str, count: int) -> list[Holding]:
    return [
        driver.hold(make_context(url=url, lock_key=f"shared-{n}", **LEASE), ["lease"])
        for n in range(count)
    ]


def test_leases_of_one_process_share_one_connection(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    tagged_url: str,
) -> None:
    held = hold_leases(driver, make_context, tagged_url, 20)
    first = {n: rows.get(lease_key(f"shared-{n}")) for n in range(20)}
    time.sleep(1.0 + 0.5)  # past the TTL's local deadline: only renewals kept them
    assert len(backends(db, tagged_url)) == 1
    for n, holding in enumerate(held):
        before, after = first[n], rows.get(lease_key(f"shared-{n}"))
        assert before is not None and after is not None
        assert after.expire_at > before.expire_at and not after.expired
        assert holding.lease_lost_event_set() is False
    for holding in held:
        holding.release()
    assert (
        settled_backends(db, tagged_url, lambda found: not found) == []
    )  # the last lock closed it
    for n in range(20):
        released = rows.get(lease_key(f"shared-{n}"))
        assert released is not None and released.expired


def test_one_lost_lease_does_not_disturb_the_others_in_its_batch(
    driver: Driver, make_context: MakeContext, rows: Rows, tagged_url: str
) -> None:
    held = hold_leases(driver, make_context, tagged_url, 3)
    rows.steal(lease_key("shared-1"))
    assert held[1].wait_lease_lost(timeout=10.0)
    time.sleep(1.5)  # the others outlive their first deadline
    assert held[0].lease_lost_event_set() is False
    assert held[2].lease_lost_event_set() is False
    held[0].release()
    held[2].release()
    with pytest.raises(LeaseLostError):
        held[1].release()


def test_keep_connected_serves_many_acquisitions_on_one_connection(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    tagged_url: str,
) -> None:
    context = make_context(url=tagged_url, **LEASE)
    with driver.keep_connected(tagged_url):
        pids = backends(db, tagged_url)
        assert len(pids) == 1  # opened on entry
        for n in range(5):
            driver.hold(context, ["lease"]).release()
            slot = make_context(url=tagged_url, lock_key=f"slot-{n}", schedule="0 0 1 1 *")
            driver.hold(slot, ["schedule"]).release()
            assert backends(db, tagged_url) == pids
    assert settled_backends(db, tagged_url, lambda found: not found) == []


def test_a_shared_connection_the_server_dropped_is_replaced(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    tagged_url: str,
) -> None:
    context = make_context(url=tagged_url, **LEASE)
    with driver.keep_connected(tagged_url):
        (pid,) = backends(db, tagged_url)
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # The server process is gone (so its goodbye was sent), then a moment for
        # the goodbye to reach the idle connection.
        assert settled_backends(db, tagged_url, lambda found: pid not in found) == []
        time.sleep(0.2)
        driver.hold(context, ["lease"]).release()  # no error: a new connection took over
        (replacement,) = settled_backends(db, tagged_url, lambda found: pid not in found)
        assert replacement != pid
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired

"""A warm shared connection prepares its statements only when it reaches the server
directly (``dislock.core.preparing``), and a prepared statement decides as the
unprepared one does.

Not marked ``direct_postgres``: behind PgBouncer in transaction pooling (the last
CI leg) the same test checks that nothing was prepared and that every lock still works.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LockContext, LockNotAcquiredError
from dislock.core.failover import TIMELINE_KEY
from dislock.core.pause import pausing
from dislock.core.preparing import CHECK_AFTER, PREPARE_THRESHOLD
from dislock.core.rows import lease_key, pause_key
from tests.support.drivers import Driver
from tests.support.eventually import eventually
from tests.support.rows import Rows

pytestmark = pytest.mark.needs("python-api")

LEASE = {"run_ttl_seconds": 1.5, "lease_interval_seconds": 0.2}

WARM = CHECK_AFTER + PREPARE_THRESHOLD + 10
"""Cycles before the decisions are checked: the connection's check, psycopg's
threshold, and PostgreSQL's five custom plans before it settles on a generic one."""

PREPARED = sql.SQL(
    "SELECT left(statement, 80), generic_plans FROM pg_prepared_statements ORDER BY 1"
)


def direct(db: psycopg.Connection[Any]) -> bool:
    """Whether the test server is reached without a pooler in between."""
    row = db.execute("SELECT pg_backend_pid()").fetchone()
    return row is not None and row[0] == db.info.backend_pid


def on_shared_connection(driver: Driver, url: str, statement: sql.Composable) -> list[Any]:
    """The rows of ``statement`` run on the kept connection to ``url`` (through the
    locks' own hub, so in that connection's session)."""
    if driver.name == "aio":
        from dislock.aio._hub import enter_hub as enter_aio_hub
        from dislock.aio._hub import leave_hub as leave_aio_hub

        async def read() -> list[Any]:
            hub = enter_aio_hub(url)
            try:
                cursor = await hub.execute(statement, {}, 10.0)  # type: ignore[arg-type]
                return await cursor.fetchall() if cursor.description else []
            finally:
                await leave_aio_hub(hub)

        return driver.call(read())  # type: ignore[attr-defined, no-any-return]
    from dislock._sync._hub import enter_hub, leave_hub

    hub = enter_hub(url)
    try:
        cursor = hub.execute(statement, {}, 10.0)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []
    finally:
        leave_hub(hub)


def prepared_on_shared_connection(driver: Driver, url: str) -> list[tuple[str, int]]:
    """``pg_prepared_statements`` as the session of the kept connection to ``url`` sees it."""
    return [(str(text), int(plans)) for text, plans in on_shared_connection(driver, url, PREPARED)]


def test_a_warm_connection_prepares_only_when_direct_and_decides_the_same(
    driver: Driver,
    make_context: Callable[..., LockContext],
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    rows: Rows,
    tagged_url: str,
) -> None:
    context = make_context(url=tagged_url, **LEASE)
    key = lease_key(context.lock_key)
    table = sql.Identifier(*lock_table)
    with driver.keep_connected(tagged_url):
        for _ in range(WARM):
            driver.hold(context, ["lease"]).release()
        prepared = prepared_on_shared_connection(driver, tagged_url)
        if direct(db):
            texts = [text for text, plans in prepared if plans > 0]
            # The lock functions' calls, or the plain statements on a table without them.
            assert any(
                text.startswith("WITH dislock_server") or '_dislock_acquire"(' in text
                for text in texts
            ), prepared
            assert any(
                text.startswith("UPDATE") or '_dislock_release"(' in text for text in texts
            ), prepared
        else:
            assert prepared == []  # behind the pooler: never a session's own statement

        # A live row of another owner refuses it, and an expired one is taken over.
        rows.steal(key)
        with pytest.raises(LockNotAcquiredError):
            driver.hold(context, ["lease"])
        rows.expire(key)
        driver.hold(context, ["lease"]).release()

        # A pause refuses it with its reason; resumed, it is taken again.
        paused = pausing(lock_table, context.lock_key, "warm pause")
        db.execute(paused.query, paused.params)
        with pytest.raises(LockNotAcquiredError, match="warm pause"):
            driver.hold(context, ["lease"])
        rows.expire(pause_key(context.lock_key))
        driver.hold(context, ["lease"]).release()

        # A new timeline starts the lock delay (the longest TTL, 1.5 s), read on the
        # server's clock at each execution, not frozen into a cached plan.
        db.execute(
            sql.SQL("UPDATE {} SET value = '999' WHERE key = %s").format(table), (TIMELINE_KEY,)
        )
        with pytest.raises(LockNotAcquiredError, match="lock delay"):
            driver.hold(context, ["lease"])

        def taken() -> bool:
            try:
                driver.hold(context, ["lease"]).release()
            except LockNotAcquiredError:
                return False
            return True

        eventually(taken, timeout=30, interval=0.2, message="the lock delay never ended")
    row = rows.get(key)
    assert row is not None and row.expired


@pytest.mark.direct_postgres
def test_statements_the_server_lost_are_sent_again_unprepared(
    driver: Driver,
    make_context: Callable[..., LockContext],
    tagged_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a pooler that passes the server's pid on would do: the session a statement
    was prepared in is not the one the next execution reaches."""
    context = make_context(url=tagged_url, **LEASE)
    with driver.keep_connected(tagged_url):
        for _ in range(WARM):
            driver.hold(context, ["lease"]).release()
        names = on_shared_connection(
            driver, tagged_url, sql.SQL("SELECT name FROM pg_prepared_statements")
        )
        assert names, "nothing was prepared on a direct connection"
        for (name,) in names:
            # One by one: psycopg would notice DEALLOCATE ALL and forget them too.
            deallocate = sql.SQL("DEALLOCATE {}").format(sql.Identifier(name))
            on_shared_connection(driver, tagged_url, deallocate)

        for _ in range(WARM):
            driver.hold(context, ["lease"]).release()  # no "prepared statement does not exist"
        assert prepared_on_shared_connection(driver, tagged_url) == []
    assert "lost a prepared statement" in caplog.text

"""Contract: hostile names stay inert, and passwords stay out of everything."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dislock import LeaseLostError, LockContext, LockNotAcquiredError
from dislock.core.rows import lease_key
from tests.support.drivers import Driver
from tests.support.rows import Rows, released_owner

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 2.0, "lease_interval_seconds": 0.2}
PASSWORD = "s3cr3t-pa55word"


@pytest.mark.parametrize(
    "table",
    [
        'kv"; DROP TABLE victim; --',
        "kv'); DELETE FROM victim; --",
        "Mixed Case Locks",
        "ünïcødé locks",
    ],
)
def test_hostile_table_names_are_quoted_and_inert(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    table: str,
) -> None:
    schema = sql.Identifier(lock_table[0])
    db.execute(sql.SQL("CREATE TABLE {}.victim (id int)").format(schema))
    db.execute(sql.SQL("INSERT INTO {}.victim VALUES (1)").format(schema))
    db.execute(
        sql.SQL(
            "CREATE TABLE {}.{} (key text PRIMARY KEY, value text NOT NULL,"
            " expire_at timestamptz NOT NULL)"
        ).format(schema, sql.Identifier(table))
    )
    context = make_context(table_parts=[lock_table[0], table], **LEASE)
    driver.hold(context, ["lease"]).release()

    assert db.execute(sql.SQL("SELECT id FROM {}.victim").format(schema)).fetchall() == [(1,)]
    row = db.execute(
        sql.SQL("SELECT value FROM {}.{} WHERE key = %s").format(schema, sql.Identifier(table)),
        (lease_key(context.lock_key),),
    ).fetchone()
    assert row is not None
    owner = released_owner(row[0])
    assert owner is not None and driver.is_owner_token(owner, context)


def with_password(url: str) -> str:
    params = conninfo_to_dict(url)
    params["password"] = PASSWORD  # trust authentication ignores it; it is still sent
    return make_conninfo("", **params)


@pytest.mark.needs("python-api")
def test_password_appears_in_no_repr_log_or_error(
    driver: Driver,
    make_context: MakeContext,
    database_url: str,
    rows: Rows,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level
    context = make_context(url=with_password(database_url), **LEASE)
    assert PASSWORD not in repr(context) and PASSWORD not in str(context)

    held = driver.hold(context, ["lease"])
    with pytest.raises(LockNotAcquiredError) as refused:
        driver.hold(make_context(url=with_password(database_url), **LEASE), ["lease"])
    rows.steal(lease_key(context.lock_key))  # a loss, so its warnings are logged too
    assert held.wait_lease_lost(timeout=10.0)
    with pytest.raises(LeaseLostError) as lost:
        held.release()

    unreachable = make_context(
        url=f"postgresql://app:{PASSWORD}@127.0.0.1:1/app",
        connect_patience_seconds=0.3,  # refusals are retried (and logged) before failing
        **LEASE,
    )
    with pytest.raises(psycopg.OperationalError) as failed:
        driver.hold(unreachable, ["lease"])

    texts = [caplog.text, str(refused.value), str(lost.value), str(failed.value)]
    assert all(PASSWORD not in text for text in texts)
    assert "lost" in caplog.text  # the logs did cover the interesting part

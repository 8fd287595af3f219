"""Contract: an error text that quotes the database URL never shows its password,
neither in the renewal's warnings nor in the lost lease's reason (its last error)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LeaseLostError, LockContext
from tests.support.drivers import Driver
from tests.support.herd import PASSWORD, limited_role

MakeContext = Callable[..., LockContext]


@pytest.fixture
def url_with_password(
    db: psycopg.Connection[Any], database_url: str, lock_table: tuple[str, str]
) -> Iterator[str]:
    with limited_role(db, database_url, lock_table, 10) as url:
        assert PASSWORD in url
        yield url


def refuse_updates_quoting(db: psycopg.Connection[Any], table: tuple[str, str], text: str) -> None:
    """From now on every UPDATE of ``table`` (a renewal, a release) fails with an error
    whose message quotes ``text``, as a trigger or a server may quote anything."""
    schema = sql.Identifier(table[0])
    db.execute(
        sql.SQL(
            "CREATE FUNCTION {}.refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'renewal refused for %', {}; END $$"
        ).format(schema, sql.Literal(text))
    )
    db.execute(
        sql.SQL(
            "CREATE TRIGGER refuse BEFORE UPDATE ON {} FOR EACH ROW EXECUTE FUNCTION {}.refuse()"
        ).format(sql.Identifier(*table), schema)
    )


def test_a_failing_renewal_quoting_the_url_is_scrubbed(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    url_with_password: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="dislock")
    context = make_context(url=url_with_password, run_ttl_seconds=1.5, lease_interval_seconds=0.2)
    held = driver.hold(context, ["lease"])
    refuse_updates_quoting(db, lock_table, url_with_password)
    # Every renewal now fails, so the lease is lost at its deadline, with the last
    # error as its reason.  Generous: a loaded machine.
    assert held.wait_lease_lost(timeout=30.0)
    with pytest.raises(LeaseLostError) as lost:
        held.release()
    # The Python API's reason and logs; the wrapper's stderr (its LeaseLostError here).
    said = f"{caplog.text}\n{lost.value}\n{lost.value.reason or ''}"
    assert "renewal refused for" in said  # the error did get through
    assert "renewal of" in said and "failed" in said  # in the renewal's warning
    assert "last error" in said  # and in the loss's reason
    assert "***" in said
    assert PASSWORD not in said

"""``dislockctl fence`` under grants: a team's role guards only tables it owns, and only
by keys of its grant; its own lease's token then writes through the guard, which needs
no right on the lock table from the writer."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LeaseLock, LockContext, set_fencing_token
from tests.security.conftest import BILLING_ROLE, Fleet, ctl


def test_a_team_fences_its_own_tables_by_its_own_keys(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    status, _, err = ctl(fleet.admin_url, "init", "--fencing", table=fleet.table)
    assert status == 0, err
    # The grant again, as the docs say after init --fencing: it covers the new column.
    billing = ("--keys", "billing-*", "--keys", "reports-nightly")
    status, _, err = ctl(fleet.admin_url, "grant", BILLING_ROLE, *billing, table=fleet.table)
    assert status == 0, err
    schema = fleet.table[0]
    mine, theirs = f"{schema}.billing_out", f"{schema}.admin_out"
    for name in (mine, theirs):
        db.execute(sql.SQL("CREATE TABLE {} (body text)").format(sql.SQL(name)))
    db.execute(
        sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.SQL(mine), sql.Identifier(BILLING_ROLE))
    )

    status, out, err = ctl(
        fleet.billing, "fence", mine, "--key", "billing-export", table=fleet.table
    )
    assert status == 0, err
    assert out.startswith(f"fenced {mine}: a write commits only with the fencing token")
    status, _, err = ctl(fleet.billing, "fence", mine, "--key", "reports-daily", table=fleet.table)
    assert status == 1
    assert "may not fence by 'reports-daily': its grant covers billing-*" in err
    status, _, err = ctl(
        fleet.billing, "fence", theirs, "--key", "billing-export", table=fleet.table
    )
    assert status == 1 and "does not own table" in err
    status, _, err = ctl(
        fleet.admin_url, "fence", theirs, "--key", "reports-daily", table=fleet.table
    )
    assert status == 0, err  # the lock table's owner fences by any key

    context = LockContext(
        url=fleet.billing,
        table_parts=list(fleet.table),
        lock_key="billing-export",
        owner="billing-machine",
        fencing=True,
        run_ttl_seconds=30.0,
        lease_interval_seconds=5.0,
    )
    insert = sql.SQL("INSERT INTO {} VALUES ('x')").format(sql.SQL(mine))
    with LeaseLock(context) as lock, fleet.connect(fleet.billing) as conn:
        assert lock.fence is not None
        with conn.transaction():
            set_fencing_token(conn, lock.fence)
            conn.execute(insert)
        no_token = pytest.raises(psycopg.Error, match="carries no fencing token")
        with no_token as refused, conn.transaction():
            conn.execute(insert)
        assert refused.value.sqlstate == "FENCE"
    assert db.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(mine))).fetchone() == (1,)

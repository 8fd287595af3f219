"""A hostile team against another on one lock table (#61): billing (B) against reports
(A), each with only what its grant gives.  Nothing B can attach, set or lock changes
what A's functions decide or how long they wait: the fence guard runs only where
``fence`` put it and holds no row lock (N1), no session setting skips it (N4), the key
quota waits on no lock B can take (N3), and no grant takes a group's slots (N7)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LeaseLock, set_fencing_token
from dislock.core.fencing import guard_function
from dislock.core.key_quota import QUOTA_KEY_PREFIX
from dislock.core.protocol import call
from dislock.core.rows import lease_key, pause_key
from tests.security.conftest import BILLING_ROLE, GRANTS, REPORTS_ROLE, Fleet, ctl
from tests.security.test_roles import context

KEY = "reports-daily"
"""A's key, which B's grant does not cover."""

DEADLINE = "lock_timeout = '20s'"
"""How long a step of A's may wait for a lock: none of them should wait at all."""


@pytest.fixture
def fenced(fleet: Fleet, db: psycopg.Connection[Any]) -> Iterator[tuple[int, sql.Identifier]]:
    """The guard's functions installed, A's lease of ``KEY`` held with fencing, and a
    table of A's guarded by it that B may insert into: the token and the table."""
    status, _, err = ctl(fleet.admin_url, "init", "--fencing", table=fleet.table)
    assert status == 0, err
    for role in (BILLING_ROLE, REPORTS_ROLE):  # again, for the fence column
        status, _, err = ctl(fleet.admin_url, "grant", role, *GRANTS[role], table=fleet.table)
        assert status == 0, err
    table = sql.Identifier(fleet.table[0], "reports_out")
    db.execute(sql.SQL("CREATE TABLE {} (body text)").format(table))
    db.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(table, sql.Identifier(REPORTS_ROLE)))
    db.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(table, sql.Identifier(BILLING_ROLE)))
    shown = f"{fleet.table[0]}.reports_out"
    status, _, err = ctl(fleet.reports, "fence", shown, "--key", KEY, table=fleet.table)
    assert status == 0, err
    lease = context(fleet, fleet.reports, KEY, fencing=True, run_ttl_seconds=60.0)
    with LeaseLock(lease) as lock:
        assert lock.fence is not None
        yield lock.fence, table


def renew_as_a(fleet: Fleet) -> None:
    """A's renewal of its lease row, as its renewer writes it: it must not wait."""
    with fleet.connect(fleet.admin_url) as admin:
        admin.execute(f"SET {DEADLINE}")
        renewed = admin.execute(
            sql.SQL("UPDATE {} SET expire_at = expire_at WHERE key = %s").format(
                sql.Identifier(*fleet.table)
            ),
            (lease_key(KEY),),
        )
        assert renewed.rowcount == 1


# A temporary table lives in one server session: behind transaction pooling the next
# transaction may find another, or an earlier test's table of the same name.
@pytest.mark.direct_postgres
@pytest.mark.parametrize("immediate", [False, True], ids=["deferred", "immediate"])
def test_b_cannot_run_the_guard_on_a_table_of_its_own_with_as_key(
    fleet: Fleet, fenced: tuple[int, sql.Identifier], immediate: bool
) -> None:
    token, _ = fenced
    guard = guard_function(fleet.table)
    deferred = "DEFERRABLE INITIALLY DEFERRED" if not immediate else "NOT DEFERRABLE"
    with psycopg.connect(fleet.billing, prepare_threshold=None) as b:
        b.execute("CREATE TEMP TABLE mine (body text)")
        b.execute(
            sql.SQL(
                "CREATE CONSTRAINT TRIGGER dislock_fence AFTER INSERT ON pg_temp.mine "
                + deferred
                + " FOR EACH ROW EXECUTE FUNCTION {}({})"
            ).format(guard, sql.Literal(KEY))
        )
        b.commit()
        set_fencing_token(b, token)  # A's token, guessed
        with pytest.raises(psycopg.Error, match="was not attached by dislockctl fence") as no:
            b.execute("INSERT INTO pg_temp.mine VALUES ('x'); SET CONSTRAINTS ALL IMMEDIATE")
        assert no.value.sqlstate == "FENCE"
        renew_as_a(fleet)  # B's transaction, still open, holds nothing of A's


def test_an_open_transaction_after_a_guarded_write_holds_no_lock_on_the_lease(
    fleet: Fleet, fenced: tuple[int, sql.Identifier]
) -> None:
    token, table = fenced
    with psycopg.connect(fleet.billing, prepare_threshold=None) as b:
        set_fencing_token(b, token)
        b.execute(sql.SQL("INSERT INTO {} VALUES ('x')").format(table))
        b.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the check has passed: left open
        renew_as_a(fleet)
        b.rollback()


@pytest.mark.parametrize("earlier_fence", [False, True], ids=["fence", "earlier-fence"])
def test_no_setting_skips_the_guard(
    fleet: Fleet,
    fenced: tuple[int, sql.Identifier],
    db: psycopg.Connection[Any],
    earlier_fence: bool,
) -> None:
    _, table = fenced
    if earlier_fence:  # the trigger as an earlier fence made it, with its WHEN
        from dislock.core.fencing import TRIGGER, due_function

        db.execute(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(TRIGGER), table))
        db.execute(
            sql.SQL(
                "CREATE CONSTRAINT TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {}"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ({}({key}))"
                " EXECUTE FUNCTION {}({key})"
            ).format(
                sql.Identifier(TRIGGER),
                table,
                due_function(fleet.table),
                guard_function(fleet.table),
                key=sql.Literal(KEY),
            )
        )
    for url in (fleet.reports, fleet.billing):  # the table's owner, and a writer of it
        with psycopg.connect(url, prepare_threshold=None) as writer:
            writer.execute(
                "SELECT set_config('dislock.fence_due', pg_current_xact_id()::text || ':' || %s,"
                " true)",
                (KEY,),
            )
            writer.execute(sql.SQL("INSERT INTO {} VALUES ('no token')").format(table))
            with pytest.raises(psycopg.Error, match="carries no fencing token") as refused:
                writer.commit()
            assert refused.value.sqlstate == "FENCE"
    assert db.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone() == (0,)


def acquire(conn: psycopg.Connection[Any], fleet: Fleet, row: str, lock_key: str) -> bool:
    params: dict[str, Any] = {"key": row, "pause": pause_key(lock_key), "owner": "a-machine"}
    params |= {"expire_at": None, "ttl": 30.0, "fencing": False}
    found = conn.execute(call(fleet.table, "acquire", tuple(params)), params).fetchone()
    assert found is not None
    return bool(found[0])


def test_nothing_b_locks_holds_up_as_new_key(fleet: Fleet) -> None:
    quota_row = QUOTA_KEY_PREFIX + REPORTS_ROLE
    table = sql.Identifier(*fleet.table)
    with psycopg.connect(fleet.billing, prepare_threshold=None) as b:
        # What the quota waited on before, and every lock B can take on the table.
        b.execute(
            "SELECT pg_advisory_lock(hashtextextended('dislock quota ' || %s, %s::regclass::int8))",
            (REPORTS_ROLE, table.as_string(None)),
        )
        b.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(table))
        assert b.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE key = %s").format(table), (quota_row,)
        ).fetchone() == (1,)  # B sees A's quota row, but cannot lock it
        for strength in ("KEY SHARE", "SHARE", "UPDATE"):
            b.execute("SAVEPOINT lock")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                b.execute(
                    sql.SQL("SELECT FROM {} WHERE key = %s FOR " + strength).format(table),
                    (quota_row,),
                )
            b.execute("ROLLBACK TO SAVEPOINT lock")
        with fleet.connect(fleet.reports) as a:
            a.execute(f"SET {DEADLINE}")
            assert acquire(a, fleet, lease_key("reports-new"), "reports-new")


def test_no_grant_takes_a_groups_slot(fleet: Fleet) -> None:
    group = "cronjob-lock:group:reports-nightly"  # a name B's patterns match
    for row in (group, group.replace(":group:", ":group#2:")):
        refused = pytest.raises(psycopg.errors.InsufficientPrivilege, match="no grant covers")
        with fleet.connect(fleet.billing) as b, refused:
            acquire(b, fleet, row, "reports-nightly")
    with fleet.connect(fleet.admin_url) as a:  # the fleet of the table owner's role
        assert acquire(a, fleet, group, "reports-nightly")

"""Roles per key prefix (``dislockctl grant``): each role locks its own keys, and nothing
it sends by hand touches anyone else's.

Every attack runs as the attacking role over its own connection and is checked
twice: the server refused it (or it matched nothing), and the table is exactly
as it was.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import KeyNotGrantedError, LockContext
from dislock.core.failover import SCOPE_KEY_PREFIX, TIMELINE, TIMELINE_KEY, TTL_KEY_PREFIX
from tests.security.conftest import (
    BILLING,
    BILLING_ROLE,
    OPS_ROLE,
    READER_ROLE,
    REPORTS_ROLE,
    ROLES,
    Fleet,
    ctl,
    plain_writes,
    with_history,
)
from tests.support.drivers import Driver


def context(fleet: Fleet, url: str, key: str, **fields: Any) -> LockContext:
    base: dict[str, Any] = {
        "url": url,
        "table_parts": list(fleet.table),
        "lock_key": key,
        "owner": f"owner-{uuid.uuid4().hex[:8]}",
        "run_ttl_seconds": 5.0,
        "lease_interval_seconds": 1.0,
        "schedule": "0 0 1 1 *",
    }
    base.update(fields)
    return LockContext(**base)


def snapshot(fleet: Fleet) -> list[tuple[Any, ...]]:
    """Every row of the lock table, as its owner sees it."""
    with fleet.connect(fleet.admin_url) as admin:
        return admin.execute(
            sql.SQL("SELECT * FROM {} ORDER BY key").format(sql.Identifier(*fleet.table))
        ).fetchall()


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("strategies", [("schedule",), ("lease",), ("schedule", "lease")])
def test_a_wrapper_role_locks_its_own_keys(
    driver: Driver, fleet: Fleet, strategies: tuple[str, ...]
) -> None:
    key = unique("billing-")
    holding = driver.hold(context(fleet, fleet.billing, key), strategies)
    try:
        with fleet.connect(fleet.admin_url) as admin:
            held = admin.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE key LIKE %s AND expire_at > NOW()").format(
                    sql.Identifier(*fleet.table)
                ),
                (f"cronjob-lock:%:{key}",),
            ).fetchone()
        assert held is not None and held[0] == len(strategies)
    finally:
        holding.release()


def test_a_wrapper_role_takes_its_keys_further_slots(fleet: Fleet) -> None:
    """A lease's second slot is a row of its own (``cronjob-lock:lease#2:<key>``),
    which the role's policies admit by its regular expression."""
    from dislock import LeaseLock, LockNotAcquiredError

    key = unique("billing-")

    def lease() -> LeaseLock:
        return LeaseLock(context(fleet, fleet.billing, key, slots=2))

    with lease(), lease():
        rows = {row[0] for row in snapshot(fleet) if row[0].endswith(key)}
        assert rows == {f"cronjob-lock:lease:{key}", f"cronjob-lock:lease#2:{key}"}
        with pytest.raises(LockNotAcquiredError), lease():
            pass


def test_a_key_outside_the_grant_is_one_line_and_writes_nothing(
    driver: Driver, fleet: Fleet
) -> None:
    before = snapshot(fleet)
    key = unique("payroll-")
    for strategies in (("schedule",), ("lease",)):
        with pytest.raises((KeyNotGrantedError, RuntimeError)) as refused:
            driver.hold(context(fleet, fleet.billing, key), strategies).release()
        message = str(refused.value)
        # The lock key and the strategy, as LOCK_KEY and LOCK_STRATEGY name them: never
        # the row key ('cronjob-lock:lease:…'), which no operator typed.
        assert (
            f"role '{BILLING_ROLE}' may not lock {key!r} (strategy {strategies[0]})"
            f" in {'.'.join(fleet.table)}: no grant covers that key"
        ) in message, message
        assert "cronjob-lock:" not in message, message
        if driver.name == "cli":
            assert "exited 1" in message and "Traceback" not in message, message
    assert snapshot(fleet) == before


def test_another_roles_live_lock_is_neither_seen_nor_taken(fleet: Fleet) -> None:
    from dislock import LeaseLock

    key = unique("reports-")
    with LeaseLock(context(fleet, fleet.reports, key)):
        before = snapshot(fleet)
        # Never "held by another owner": the key is not theirs to ask about.
        with pytest.raises(KeyNotGrantedError), LeaseLock(context(fleet, fleet.billing, key)):
            pass
        with fleet.connect(fleet.billing) as billing:
            seen = billing.execute(
                sql.SQL("SELECT key FROM {} WHERE key LIKE %s").format(
                    sql.Identifier(*fleet.table)
                ),
                (f"%{key}",),
            ).fetchall()
        assert seen == []
        assert snapshot(fleet) == before


def test_replacing_needs_the_grant_that_running_the_key_needs(fleet: Fleet) -> None:
    """Another team's run cannot be replaced (nor its row marked); a run of a key two
    roles may both lock can be replaced by either."""
    import threading

    from dislock import LeaseLock, LeaseLostError

    key = unique("reports-")
    with LeaseLock(context(fleet, fleet.reports, key)) as held:
        before = snapshot(fleet)
        with (
            pytest.raises(KeyNotGrantedError),
            LeaseLock(context(fleet, fleet.billing, key, replace=True)),
        ):
            pass
        assert snapshot(fleet) == before
        assert not held.lease_lost.is_set()

    # reports-nightly is billing's too: its run by reports is billing's to replace.
    held = LeaseLock(context(fleet, fleet.reports, "reports-nightly"))
    held.__enter__()
    replacer = LeaseLock(context(fleet, fleet.billing, "reports-nightly", replace=True))
    taking = threading.Thread(target=replacer.__enter__)
    taking.start()
    try:
        assert held.lease_lost.wait(30)
        assert held.lost_reason is not None
        assert f"replaced by {replacer.context.owner} on " in held.lost_reason
    finally:
        with pytest.raises(LeaseLostError):  # and, its block over, hands the lease over
            held.__exit__(None, None, None)
        taking.join(60)
    assert replacer.holding
    replacer.__exit__(None, None, None)


ATTACKS = [
    # (what, statement; {t} is the table, {k} a key of the other team's, {own} one of
    # billing's and ops', {reports_ttl} the key of reports' TTL record)
    (
        "steal another key's row",
        "UPDATE {t} SET value = 'thief', expire_at = NOW() + interval '1 hour' WHERE key = {k}",
    ),
    (
        "release another key's row",
        "UPDATE {t} SET expire_at = NOW() WHERE key = {k}",
    ),
    (
        "delete another key's row",
        "DELETE FROM {t} WHERE key = {k}",
    ),
    (
        "delete any row",
        "DELETE FROM {t}",
    ),
    (
        "lock another key's row",
        "SELECT * FROM {t} WHERE key = {k} FOR UPDATE",
    ),
    (
        "lock the whole table",
        "LOCK TABLE {t} IN EXCLUSIVE MODE",
    ),
    (
        "truncate the table",
        "TRUNCATE {t}",
    ),
    (
        "alter the table",
        "ALTER TABLE {t} ADD COLUMN evil text",
    ),
    (
        "turn row-level security off",
        "ALTER TABLE {t} DISABLE ROW LEVEL SECURITY",
    ),
    (
        "pause another key",
        "INSERT INTO {t} VALUES ('cronjob-lock:pause:reports-x', 'evil', NOW() + interval '1 day')",
    ),
    (
        "pause its own key",
        "INSERT INTO {t} VALUES ('cronjob-lock:pause:billing-x', 'evil', NOW() + interval '1 day')",
    ),
    (
        "forge the failover timeline",
        "UPDATE {t} SET value = '999' WHERE key = 'dislock:failover:timeline'",
    ),
    (
        "start a lock delay",
        "UPDATE {t} SET expire_at = NOW() + interval '7 days' WHERE key = "
        "'dislock:failover:timeline'",
    ),
    (
        "insert a forged timeline",
        "INSERT INTO {t} VALUES ('dislock:failover:timeline', '999', NOW()) ON CONFLICT "
        "(key) DO UPDATE SET value = '999'",
    ),
    (
        "write another role's TTL record",
        "INSERT INTO {t} VALUES ({reports_ttl}, '1', NOW() + interval '1 hour')",
    ),
    (
        "raise its own TTL record past the maximum",
        "INSERT INTO {t} VALUES ('dislock:failover:ttl:' || current_user, '604800', NOW() "
        "+ interval '1 hour') ON CONFLICT (key) DO UPDATE SET value = '604800'",
    ),
    (
        "lower another role's TTL record",
        "UPDATE {t} SET value = '0' WHERE key = {reports_ttl}",
    ),
    (
        "change the maximum TTL",
        "INSERT INTO {t} VALUES ('dislock:config:max-ttl', '604800', '9999-12-31') ON "
        "CONFLICT (key) DO UPDATE SET value = '604800'",
    ),
    (
        "a lease past the maximum TTL",
        "INSERT INTO {t} VALUES ('cronjob-lock:lease:billing-long', 'me', NOW() + "
        "interval '7 days')",
    ),
    (
        "a slot row past the maximum TTL",
        "INSERT INTO {t} VALUES ('cronjob-lock:lease#2:billing-long', 'me', NOW() + "
        "interval '7 days')",
    ),
    (
        "renew its own lease past the maximum TTL",
        "UPDATE {t} SET expire_at = NOW() + interval '7 days' WHERE key = {own}",
    ),
    (
        "take another key's slot row",
        "INSERT INTO {t} VALUES ('cronjob-lock:lease#2:reports-x', 'thief', NOW() + "
        "interval '1 minute')",
    ),
    (
        "take a key its exact pattern only begins",
        "INSERT INTO {t} VALUES ('cronjob-lock:lease:reports-nightly-2', 'thief', NOW() + "
        "interval '1 minute')",
    ),
    (
        "take over another key's expired row",
        "INSERT INTO {t} VALUES ({k}, 'thief', NOW() + interval '1 minute') ON CONFLICT "
        "(key) DO UPDATE SET value = 'thief', expire_at = EXCLUDED.expire_at",
    ),
]


OPERATOR_MAY = {"lock the whole table", "pause its own key"}
"""What an operator may do that the attacks list: it holds DELETE (for resume and
pruning), which PostgreSQL accepts for every lock mode, and it pauses its own keys."""

CASES = [
    pytest.param(role, what, statement, id=f"{role}: {what}")
    for role in ("billing", "ops", "reader")
    for what, statement in ATTACKS
    if not (role == "ops" and what in OPERATOR_MAY)
]


@pytest.mark.parametrize(("role", "what", "statement"), CASES)
def test_a_role_cannot(fleet: Fleet, role: str, what: str, statement: str) -> None:
    victim = "cronjob-lock:lease:reports-victim"
    own = "cronjob-lock:lease:billing-own"  # a key of billing's and ops' grants
    rows = [(victim, "- interval '1 second'")]
    if "{own}" in statement:  # (else ops' "delete any row" could rightly delete it)
        rows.append((own, "+ interval '1 minute'"))
    with fleet.connect(fleet.admin_url) as admin:
        for row, ends in rows:
            admin.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, 'held', NOW() {})").format(
                    sql.Identifier(*fleet.table), sql.SQL(ends)
                ),
                (row,),
            )
        # Another role took a lease once: its TTL record exists, as in any fleet.
        admin.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, '30', '9999-12-31')").format(
                sql.Identifier(*fleet.table)
            ),
            (TTL_KEY_PREFIX + REPORTS_ROLE,),
        )
    # The grant recorded the timeline row: every attack on it meets it.
    before = snapshot(fleet)
    text = sql.SQL(statement).format(
        t=sql.Identifier(*fleet.table),
        k=sql.Literal(victim),
        own=sql.Literal(own),
        reports_ttl=sql.Literal(TTL_KEY_PREFIX + REPORTS_ROLE),
    )
    with fleet.connect(getattr(fleet, role)) as attacker:
        try:
            with attacker.transaction():  # LOCK TABLE holds only inside one
                cursor = attacker.execute(text)
                # Or it found nothing it may touch.
                assert cursor.rowcount in (0, -1), f"{what}: {cursor.rowcount} rows"
                if cursor.description is not None:
                    assert cursor.fetchall() == [], what
        except psycopg.errors.InsufficientPrivilege:
            pass  # refused outright
    assert snapshot(fleet) == before, what


def test_the_operator_acts_within_its_keys_only(fleet: Fleet) -> None:
    mine, theirs = unique("billing-"), unique("reports-")
    for key in (mine, theirs):
        status, _, err = ctl(fleet.ops, "pause", key, "--for", "1h", table=fleet.table)
        assert (status == 0) == (key == mine), err
        if key == theirs:
            assert err.count("\n") == 1 and "Traceback" not in err, err
    status, _, err = ctl(fleet.ops, "resume", mine, table=fleet.table)
    assert status == 0, err
    with fleet.connect(fleet.admin_url) as admin:
        pauses = admin.execute(
            sql.SQL("SELECT key FROM {} WHERE key LIKE 'cronjob-lock:pause:%%'").format(
                sql.Identifier(*fleet.table)
            )
        ).fetchall()
    assert pauses == []


def test_a_wrapper_pausing_its_own_key_is_told_the_operators_grant(fleet: Fleet) -> None:
    """Not to grant UPDATE (a table-wide UPDATE is what grant refuses as a loophole):
    the dislockctl grant that makes it an operator, with the keys it has, since a
    grant replaces the role's earlier one."""
    before = snapshot(fleet)
    status, _, err = ctl(fleet.billing, "pause", unique("billing-"), table=fleet.table)
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("dislockctl: error: pause: permission denied: INSERT and UPDATE on"), err
    assert err.endswith(
        f" for role {BILLING_ROLE} (row-level security is on: as the table's owner,"
        f" dislockctl URL_VARIABLE grant {BILLING_ROLE} --operator --keys 'billing-*'"
        " --keys 'reports-nightly', see docs/security.md)\n"
    ), err
    assert snapshot(fleet) == before


def test_a_role_without_a_grant_is_told_the_readers(fleet: Fleet) -> None:
    status, _, err = ctl(fleet.admin_url, "revoke", READER_ROLE, table=fleet.table)
    assert status == 0, err
    status, _, err = ctl(fleet.reader, "ls", table=fleet.table)
    assert status == 1
    assert err == (
        f"dislockctl: error: ls: permission denied: SELECT on table {'.'.join(fleet.table)}"
        f" for role {READER_ROLE} (row-level security is on: as the table's owner,"
        f" dislockctl URL_VARIABLE grant {READER_ROLE} --reader, see docs/security.md)\n"
    )


def test_a_wrapper_role_without_a_grant_is_told_the_grant_of_its_key(fleet: Fleet) -> None:
    import subprocess

    from tests.support.drivers import CliDriver

    status, _, err = ctl(fleet.admin_url, "revoke", REPORTS_ROLE, table=fleet.table)
    assert status == 0, err
    key = unique("reports-")
    result = subprocess.run(
        [*CliDriver.command(), CliDriver.url_variable, "true"],
        env=CliDriver.environment(context(fleet, fleet.reports, key), ("lease",)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dislock: error: permission denied: "), lines[0]
    assert lines[0].endswith(
        f" for role {REPORTS_ROLE} (row-level security is on: as the table's owner,"
        f" dislockctl URL_VARIABLE grant {REPORTS_ROLE} --keys '{key}',"
        " see docs/security.md)"
    ), lines[0]


def test_a_release_outside_the_grant_says_the_row_may_exist(fleet: Fleet) -> None:
    """Row-level security hides another team's row: "no row" would read as a typo."""
    from dislock import LeaseLock

    table = ".".join(fleet.table)
    theirs = unique("reports-")
    with LeaseLock(context(fleet, fleet.reports, theirs)):
        before = snapshot(fleet)
        status, out, err = ctl(fleet.ops, "release", theirs, table=fleet.table)
        assert status == 1, out
        assert err == (
            f"dislockctl: error: no schedule or lease lock row for {theirs!r} that role"
            f" '{OPS_ROLE}' may see in {table}: the row may exist, but no grant of that"
            " role covers the key (row-level security; dislockctl URL_VARIABLE grants lists"
            " the grants)\n"
        )
        assert snapshot(fleet) == before
    # A key its grant covers: no row there is no row.
    mine = unique("billing-")
    status, _, err = ctl(fleet.ops, "release", mine, table=fleet.table)
    assert status == 1
    assert err == (
        f"dislockctl: error: no schedule or lease lock row for {mine!r} in {table}"
        " (see dislockctl ls)\n"
    )


def test_the_reader_reads_everything_and_writes_nothing(fleet: Fleet) -> None:
    from dislock import LeaseLock

    key = unique("reports-")
    with LeaseLock(context(fleet, fleet.reports, key)):
        status, out, err = ctl(fleet.reader, "ls", "--json", table=fleet.table)
        assert status == 0, err
        assert [row["lock_key"] for row in json.loads(out)] == [key]
        before = snapshot(fleet)
        status, _, err = ctl(fleet.reader, "release", key, table=fleet.table)
        assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
        status, _, err = ctl(fleet.reader, "pause", key, table=fleet.table)
        assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
        assert snapshot(fleet) == before


def test_grants_lists_and_revoke_removes(fleet: Fleet) -> None:
    status, out, err = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
    assert status == 0, err
    listed = json.loads(out)
    assert listed["row_level_security"] is True
    assert listed["max_ttl_seconds"] == 3600
    by_role = {g["role"]: (g["access"], g["keys"]) for g in listed["grants"]}
    assert by_role == {
        BILLING_ROLE: ("wrapper", ["billing-*", "reports-nightly"]),
        REPORTS_ROLE: ("wrapper", ["reports-*"]),
        OPS_ROLE: ("operator", ["billing-*"]),
        READER_ROLE: ("reader", []),
    }
    status, _, err = ctl(fleet.admin_url, "revoke", REPORTS_ROLE, table=fleet.table)
    assert status == 0, err
    with pytest.raises(psycopg.errors.InsufficientPrivilege), fleet.connect(fleet.reports) as r:
        r.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(*fleet.table)))


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["grant", BILLING_ROLE], "--keys PATTERN"),
        (["grant", BILLING_ROLE, "--keys", "a*b"], "prefix ending in '*'"),
        (["grant", BILLING_ROLE, "--reader", "--keys", "x"], "drop --keys"),
        (["grant", "no_such_role_here", "--keys", "x"], "does not exist"),
    ],
)
def test_bad_grants_are_one_line(fleet: Fleet, arguments: list[str], expected: str) -> None:
    status, _, err = ctl(fleet.admin_url, *arguments, table=fleet.table)
    assert status in (1, 2) and expected in err and err.count("\n") == 1, err


def test_grant_prints_its_sql_for_migrations(fleet: Fleet) -> None:
    status, out, err = ctl(
        fleet.admin_url,
        "grant",
        REPORTS_ROLE,
        "--keys",
        "x-*",
        "--print-sql",
        table=fleet.table,
    )
    assert status == 0, err
    assert "ENABLE ROW LEVEL SECURITY" in out and "CREATE POLICY" in out
    # Nothing ran: the role's grant is still the fixture's.
    status, out, _ = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
    keys = {g["role"]: g["keys"] for g in json.loads(out)["grants"]}
    assert keys[REPORTS_ROLE] == ["reports-*"]


def test_a_wrapper_role_records_its_runs(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    from dislock import acquire_locks

    runs = with_history(fleet, db, BILLING)
    plain_writes(fleet, BILLING_ROLE)  # by hand, not only through the history functions
    key = unique("billing-")
    with acquire_locks(context(fleet, fleet.billing, key, history=True), strategies=("lease",)):
        pass
    recorded = db.execute(
        sql.SQL("SELECT outcome FROM {} WHERE lock_key = %s").format(sql.Identifier(*runs)),
        (key,),
    ).fetchall()
    assert recorded == [("ok",)]
    with fleet.connect(fleet.billing) as billing:
        changed = billing.execute(
            sql.SQL("UPDATE {} SET outcome = 'failed' WHERE lock_key NOT LIKE 'billing-%%'").format(
                sql.Identifier(*runs)
            )
        )
        assert changed.rowcount == 0


def test_a_wrapper_role_can_neither_number_a_run_nor_rewrite_a_finished_one(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    from dislock import acquire_locks

    runs = with_history(fleet, db, BILLING)
    plain_writes(fleet, BILLING_ROLE)  # by hand, not only through the history functions
    table = sql.Identifier(*runs)
    with fleet.connect(fleet.billing) as billing:
        # Taking the next ids would make other teams' runs fail to record; taking the
        # largest would stop the run counters of every key.
        for forged in ("(SELECT max(id) + 1 FROM {table})", "9223372036854775000"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                billing.execute(
                    sql.SQL(
                        "INSERT INTO {table} (id, lock_key, modes, owner, host, pid, started_at)"
                        " OVERRIDING SYSTEM VALUE"
                        " VALUES (" + forged + ", 'billing-x', 'lease', 'o', 'h', 1, NOW())"
                    ).format(table=table)
                )
    key = unique("billing-")
    with acquire_locks(context(fleet, fleet.billing, key, history=True), strategies=("lease",)):
        pass
    with fleet.connect(fleet.billing) as billing:
        rewritten = billing.execute(
            sql.SQL("UPDATE {} SET outcome = 'failed', exit_code = 1 WHERE lock_key = %s").format(
                table
            ),
            (key,),
        )
        assert rewritten.rowcount == 0
    recorded = db.execute(
        sql.SQL("SELECT outcome, exit_code FROM {} WHERE lock_key = %s").format(table), (key,)
    ).fetchall()
    assert recorded == [("ok", None)]  # an API run has no exit status
    assert db.execute(sql.SQL("SELECT max(id) < 1000 FROM {}").format(table)).fetchone() == (True,)


def test_the_ttl_record_key_is_the_roles_own(fleet: Fleet) -> None:
    from dislock import LeaseLock

    with LeaseLock(context(fleet, fleet.billing, unique("billing-"), run_ttl_seconds=7.0)):
        pass
    with fleet.connect(fleet.admin_url) as admin:
        records = admin.execute(
            sql.SQL("SELECT key, value FROM {} WHERE starts_with(key, %s)").format(
                sql.Identifier(*fleet.table)
            ),
            (TTL_KEY_PREFIX,),
        ).fetchall()
        timeline = admin.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE key = %s").format(sql.Identifier(*fleet.table)),
            (TIMELINE_KEY,),
        ).fetchone()
    assert records == [(TTL_KEY_PREFIX + BILLING_ROLE, "7")]
    assert timeline == (1,)


def test_without_grants_the_same_attack_goes_through(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """The control: with the broad grant every fleet had before roles (SELECT, INSERT,
    UPDATE, no row-level security), the checks above do see a stolen row."""
    victim = "cronjob-lock:lease:reports-victim"
    table = sql.Identifier(*fleet.table)
    db.execute(sql.SQL("ALTER TABLE {} DISABLE ROW LEVEL SECURITY").format(table))
    db.execute(
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(
            table, sql.Identifier(BILLING_ROLE)
        )
    )
    db.execute(sql.SQL("INSERT INTO {} VALUES (%s, 'victim', NOW())").format(table), (victim,))
    before = snapshot(fleet)
    with fleet.connect(fleet.billing) as attacker:
        stolen = attacker.execute(
            sql.SQL("UPDATE {} SET value = 'thief' WHERE key = %s").format(table), (victim,)
        )
        assert stolen.rowcount == 1
    assert snapshot(fleet) != before


def noticed_failover(fleet: Fleet) -> Any:
    """Simulate a failover (the recorded timeline is not the server's): the instant
    before it, by the database clock."""
    table = sql.Identifier(*fleet.table)
    with fleet.connect(fleet.admin_url) as admin:
        admin.execute(
            sql.SQL("UPDATE {} SET value = '999' WHERE key = %s").format(table), (TIMELINE_KEY,)
        )
        before = admin.execute("SELECT NOW()").fetchone()
    assert before is not None
    return before[0]


def delayed_until(fleet: Fleet, url: str, key: str) -> Any:
    """The end of the lock delay that refuses a 2 s lease of ``key`` taken as ``url``."""
    from dislock import LeaseLock, LockDelayedError

    with (
        pytest.raises(LockDelayedError) as refused,
        LeaseLock(context(fleet, url, key, run_ttl_seconds=2.0)),
    ):
        pass
    return refused.value.until


def test_after_a_failover_each_team_waits_for_its_own_longest_ttl(fleet: Fleet) -> None:
    """#35 item 4: billing's 30 s leases hold up billing's keys after a failover, and
    the keys its grant shares with reports (``reports-nightly``), but not reports'
    other keys, which wait for reports' own longest TTL.  The policies let the
    bookkeeping through, and the timeline is recorded with the instant it was noticed."""
    from dislock import LeaseLock, ScheduleLock

    table = sql.Identifier(*fleet.table)
    with LeaseLock(context(fleet, fleet.billing, unique("billing-"), run_ttl_seconds=30.0)):
        pass
    with LeaseLock(context(fleet, fleet.reports, unique("reports-"), run_ttl_seconds=2.0)):
        pass
    before = noticed_failover(fleet)
    reports_key, billing_key = unique("reports-"), unique("billing-")
    reports_until = delayed_until(fleet, fleet.reports, reports_key)
    billing_until = delayed_until(fleet, fleet.billing, billing_key)
    shared_until = delayed_until(fleet, fleet.reports, "reports-nightly")
    with fleet.connect(fleet.admin_url) as admin:
        recorded = admin.execute(
            sql.SQL("SELECT value, expire_at FROM {} WHERE key = %s").format(table),
            (TIMELINE_KEY,),
        ).fetchone()
    assert recorded is not None and recorded[0] != "999"
    noticed = recorded[1]
    assert before <= noticed
    # One instant, the notice; each key's delay from it.
    assert reports_until - noticed == timedelta(seconds=2)
    assert billing_until - noticed == timedelta(seconds=30)
    assert shared_until - noticed == timedelta(seconds=30)
    # Once reports' 2 s have passed, its keys are taken; billing's still wait.
    with fleet.connect(fleet.admin_url) as admin:
        wait = admin.execute("SELECT %s - clock_timestamp()", (reports_until,)).fetchone()
    assert wait is not None
    time.sleep(max(0.0, wait[0].total_seconds()) + 0.2)
    with LeaseLock(context(fleet, fleet.reports, reports_key, run_ttl_seconds=2.0)):
        pass
    assert delayed_until(fleet, fleet.billing, billing_key) == billing_until
    with ScheduleLock(context(fleet, fleet.reports, unique("reports-"))):
        pass  # a schedule slot of reports' too


def test_a_record_of_a_role_without_a_grant_counts_for_every_key(fleet: Fleet) -> None:
    """The table's owner (or any role ``dislockctl grant`` did not scope) may hold any
    key: its longest TTL holds up every team's keys after a failover."""
    from dislock import LeaseLock

    with LeaseLock(context(fleet, fleet.admin_url, unique("admin-"), run_ttl_seconds=20.0)):
        pass
    with LeaseLock(context(fleet, fleet.reports, unique("reports-"), run_ttl_seconds=2.0)):
        pass
    before = noticed_failover(fleet)
    until = delayed_until(fleet, fleet.reports, unique("reports-"))
    assert timedelta(seconds=20) <= until - before <= timedelta(seconds=20 + 60)


def test_a_delay_of_zero_refuses_nothing(fleet: Fleet) -> None:
    """A table that only ever held schedule slots: a new timeline starts a delay of
    zero, and the acquisition that notices it goes through (it used to be refused,
    the delay's end equal to the refusal's instant)."""
    from dislock import ScheduleLock

    table = sql.Identifier(*fleet.table)
    with fleet.connect(fleet.admin_url) as admin:
        admin.execute(
            sql.SQL("UPDATE {} SET value = '999' WHERE key = %s").format(table), (TIMELINE_KEY,)
        )
    with ScheduleLock(context(fleet, fleet.billing, unique("billing-"))):
        pass
    with fleet.connect(fleet.admin_url) as admin:
        recorded = admin.execute(
            sql.SQL("SELECT value, expire_at <= NOW() FROM {} WHERE key = %s").format(table),
            (TIMELINE_KEY,),
        ).fetchone()
    assert recorded is not None and recorded[0] != "999" and recorded[1] is True


def test_no_role_can_cut_a_delay_short_after_a_failover(fleet: Fleet) -> None:
    """Right after a failover the timeline row is stale, and a granted role's acquisition
    may write it: but only as noticed now.  Noticed earlier would end every key's delay
    early, later would hold up every team; nor can a role write a scope (whose keys its
    longest TTL holds up), its own or another's."""
    from dislock import LeaseLock

    plain_writes(fleet, REPORTS_ROLE)  # by hand, not only through the lock functions
    table = sql.Identifier(*fleet.table)
    with LeaseLock(context(fleet, fleet.billing, unique("billing-"), run_ttl_seconds=30.0)):
        pass
    noticed_failover(fleet)
    before = snapshot(fleet)
    timeline = (TIMELINE_KEY,)
    forgeries: list[tuple[sql.Composed, tuple[str, ...]]] = [
        (
            sql.SQL(
                "UPDATE {} SET value = {}::text, expire_at = NOW() - interval '1 hour'"
                " WHERE key = %s"
            ).format(table, TIMELINE),
            timeline,
        ),
        (
            sql.SQL(
                "UPDATE {} SET value = {}::text, expire_at = NOW() + interval '1 hour'"
                " WHERE key = %s"
            ).format(table, TIMELINE),
            timeline,
        ),
    ]
    for role in (REPORTS_ROLE, BILLING_ROLE):
        scope = (SCOPE_KEY_PREFIX + role,)
        forgeries += [
            (sql.SQL("UPDATE {} SET value = '^$' WHERE key = %s").format(table), scope),
            (
                sql.SQL(
                    "INSERT INTO {} VALUES (%s, '^$', '9999-12-31') ON CONFLICT (key) DO UPDATE"
                    " SET value = EXCLUDED.value"
                ).format(table),
                scope,
            ),
        ]
    for forged, params in forgeries:
        with fleet.connect(fleet.reports) as attacker:
            try:
                done = attacker.execute(forged, params)
            except psycopg.errors.InsufficientPrivilege:
                continue
            assert done.rowcount == 0, forged  # no row the role may write: nothing
    assert snapshot(fleet) == before
    # Noticed now is what an acquisition writes: allowed.
    honest = sql.SQL("UPDATE {} SET value = {}::text, expire_at = NOW() WHERE key = %s").format(
        table, TIMELINE
    )
    with fleet.connect(fleet.reports) as reports:
        assert reports.execute(honest, (TIMELINE_KEY,)).rowcount == 1


def test_a_grant_that_public_privileges_would_undo_is_refused(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    table = sql.Identifier(*fleet.table)
    db.execute(sql.SQL("GRANT UPDATE, TRUNCATE ON {} TO PUBLIC").format(table))
    try:
        status, _, err = ctl(
            fleet.admin_url, "grant", REPORTS_ROLE, "--keys", "x-*", table=fleet.table
        )
        assert status == 1 and err.count("\n") == 1, err
        assert "UPDATE, TRUNCATE" in err and "nothing was granted" in err, err
        status, out, _ = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
        keys = {g["role"]: g["keys"] for g in json.loads(out)["grants"]}
        assert keys[REPORTS_ROLE] == ["reports-*"]  # the earlier grant stands
    finally:
        db.execute(sql.SQL("REVOKE UPDATE, TRUNCATE ON {} FROM PUBLIC").format(table))


def test_grants_audits_privileges_granted_by_hand(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """``grants`` exits 1 while any role can get around its policies: a table-wide
    privilege given by hand after ``grant`` (LOCK TABLE … EXCLUSIVE, TRUNCATE), to a
    granted role or to one without a grant."""
    table = sql.Identifier(*fleet.table)
    name = ".".join(fleet.table)
    status, out, err = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
    assert (status, json.loads(out)["loopholes"]) == (0, []), err
    db.execute(sql.SQL("GRANT UPDATE ON {} TO {}").format(table, sql.Identifier(BILLING_ROLE)))
    db.execute(sql.SQL("GRANT TRUNCATE, DELETE ON {} TO PUBLIC").format(table))
    try:
        with fleet.connect(fleet.billing) as billing, billing.transaction():
            billing.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table))
        status, out, err = ctl(fleet.admin_url, "grants", table=fleet.table)
        assert status == 1, (out, err)
        quoted = sql.Identifier(*fleet.table).as_string(None)

        def line(role: str, held: str) -> str:
            return (
                f"loophole: role '{role}' has {held} on {name}, which no policy limits:"
                f' REVOKE {held} ON {quoted} FROM "{role}" (or take it from the role or'
                " PUBLIC it comes through)"
            )

        # PUBLIC reaches every role of the cluster: on a server shared with other
        # tests (another xdist worker's fleet, a role a test makes for a moment) the
        # audit rightly lists those too.  This fleet's lines are checked exactly, and
        # every other line says what PUBLIC gave that role.
        holes: list[tuple[str, str]] = []
        others: list[tuple[str, str]] = []
        for found in out.splitlines():
            if found.startswith("loophole: "):
                role = found.split("'")[1]
                (holes if role in ROLES else others).append((role, found))
        for role, found in others:
            assert found.startswith(f"loophole: role '{role}' has TRUNCATE, DELETE"), out
            assert f'FROM "{role}"' in found, out
        assert [found for _, found in holes] == [
            line(BILLING_ROLE, "UPDATE, TRUNCATE, DELETE"),
            # The operator holds DELETE on purpose: only TRUNCATE is a loophole for it.
            line(OPS_ROLE, "TRUNCATE"),
            line(READER_ROLE, "TRUNCATE, DELETE"),
            line(REPORTS_ROLE, "TRUNCATE, DELETE"),
        ], out
        # Each fix runs as printed (here in a transaction rolled back).
        fix = holes[0][1].split("limits: ")[1].split(" (or take")[0]
        with db.transaction(force_rollback=True):
            db.execute(fix)
        status, out, _ = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
        assert status == 1
        assert {h["role"]: h["privileges"] for h in json.loads(out)["loopholes"]}[BILLING_ROLE] == [
            "UPDATE",
            "TRUNCATE",
            "DELETE",
        ]
    finally:
        db.execute(sql.SQL("REVOKE TRUNCATE, DELETE ON {} FROM PUBLIC").format(table))
        db.execute(
            sql.SQL("REVOKE UPDATE ON {} FROM {}").format(table, sql.Identifier(BILLING_ROLE))
        )
    status, out, err = ctl(fleet.admin_url, "grants", table=fleet.table)
    assert status == 0 and "loophole" not in out, (out, err)


def test_bypassrls_is_a_loophole_only_on_a_table_the_role_may_touch(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """A cluster's other BYPASSRLS roles (an admin's, a tool's) are not this table's
    business until they hold a privilege on it."""
    role = f"dislock_sec_bypass_{uuid.uuid4().hex[:6]}"
    db.execute(sql.SQL("CREATE ROLE {} BYPASSRLS").format(sql.Identifier(role)))
    try:
        status, out, _ = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
        assert (status, json.loads(out)["loopholes"]) == (0, [])
        db.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                sql.Identifier(*fleet.table), sql.Identifier(role)
            )
        )
        status, out, _ = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
        assert status == 1
        assert json.loads(out)["loopholes"] == [
            {"role": role, "privileges": ["BYPASSRLS"], "table": ".".join(fleet.table)}
        ]
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_serve_counts_the_loopholes_as_the_reader_role_sees_them(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    from dislock.cli.serve.fleet_reader import FleetReader
    from dislock.cli.serve.metrics import metric_families

    runs = with_history(fleet, db, (READER_ROLE, "--reader"))
    reader = FleetReader(fleet.reader, fleet.table, runs)

    def loopholes() -> list[tuple[tuple[str, ...], float]]:
        families = metric_families(reader.snapshot())
        (family,) = [f for f in families if f.name == "dislock_grant_loopholes"]
        return list(family.samples)

    try:
        assert loopholes() == [((), 0.0)]
        db.execute(
            sql.SQL("GRANT UPDATE ON {} TO {}").format(
                sql.Identifier(*fleet.table), sql.Identifier(REPORTS_ROLE)
            )
        )
        assert loopholes() == [((), 1.0)]
    finally:
        reader.close()


def test_maintain_is_a_loophole_where_the_server_has_it(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """PostgreSQL 17's MAINTAIN lets a member of pg_maintain take LOCK TABLE … ACCESS
    EXCLUSIVE: ``grant`` refuses such a role and ``grants`` lists it.  Older servers have
    no such privilege, and the audit must not trip over the word."""
    version = int(db.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]
    if version < 170000:
        status, out, err = ctl(fleet.admin_url, "grants", table=fleet.table)
        assert status == 0 and "loophole" not in out, (out, err)
        return
    db.execute(sql.SQL("GRANT pg_maintain TO {}").format(sql.Identifier(REPORTS_ROLE)))
    try:
        status, out, _ = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
        assert status == 1
        assert json.loads(out)["loopholes"] == [
            {"role": REPORTS_ROLE, "privileges": ["MAINTAIN"], "table": ".".join(fleet.table)}
        ]
        status, _, err = ctl(
            fleet.admin_url, "grant", REPORTS_ROLE, "--keys", "x-*", table=fleet.table
        )
        assert status == 1 and "MAINTAIN" in err and "nothing was granted" in err, err
    finally:
        db.execute(sql.SQL("REVOKE pg_maintain FROM {}").format(sql.Identifier(REPORTS_ROLE)))


def test_patterns_may_hold_any_character(fleet: Fleet) -> None:
    from dislock import LeaseLock

    pattern = "ünï_(c%de|x)\\.*"
    status, _, err = ctl(
        fleet.admin_url, "grant", REPORTS_ROLE, "--keys", pattern, table=fleet.table
    )
    assert status == 0, err
    with LeaseLock(context(fleet, fleet.reports, "ünï_(c%de|x)\\.nightly")):
        pass
    # The pattern is literal: a key that only a regular expression or a LIKE pattern
    # would match is refused.
    for key in ("ünï_x.n", "ünïx(cXYZde|x)\\.n"):
        with pytest.raises(KeyNotGrantedError), LeaseLock(context(fleet, fleet.reports, key)):
            pass


def test_a_new_maximum_ttl_holds_on_connections_already_open(fleet: Fleet) -> None:
    """The maximum is a constant in each plan the server caches (``policy_functions``):
    ``init --max-ttl`` must reach a connection whose statement is already planned."""
    plain_writes(fleet, BILLING_ROLE)  # by hand, not only through the lock functions
    key = unique("cronjob-lock:lease:billing-long-")
    statement = sql.SQL(
        "INSERT INTO {} VALUES (%s, 'me', NOW() + interval '90 minutes') ON CONFLICT (key)"
        " DO UPDATE SET expire_at = EXCLUDED.expire_at"
    ).format(sql.Identifier(*fleet.table))
    ninety_minutes = sql.SQL("UPDATE {} SET expire_at = NOW() + interval '90 minutes'").format(
        sql.Identifier(*fleet.table)
    )

    def ninety_minute_lease(conn: psycopg.Connection[Any]) -> bool:
        try:
            with conn.transaction():
                conn.execute(statement, (key,), prepare=True)
            return True
        except psycopg.errors.InsufficientPrivilege:
            return False

    with fleet.connect(fleet.billing) as billing:
        # More executions than PostgreSQL's five custom plans: the cached plan is used.
        assert not any(ninety_minute_lease(billing) for _ in range(8))
        try:
            status, _, err = ctl(fleet.admin_url, "init", "--max-ttl", "2h", table=fleet.table)
            assert status == 0, err
            assert ninety_minute_lease(billing)
            status, _, err = ctl(fleet.admin_url, "init", "--max-ttl", "1h", table=fleet.table)
            assert status == 0, err
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                billing.execute(ninety_minutes + sql.SQL(" WHERE key = %s"), (key,), prepare=True)
        finally:
            ctl(fleet.admin_url, "init", "--max-ttl", "1h", table=fleet.table)


def test_the_operator_reruns_its_keys_slots_only(fleet: Fleet) -> None:
    mine, theirs = unique("billing-"), unique("reports-")
    with fleet.connect(fleet.admin_url) as admin:
        for key in (mine, theirs):
            admin.execute(
                sql.SQL(
                    "INSERT INTO {} VALUES (%s, 'web-1:41:9f2c1a3b', NOW() + interval '1 hour')"
                ).format(sql.Identifier(*fleet.table)),
                (f"cronjob-lock:schedule:{key}",),
            )
    before = snapshot(fleet)
    status, _, err = ctl(fleet.ops, "rerun", theirs, table=fleet.table)
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"that role '{OPS_ROLE}' may see" in err, err
    assert snapshot(fleet) == before
    status, out, err = ctl(fleet.ops, "rerun", mine, "--reason", "fixed", table=fleet.table)
    assert status == 0, err
    assert out.startswith(f"reopened the slot of {mine!r}"), out
    with fleet.connect(fleet.admin_url) as admin:
        row = admin.execute(
            sql.SQL("SELECT value, expire_at <= NOW() FROM {} WHERE key = %s").format(
                sql.Identifier(*fleet.table)
            ),
            (f"cronjob-lock:schedule:{mine}",),
        ).fetchone()
    assert row is not None and row[1], row
    assert row[0].startswith(f"rerun by {OPS_ROLE} (attempt 0) (failed; retry in slot "), row


def test_the_operators_pauses_are_recorded_for_its_keys_only(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """A pause and a resume are history rows of the operator's own (what tells a paused
    slot from a missed one), written under the same grant, named by its role."""
    history = with_history(fleet, db, (OPS_ROLE, "--keys", "billing-*", "--operator"))
    mine, theirs = unique("billing-"), unique("reports-")
    status, out, err = ctl(fleet.ops, "pause", mine, "--reason", "swap", table=fleet.table)
    assert status == 0 and "warning" not in err, err  # (a note: the key has no lock row yet)
    assert out.rstrip().endswith("; recorded in " + ".".join(history)), out
    status, out, err = ctl(fleet.ops, "resume", mine, table=fleet.table)
    assert status == 0 and err == "" and "; recorded in " in out, err
    status, _, err = ctl(fleet.ops, "pause", theirs, table=fleet.table)
    assert status == 1 and err.count("\n") == 1, err
    recorded = db.execute(
        sql.SQL("SELECT lock_key, owner, outcome, slot_end > NOW() FROM {} ORDER BY id").format(
            sql.Identifier(*history)
        )
    ).fetchall()
    assert recorded == [
        (mine, f"pause by {OPS_ROLE}: swap", "paused", True),
        (mine, f"resume by {OPS_ROLE}", "resumed", None),
    ]


def test_a_wrapper_role_records_a_failed_runs_output_within_its_bound(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """On a table made before the output's tail (its grant adds the columns), and no
    tail longer than the wrapper writes, which the policy checks, not the wrapper."""
    from dislock import run_with_locks

    runs = with_history(fleet, db)
    table = sql.Identifier(*runs)
    db.execute(
        sql.SQL("ALTER TABLE {} DROP COLUMN stdout_tail, DROP COLUMN stderr_tail").format(table)
    )
    plain_writes(fleet, BILLING_ROLE)
    # The plain statements, as on a history table without the functions.
    from dislock.core.history_functions import ARGUMENTS, signature

    for what in ARGUMENTS:
        db.execute(sql.SQL("DROP FUNCTION {}").format(sql.SQL(signature(runs, what))))
    key = unique("billing-")
    failing = ["sh", "-c", "echo partial; echo oops >&2; exit 2"]
    ran = context(fleet, fleet.billing, key, history=True, output_tail_bytes=64)
    assert run_with_locks(failing, context=ran, strategies=("lease",)) == 2
    recorded = db.execute(
        sql.SQL("SELECT outcome, stdout_tail, stderr_tail FROM {} WHERE lock_key = %s").format(
            table
        ),
        (key,),
    ).fetchall()
    assert recorded == [("failed", "partial\n", "oops\n")]
    # A role granted before the tail's columns may not write them: its runs' ends are
    # recorded without the tail, never lost.
    db.execute(
        sql.SQL("REVOKE UPDATE (stdout_tail, stderr_tail) ON {} FROM {}").format(
            table, sql.Identifier(BILLING_ROLE)
        )
    )
    second = unique("billing-")
    ran = context(fleet, fleet.billing, second, history=True, output_tail_bytes=64)
    assert run_with_locks(failing, context=ran, strategies=("lease",)) == 2
    without = db.execute(
        sql.SQL("SELECT outcome, stdout_tail FROM {} WHERE lock_key = %s").format(table),
        (second,),
    ).fetchall()
    assert without == [("failed", None)]
    with fleet.connect(fleet.billing) as billing:
        (run_id,) = billing.execute(
            sql.SQL(
                "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at)"
                " VALUES (%s, 'lease', 'o', 'h', 1, NOW()) RETURNING id"
            ).format(table),
            (key,),
        ).fetchone() or (None,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            billing.execute(
                sql.SQL(
                    "UPDATE {} SET ended_at = NOW(), outcome = 'failed',"
                    " stdout_tail = repeat('x', 262145) WHERE id = %s"
                ).format(table),
                (run_id,),
            )


def test_grants_audits_the_run_history_too(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    """A hand-made TRIGGER (code run as another team when it records a run), DELETE
    (ACCESS EXCLUSIVE on the history, so that others' runs go unrecorded) or a
    table-wide INSERT (choosing ids) on the history table is listed, with the
    history's name, and ``grants`` exits 1 until it is revoked."""
    history = with_history(fleet, db, BILLING)
    table = sql.Identifier(*history)
    granted = {
        BILLING_ROLE: "TRIGGER",
        REPORTS_ROLE: "DELETE",
        READER_ROLE: "INSERT",
    }
    for role, privilege in granted.items():
        db.execute(
            sql.SQL(f"GRANT {privilege} ON {{}} TO {{}}").format(table, sql.Identifier(role))
        )
    try:
        status, out, err = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
        assert status == 1, err
        found = {
            h["role"]: (h["privileges"], h["table"])
            for h in json.loads(out)["loopholes"]
            if h["role"] in ROLES
        }
        assert found == {
            role: ([privilege], ".".join(history)) for role, privilege in granted.items()
        }, out
    finally:
        for role, privilege in granted.items():
            db.execute(
                sql.SQL(f"REVOKE {privilege} ON {{}} FROM {{}}").format(table, sql.Identifier(role))
            )
    status, out, err = ctl(fleet.admin_url, "grants", table=fleet.table)
    assert status == 0 and "loophole" not in out, (out, err)

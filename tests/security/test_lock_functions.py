"""Teams write only through the lock functions (``dislock.core.protocol``,
``dislock.core.wrapped``, ``dislock.core.history_functions``): a wrapper role holds
no right to write either table, the functions run as the owner with a pinned
``search_path``, and whatever a team sends them by hand stays within its grant."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.failover import TIMELINE_KEY, TTL_KEY_PREFIX
from dislock.core.protocol import ARGUMENTS, function, signature
from tests.security.conftest import (
    BILLING,
    BILLING_ROLE,
    REPORTS_ROLE,
    Fleet,
    ctl,
    with_history,
)

WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "TRIGGER", "REFERENCES")


def snapshot(fleet: Fleet) -> list[tuple[Any, ...]]:
    with fleet.connect(fleet.admin_url) as admin:
        return admin.execute(
            sql.SQL("SELECT key, md5(value), expire_at FROM {} ORDER BY key").format(
                sql.Identifier(*fleet.table)
            )
        ).fetchall()


def acquire(conn: psycopg.Connection[Any], fleet: Fleet, key: str, pause: str, **args: Any) -> Any:
    """A call to the acquiring function, by hand."""
    params = {"owner": "me", "expire_at": None, "ttl": 30.0, "fencing": False, **args}
    return conn.execute(
        sql.SQL(
            "SELECT * FROM {}(p_key => %(key)s, p_pause => %(pause)s, p_owner => %(owner)s,"
            " p_expire_at => %(expire_at)s, p_ttl => %(ttl)s, p_fencing => %(fencing)s)"
        ).format(function(fleet.table, "acquire")),
        {"key": key, "pause": pause, **params},
    ).fetchone()


def test_a_wrapper_role_holds_no_right_to_write_either_table(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    history = with_history(fleet, db, BILLING)
    for table in (fleet.table, history):
        name = sql.Identifier(*table).as_string(None)
        for privilege in WRITES:
            (held,) = db.execute(
                "SELECT has_table_privilege(%s, %s, %s)", (BILLING_ROLE, name, privilege)
            ).fetchone() or (None,)
            assert held is False, (table, privilege)
        (reads,) = db.execute(
            "SELECT has_table_privilege(%s, %s, 'SELECT')", (BILLING_ROLE, name)
        ).fetchone() or (None,)
        assert reads is True
    # And it locks, and records its runs, all the same.
    from dislock import acquire_locks

    key = f"billing-{uuid.uuid4().hex[:8]}"
    with acquire_locks(_context(fleet, key, history=True), strategies=("lease",)):
        pass
    (outcome,) = db.execute(
        sql.SQL("SELECT outcome FROM {} WHERE lock_key = %s").format(sql.Identifier(*history)),
        (key,),
    ).fetchone() or (None,)
    assert outcome == "ok"


INNER = ("caller", "lock_of")


def test_the_functions_run_as_the_tables_owner_with_a_pinned_search_path(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    (owner,) = db.execute(
        "SELECT relowner::regrole::text FROM pg_class WHERE oid = %s::regclass",
        (sql.Identifier(*fleet.table).as_string(None),),
    ).fetchone() or (None,)
    for name in ARGUMENTS:
        row = db.execute(
            "SELECT proowner::regrole::text, prosecdef, proconfig FROM pg_proc"
            " WHERE oid = to_regprocedure(%s)",
            (signature(fleet.table, name),),
        ).fetchone()
        assert row is not None, name
        assert row[0] == owner, name
        if name in INNER:
            # Run only inside the others (as the owner, search_path pinned), by no one else.
            assert (row[1], row[2]) == (False, None), name
            (public,) = db.execute(
                "SELECT has_function_privilege('public', to_regprocedure(%s), 'EXECUTE')",
                (signature(fleet.table, name),),
            ).fetchone() or (None,)
            assert public is False, name
        else:
            assert row[2] == ["search_path=pg_catalog, pg_temp"], name


FORGED = [
    # (what, key, pause): each refused, and nothing written
    ("another team's key", "cronjob-lock:lease:payroll-x", "cronjob-lock:pause:payroll-x"),
    ("a metadata row", "dislock:failover:scope:" + REPORTS_ROLE, "cronjob-lock:pause:billing-x"),
    ("its key under another key's pause", "cronjob-lock:lease:billing-x", "cronjob-lock:pause:q"),
    ("a pause row", "cronjob-lock:pause:billing-x", "cronjob-lock:pause:billing-x"),
    ("a slot past the last", "cronjob-lock:lease#1001:billing-x", "cronjob-lock:pause:billing-x"),
    ("a 5 MB key", "cronjob-lock:lease:billing-" + "k" * 5_000_000, None),
]


@pytest.mark.parametrize(("what", "key", "pause"), FORGED, ids=[f[0] for f in FORGED])
def test_no_call_by_hand_writes_past_the_grant(
    fleet: Fleet, what: str, key: str, pause: str | None
) -> None:
    before = snapshot(fleet)
    with (
        fleet.connect(fleet.billing) as billing,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        acquire(billing, fleet, key, pause or f"cronjob-lock:pause:{key.split(':', 2)[2]}")
    assert snapshot(fleet) == before, what


def test_a_5_mb_owner_token_is_refused_through_every_acquisition(fleet: Fleet) -> None:
    before = snapshot(fleet)
    big = "o" * 5_000_000
    with fleet.connect(fleet.billing) as billing:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            acquire(
                billing,
                fleet,
                "cronjob-lock:lease:billing-x",
                "cronjob-lock:pause:billing-x",
                owner=big,
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            billing.execute(
                sql.SQL(
                    "SELECT * FROM {}(p_keys => %s, p_pause => %s, p_owner => %s, p_ttl => 30,"
                    " p_fencing => false)"
                ).format(function(fleet.table, "acquire_slot")),
                (["cronjob-lock:lease:billing-x"], "cronjob-lock:pause:billing-x", big),
            )
    assert snapshot(fleet) == before


def test_a_renewal_by_hand_moves_no_metadata_row(fleet: Fleet) -> None:
    """The timeline row's ``expire_at`` is when the last failover was noticed: moving it
    would cut every key's lock delay short.  Its value is readable; a renewal naming
    it, as its owner, renews nothing."""
    from dislock import LeaseLock

    with LeaseLock(_context(fleet, f"billing-{uuid.uuid4().hex[:8]}")):
        pass
    before = snapshot(fleet)
    with fleet.connect(fleet.billing) as billing:
        (value,) = billing.execute(
            sql.SQL("SELECT value FROM {} WHERE key = %s").format(sql.Identifier(*fleet.table)),
            (TIMELINE_KEY,),
        ).fetchone() or (None,)
        renewed = billing.execute(
            sql.SQL("SELECT * FROM {}(p_keys => %s, p_owners => %s, p_ttls => %s)").format(
                function(fleet.table, "renew")
            ),
            ([TIMELINE_KEY], [value], [3600.0]),
        ).fetchall()
    assert renewed == []
    assert snapshot(fleet) == before


def test_a_member_login_role_locks_with_its_teams_scope(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """``GRANT billing TO billing_app``: the app's lease counts in billing's record of
    its longest TTL (which holds up billing's keys only after a failover), and the app
    may lock billing's keys and no others."""
    from dislock import LeaseLock
    from dislock.core.errors import KeyNotGrantedError

    app = f"{BILLING_ROLE}_app"
    db.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(app)))
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(app)))
    try:
        db.execute(sql.SQL("GRANT {} TO {}").format(*map(sql.Identifier, (BILLING_ROLE, app))))
        url = fleet.billing.replace(f"user={BILLING_ROLE}", f"user={app}")
        assert app in url
        with LeaseLock(_context(fleet, f"billing-{uuid.uuid4().hex[:8]}", url=url, ttl=3000.0)):
            pass
        records = dict(
            db.execute(
                sql.SQL("SELECT key, value FROM {} WHERE starts_with(key, %s)").format(
                    sql.Identifier(*fleet.table)
                ),
                (TTL_KEY_PREFIX,),
            ).fetchall()
        )
        assert records.get(TTL_KEY_PREFIX + BILLING_ROLE) == "3000"
        assert TTL_KEY_PREFIX + app not in records
        with pytest.raises(KeyNotGrantedError), LeaseLock(_context(fleet, "payroll-x", url=url)):
            pass
        status, out, err = ctl(fleet.admin_url, "grants", table=fleet.table)
        assert status == 0, err
        assert f"member {app}" in out, out
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(app)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(app)))


def test_the_key_quota_holds_under_concurrent_transactions(fleet: Fleet) -> None:
    """Twenty connections, each taking fresh keys in one transaction, all at once:
    the quota is counted under a per-role advisory lock, so no two pass the last place."""
    quota = 10
    status, _, err = ctl(
        fleet.admin_url,
        "grant",
        REPORTS_ROLE,
        "--keys",
        "reports-*",
        "--max-keys",
        str(quota),
        table=fleet.table,
    )
    assert status == 0, err
    start = threading.Barrier(20)
    refused: list[BaseException] = []

    def team(n: int) -> None:
        with fleet.connect(fleet.reports) as conn:
            start.wait()
            try:
                with conn.transaction():
                    for i in range(3):
                        key = f"reports-q{n}-{i}"
                        acquire(
                            conn, fleet, f"cronjob-lock:lease:{key}", f"cronjob-lock:pause:{key}"
                        )
            except psycopg.errors.InsufficientPrivilege as exc:
                refused.append(exc)

    threads = [threading.Thread(target=team, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    with fleet.connect(fleet.admin_url) as admin:
        (held,) = admin.execute(
            sql.SQL(
                "SELECT count(*) FROM {} WHERE key LIKE 'cronjob-lock:lease:reports-q%%'"
            ).format(sql.Identifier(*fleet.table))
        ).fetchone() or (None,)
    assert held is not None and held <= quota
    assert refused and all("may hold at most" in str(exc) for exc in refused)


def _context(
    fleet: Fleet, key: str, *, url: str | None = None, ttl: float = 30.0, **fields: Any
) -> Any:
    from dislock import LockContext

    return LockContext(
        url=url or fleet.billing,
        table_parts=list(fleet.table),
        lock_key=key,
        owner=f"owner-{uuid.uuid4().hex[:8]}",
        run_ttl_seconds=ttl,
        **fields,
    )


@pytest.mark.parametrize(
    "privilege", ["INSERT", "INSERT (key, value, expire_at)", "UPDATE (value)"]
)
def test_grants_reports_a_write_privilege_given_by_hand_to_a_wrapper(
    fleet: Fleet, db: psycopg.Connection[Any], privilege: str
) -> None:
    """A wrapper role writes through the functions alone: a right to write the table by
    hand, any column of it, is a way around them, and ``grants`` says so (exit 1)."""
    table = sql.Identifier(*fleet.table)
    db.execute(
        sql.SQL("GRANT {} ON {} TO {}").format(
            sql.SQL(privilege), table, sql.Identifier(BILLING_ROLE)
        )
    )
    status, out, _ = ctl(fleet.admin_url, "grants", table=fleet.table)
    assert status == 1, out
    (line,) = [line for line in out.splitlines() if line.startswith("loophole:")]
    assert f"role '{BILLING_ROLE}'" in line and privilege.split()[0] in line, line
    # The statement it prints takes it away.
    revoke = line.split(": ", 2)[2].split(" (or ")[0]
    db.execute(revoke)
    assert ctl(fleet.admin_url, "grants", table=fleet.table)[0] == 0


def test_init_writes_a_grant_made_before_the_functions_again_once(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """A fleet upgrading: its grants were written when wrappers wrote the table by hand.
    ``init`` writes each again as it was (keys, quota), so that its role writes through
    the functions only; a second ``init`` writes nothing."""
    from dislock.core.grants import policy_name

    table = sql.Identifier(*fleet.table)
    read_policy = sql.Identifier(policy_name(BILLING_ROLE, "read"))
    db.execute(
        sql.SQL("COMMENT ON POLICY {} ON {} IS {}").format(
            read_policy,
            table,
            sql.Literal('{"access": "wrapper", "keys": ["billing-*"], "max_keys": 7}'),
        )
    )
    db.execute(
        sql.SQL("GRANT INSERT, UPDATE (value, expire_at) ON {} TO {}").format(
            table, sql.Identifier(BILLING_ROLE)
        )
    )
    status, out, err = ctl(fleet.admin_url, "init", table=fleet.table)
    assert status == 0, err
    name = sql.Identifier(*fleet.table).as_string(None)
    (writes,) = db.execute(
        "SELECT has_any_column_privilege(%s, %s, 'INSERT')"
        " OR has_any_column_privilege(%s, %s, 'UPDATE')",
        (BILLING_ROLE, name, BILLING_ROLE, name),
    ).fetchone() or (None,)
    assert writes is False
    status, out, err = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
    import json

    (billing,) = [g for g in json.loads(out)["grants"] if g["role"] == BILLING_ROLE]
    assert (billing["keys"], billing["max_keys"], billing["current"]) == (["billing-*"], 7, True)

    def versions() -> list[Any]:
        return db.execute(
            "SELECT xmin::text FROM pg_policy WHERE polrelid = %s::regclass ORDER BY polname",
            (name,),
        ).fetchall()

    before = versions()
    assert ctl(fleet.admin_url, "init", table=fleet.table)[0] == 0
    assert versions() == before


@pytest.mark.direct_postgres  # the team's role setting applies as its server session starts
def test_the_owner_acquires_and_releases_without_the_caller_function(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """acquire and release ask first whether the session's role is a member of the
    role they run as: the owner's session never runs (so never compiles) ``caller``;
    a team's does, for its grant."""
    caller = signature(fleet.table, "caller")
    release = function(fleet.table, "release")
    db.execute(
        sql.SQL("ALTER ROLE {} SET track_functions = 'pl'").format(sql.Identifier(BILLING_ROLE))
    )
    try:
        calls = {}
        for who, url in (("owner", fleet.admin_url), ("team", fleet.billing)):
            with fleet.connect(url) as conn, conn.transaction():
                if who == "owner":  # the team's role has it from ALTER ROLE (superuser only)
                    conn.execute("SET LOCAL track_functions = 'pl'")
                key = f"cronjob-lock:lease:billing-{who}-{uuid.uuid4().hex[:6]}"
                pause = key.replace(":lease:", ":pause:")
                assert acquire(conn, fleet, key, pause)[0] is True
                conn.execute(
                    sql.SQL("SELECT * FROM {}(%s, %s, 'dislock_release', %s)").format(release),
                    (key, "me", key),
                ).fetchall()
                (calls[who],) = conn.execute(
                    "SELECT pg_stat_get_xact_function_calls(to_regprocedure(%s))", (caller,)
                ).fetchone() or (None,)
        assert calls["owner"] in (0, None), calls
        assert calls["team"] == 2, calls  # once for the acquisition, once for the release
    finally:
        db.execute(
            sql.SQL("ALTER ROLE {} RESET track_functions").format(sql.Identifier(BILLING_ROLE))
        )

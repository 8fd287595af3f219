"""The audit trail under grants: an operator's actions are recorded as its own, and
no granted role can change, delete or forge a row (by hand, or through any function
beside the table with arguments of its choosing); only an operator retires a key;
readers read the trail; a write privilege on it given by hand is a loophole; its rows
count toward the role's history budget and are never refused for it."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.audit_trail import audit_table
from dislock.core.history_functions import USED_PREFIX
from tests.security.conftest import (
    BILLING_ROLE,
    OPS_ROLE,
    READER_ROLE,
    Fleet,
    ctl,
    with_history,
)


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _init(fleet: Fleet) -> tuple[str, ...]:
    """``init`` as the owner, after the fleet's grants: it creates the trail (and lets
    the reader read it); the trail's name."""
    status, _, err = ctl(fleet.admin_url, "init", table=fleet.table)
    assert status == 0, err
    return audit_table(fleet.table)


def _rows(fleet: Fleet, trail: tuple[str, ...]) -> list[tuple[Any, ...]]:
    with fleet.connect(fleet.admin_url) as admin:
        query = sql.SQL("SELECT * FROM {} ORDER BY id").format(sql.Identifier(*trail))
        return admin.execute(query).fetchall()


def _owner(fleet: Fleet) -> str:
    with fleet.connect(fleet.admin_url) as admin:
        found = admin.execute("SELECT session_user::text").fetchone()
    assert found is not None
    return str(found[0])


def _call(fleet: Fleet, *arguments: Any, acted_as: str | None = None) -> None:
    """The trail's writer, called by hand as the operator."""
    from dislock.core.protocol import function

    extra = sql.SQL("") if acted_as is None else sql.SQL(", p_acted_as => {}").format(acted_as)
    with fleet.connect(fleet.ops) as ops:
        ops.execute(
            sql.SQL("SELECT {}(%s, %s, %s, %s{})").format(function(fleet.table, "audit"), extra),
            arguments,
        )


def test_an_operators_action_is_its_own_row(fleet: Fleet) -> None:
    trail = _init(fleet)
    mine = _unique("billing-")
    status, _, err = ctl(fleet.ops, "pause", mine, "--reason", "disk full", table=fleet.table)
    assert status == 0, err
    (row,) = [row[2:] for row in _rows(fleet, trail) if row[4] == "pause"]
    assert row == (OPS_ROLE, OPS_ROLE, "pause", mine, "until resumed", "disk full")


def test_an_operator_cannot_rewrite_the_trail(fleet: Fleet) -> None:
    trail = _init(fleet)
    mine, theirs = _unique("billing-"), _unique("reports-")
    assert ctl(fleet.ops, "pause", mine, "--reason", "first", table=fleet.table)[0] == 0
    before = _rows(fleet, trail)
    table = sql.Identifier(*trail)
    by_hand = [
        sql.SQL("UPDATE {} SET reason = 'rewritten'").format(table),
        sql.SQL("DELETE FROM {}").format(table),
        sql.SQL("TRUNCATE {}").format(table),
        sql.SQL(
            "INSERT INTO {} (at, login_role, acted_as, action, lock_key)"
            " VALUES (now(), 'someone', 'someone', 'pause', %s)"
        ).format(table),
    ]
    with fleet.connect(fleet.ops) as ops:
        for statement in by_hand:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                ops.execute(statement, (mine,) if "%s" in statement.as_string(None) else None)
    crafted: list[tuple[tuple[Any, ...], str | None]] = [
        (("grant", None, "ops --operator *", "mine now"), None),  # table-wide: the owner's
        (("init", None, None, None), None),
        (("pause", theirs, None, None), None),  # outside its grant
        (("rewrite", mine, None, None), None),  # no such action
        (("pause", None, None, None), None),  # an operator's action names its key
        ((None, mine, None, None), None),
        (("pause", mine, None, "x" * 1001), None),  # past the reason's bound
        (("pause", mine, "x" * 5000, None), None),
        (("pause", mine, None, None), BILLING_ROLE),  # a role it may not act as
        (("pause", mine, None, None), _owner(fleet)),
    ]
    for arguments, acted_as in crafted:
        with pytest.raises(psycopg.Error):
            _call(fleet, *arguments, acted_as=acted_as)
    assert _rows(fleet, trail) == before
    _every_function_called_by_hand(fleet)
    assert _rows(fleet, trail) == before
    # The same call with its own arguments is taken: one more row, named as the operator.
    _call(fleet, "pause", mine, None, "its own", acted_as=OPS_ROLE)
    after = _rows(fleet, trail)
    assert after[:-1] == before
    assert after[-1][2:] == (OPS_ROLE, OPS_ROLE, "pause", mine, None, "its own")


def _every_function_called_by_hand(fleet: Fleet) -> None:
    """Every function in the table's schema the operator may execute, called with
    arguments of its own (NULLs, the audit's actions in the texts): whatever each does,
    none changes the trail."""
    with fleet.connect(fleet.admin_url) as admin:
        functions = admin.execute(
            "SELECT p.oid::regprocedure::text, p.pronargs FROM pg_proc AS p"
            " WHERE p.pronamespace = %s::regnamespace"
            " AND has_function_privilege(%s, p.oid, 'EXECUTE')",
            (fleet.table[0], OPS_ROLE),
        ).fetchall()
    assert len(functions) > 5, functions
    for signature, count in functions:
        name = signature.split("(")[0]
        for value in (None, "retire"):
            with fleet.connect(fleet.ops) as ops:
                arguments = sql.SQL(", ").join([sql.Literal(value)] * count)
                with contextlib.suppress(psycopg.Error):
                    ops.execute(sql.SQL("SELECT {}({})").format(sql.SQL(name), arguments))


def test_only_an_operator_retires_a_key(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    """A key with history shows in missed; a wrapper and a reader cannot retire it; an
    operator can, and it is gone from missed and ls, audited."""
    history = with_history(
        fleet, db, (OPS_ROLE, "--keys", "billing-*", "--operator"), (READER_ROLE, "--reader")
    )
    trail = _init(fleet)
    key = _unique("billing-")
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, slot_end, owner, host, pid, started_at, ended_at,"
            " outcome, cron) VALUES (%s, 'schedule', now(), 'me', 'web-1', 1,"
            " now() - interval '2 hours', now() - interval '2 hours', 'ok', '* * * * *')"
        ).format(sql.Identifier(*history)),
        (key,),
    )
    db.execute(
        sql.SQL("INSERT INTO {} VALUES (%s, 'web-1:1:x', now() - interval '2 hours')").format(
            sql.Identifier(*fleet.table)
        ),
        (f"cronjob-lock:schedule:{key}",),
    )
    before = _rows(fleet, trail)
    status, out, err = ctl(fleet.reader, "missed", key, table=fleet.table)
    assert status in (0, 1) and f"for {key!r}" in out, (out, err)
    for url in (fleet.billing, fleet.reader):
        status, _, err = ctl(url, "retire", key, table=fleet.table)
        assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
        assert key in ctl(fleet.reader, "ls", table=fleet.table)[1]
    assert _rows(fleet, trail) == before
    status, out, err = ctl(fleet.ops, "retire", key, "--reason", "by hand", table=fleet.table)
    assert status == 0, err
    status, _, err = ctl(fleet.reader, "missed", key, table=fleet.table)
    assert status == 1 and "no run of" in err, err
    assert key not in ctl(fleet.reader, "ls", table=fleet.table)[1]
    ((action, lock_key, who, reason),) = [
        (r[4], r[5], r[2], r[7]) for r in _rows(fleet, trail)[len(before) :]
    ]
    assert (action, lock_key, who, reason) == ("retire", key, OPS_ROLE, "by hand")


def test_readers_read_the_trail_and_others_do_not(fleet: Fleet) -> None:
    _init(fleet)
    mine = _unique("billing-")
    assert ctl(fleet.ops, "pause", mine, table=fleet.table)[0] == 0
    status, out, err = ctl(fleet.reader, "audit", "--key", mine, table=fleet.table)
    assert status == 0 and f"pause  {mine}  by {OPS_ROLE}" in out, (out, err)
    for url in (fleet.billing, fleet.ops):
        status, _, err = ctl(url, "audit", table=fleet.table)
        assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err


def test_serves_key_page_reads_the_trail_as_a_reader_only(fleet: Fleet) -> None:
    """``serve`` as the reader lists a key's audited actions, newest first; as a role
    that may not read the trail, it says so in a line, and no line of it."""
    from dislock.cli.serve.fleet_reader import FleetReader
    from dislock.core.history import history_table

    _init(fleet)
    mine = _unique("billing-")
    for verb in ("pause", "resume"):
        assert ctl(fleet.ops, verb, mine, "--reason", f"{verb} <now>", table=fleet.table)[0] == 0
    for url, expected in ((fleet.reader, ["resume", "pause"]), (fleet.billing, None)):
        reader = FleetReader(url, fleet.table, history_table(fleet.table))
        try:
            found = reader.audit_of(mine, 50)
        finally:
            reader.close()
        if expected is None:
            assert (
                found == "the audit trail is not readable by this role (a reader's grant reads it)"
            )
        else:
            assert not isinstance(found, str), found
            assert [(entry.action, entry.reason) for entry in found] == [
                (verb, f"{verb} <now>") for verb in expected
            ]


def test_a_write_privilege_on_the_trail_is_a_loophole(fleet: Fleet) -> None:
    trail = _init(fleet)
    assert ctl(fleet.admin_url, "grants", table=fleet.table)[0] == 0
    with fleet.connect(fleet.admin_url) as admin:
        admin.execute(
            sql.SQL("GRANT INSERT ON {} TO {}").format(
                sql.Identifier(*trail), sql.Identifier(BILLING_ROLE)
            )
        )
    status, out, _ = ctl(fleet.admin_url, "grants", table=fleet.table)
    assert status == 1, out
    assert f"loophole: role '{BILLING_ROLE}' has INSERT on {'.'.join(trail)}" in out, out


def test_the_trail_counts_in_the_budget_and_is_never_refused(fleet: Fleet) -> None:
    trail = _init(fleet)
    used = sql.SQL("SELECT value::int8 FROM {} WHERE key = %s").format(sql.Identifier(*fleet.table))
    with fleet.connect(fleet.admin_url) as admin:
        assert admin.execute(used, (USED_PREFIX + OPS_ROLE,)).fetchone() is None
    mine = _unique("billing-")
    assert ctl(fleet.ops, "pause", mine, table=fleet.table)[0] == 0
    with fleet.connect(fleet.admin_url) as admin:
        counted = admin.execute(used, (USED_PREFIX + OPS_ROLE,)).fetchone()
        assert counted is not None and counted[0] > 0
        # Far past its budget (256 MiB by default): still audited.
        admin.execute(
            sql.SQL("UPDATE {} SET value = '999999999999' WHERE key = %s").format(
                sql.Identifier(*fleet.table)
            ),
            (USED_PREFIX + OPS_ROLE,),
        )
    assert ctl(fleet.ops, "resume", mine, table=fleet.table)[0] == 0
    assert [row[4] for row in _rows(fleet, trail)][-2:] == ["pause", "resume"]


def test_past_the_budget_a_run_is_counted_and_nothing_recounted(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """Past its budget, a role's runs are counted on top of its count as written, the
    trail's rows with them, never recounted from the rows (a read of the whole history
    at every run: security review #61, N11)."""
    from dislock import LockContext, run_with_locks

    with_history(fleet, db, (OPS_ROLE, "--keys", "billing-*", "--operator"))
    _init(fleet)
    mine = _unique("billing-")
    over = sql.SQL(
        "INSERT INTO {} (key, value, expire_at) VALUES (%s, '999999999999', 'infinity')"
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
    ).format(sql.Identifier(*fleet.table))
    db.execute(over, (USED_PREFIX + OPS_ROLE,))
    ran = LockContext(
        url=fleet.ops,
        table_parts=list(fleet.table),
        lock_key=mine,
        owner="o-1",
        run_ttl_seconds=5.0,
        lease_interval_seconds=1.0,
        history=True,
    )
    assert run_with_locks(["true"], context=ran, strategies=("lease",)) == 0
    used = sql.SQL("SELECT value::int8 FROM {} WHERE key = %s").format(sql.Identifier(*fleet.table))
    (counted,) = db.execute(used, (USED_PREFIX + OPS_ROLE,)).fetchone() or (0,)
    assert 999999999999 < counted < 999999999999 + 1000
    status, _, err = ctl(fleet.ops, "pause", mine, "--reason", "r" * 1000, table=fleet.table)
    assert status == 0, err
    (paused,) = db.execute(used, (USED_PREFIX + OPS_ROLE,)).fetchone() or (0,)
    assert paused > counted + 1000


def test_a_wrapper_reruns_its_own_key_audited_and_pauses_nothing(fleet: Fleet) -> None:
    """A wrapper role that writes its rows by hand (``--plain-writes``) may rerun its
    keys, as without the trail, and is audited; it may not pause them, nor audit a pause."""
    trail = _init(fleet)
    status, _, err = ctl(
        fleet.admin_url,
        "grant",
        BILLING_ROLE,
        "--keys",
        "billing-*",
        "--plain-writes",
        table=fleet.table,
    )
    assert status == 0, err
    mine = _unique("billing-")
    with fleet.connect(fleet.admin_url) as admin:
        admin.execute(
            sql.SQL(
                "INSERT INTO {} VALUES (%s, 'web-1:41:9f2c', NOW() + interval '1 hour')"
            ).format(sql.Identifier(*fleet.table)),
            (f"cronjob-lock:schedule:{mine}",),
        )
    status, _, err = ctl(fleet.billing, "rerun", mine, "--reason", "fixed", table=fleet.table)
    assert status == 0, err
    assert _rows(fleet, trail)[-1][2:6] == (BILLING_ROLE, BILLING_ROLE, "rerun", mine)
    before = _rows(fleet, trail)
    assert ctl(fleet.billing, "pause", mine, table=fleet.table)[0] == 1
    with fleet.connect(fleet.billing) as billing, pytest.raises(psycopg.Error):
        billing.execute(
            sql.SQL("SELECT {}('pause', %s, NULL, NULL)").format(
                sql.Identifier(*fleet.table[:-1], f"{fleet.table[-1]}_dislock_audit")
            ),
            (mine,),
        )
    assert _rows(fleet, trail) == before

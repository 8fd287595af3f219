"""Bounds on what a granted role writes (issue #35, item 6): no text a role sends by
hand makes a lock row or a run of the history longer than dislock's own longest
(``dislock.core.bounds.MAX_STORED_BYTES``), nor a run's outcome one dislock does
not record; the server refuses the statement and the tables stay as they were.
One 50 MB ``value`` used to make ``dislockctl ls`` print a gigabyte.

What dislock itself writes at its longest still goes through: an owner token of
the longest a ``LockContext`` accepts, force-released (which appends a mark), and
the longest pause reason.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.bounds import MAX_KEY_BYTES, MAX_REASON_BYTES
from dislock.core.failover import TTL_KEY_PREFIX
from tests.security.conftest import (
    BILLING,
    BILLING_ROLE,
    Fleet,
    ctl,
    plain_writes,
    role_name,
    with_history,
)

BIG = 5_000_000
"""Bytes of an oversized text: far past any bound, small enough to send quickly."""

OWN = "cronjob-lock:lease:billing-own"
"""A lease row of a key that billing's and ops' grants cover, held by its owner token."""

LOCK_ROWS = [
    # (what, role, statement; {t} is the lock table, %(big)s a 5 MB text)
    (
        "take its own lease with a 5 MB owner token",
        "billing",
        "INSERT INTO {t} VALUES ('cronjob-lock:lease:billing-big', %(big)s, NOW() + interval"
        " '1 minute')",
    ),
    (
        "take its own schedule slot with a 5 MB owner token",
        "billing",
        "INSERT INTO {t} VALUES ('cronjob-lock:schedule:billing-big', %(big)s, NOW() + interval"
        " '1 minute')",
    ),
    (
        "take its own key's second slot with a 5 MB owner token",
        "billing",
        "INSERT INTO {t} VALUES ('cronjob-lock:lease#2:billing-big', %(big)s, NOW() + interval"
        " '1 minute')",
    ),
    (
        "rewrite the owner token of its own lease",
        "billing",
        "UPDATE {t} SET value = %(big)s WHERE key = {own}",
    ),
    (
        "take over its own lease with a 5 MB owner token",
        "billing",
        "INSERT INTO {t} VALUES ({own}, 'me', NOW() + interval '1 minute') ON CONFLICT (key)"
        " DO UPDATE SET value = %(big)s",
    ),
    (
        "take its own key under a 100 kB lock key",
        "billing",
        # The primary key's index takes it compressed.
        "INSERT INTO {t} VALUES ('cronjob-lock:lease:billing-' || repeat('k', 100000), 'me',"
        " NOW() + interval '1 minute')",
    ),
    (
        "record a TTL of 5 MB of zeros and a one",
        "billing",
        "INSERT INTO {t} VALUES ({record}, repeat('0', 5000000) || '1', 'infinity')"
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    ),
    (
        "pause its own key with a 5 MB reason",
        "ops",
        "INSERT INTO {t} VALUES ('cronjob-lock:pause:billing-big', %(big)s, NOW() + interval"
        " '1 day')",
    ),
]


def snapshot(fleet: Fleet, table: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Every row of ``table``, as its owner sees it (long texts by length and hash)."""
    with fleet.connect(fleet.admin_url) as admin:
        columns = [
            name
            for (name,) in admin.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped ORDER BY attnum",
                (sql.Identifier(*table).as_string(None),),
            )
        ]
        shown = sql.SQL(", ").join(
            sql.SQL(
                "CASE WHEN pg_typeof({c}) = 'text'::regtype THEN md5({c}::text) ELSE {c}::text END"
            ).format(c=sql.Identifier(name))
            for name in columns
        )
        return admin.execute(
            sql.SQL("SELECT {} FROM {} ORDER BY 1").format(shown, sql.Identifier(*table))
        ).fetchall()


def refused(fleet: Fleet, url: str, statement: sql.Composed, params: dict[str, Any]) -> None:
    """``statement`` sent as the role of ``url`` is refused by row-level security."""
    with (
        fleet.connect(url) as attacker,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"),
    ):
        attacker.execute(statement, params)


@pytest.mark.parametrize(("what", "role", "statement"), LOCK_ROWS, ids=[c[0] for c in LOCK_ROWS])
def test_a_role_cannot_write_an_oversized_lock_row(
    fleet: Fleet, what: str, role: str, statement: str
) -> None:
    plain_writes(fleet, BILLING_ROLE)  # by hand, not only through the lock functions
    with fleet.connect(fleet.admin_url) as admin:
        admin.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, 'holder', NOW() + interval '1 minute')").format(
                sql.Identifier(*fleet.table)
            ),
            (OWN,),
        )
    before = snapshot(fleet, fleet.table)
    text = sql.SQL(statement).format(
        t=sql.Identifier(*fleet.table),
        own=sql.Literal(OWN),
        record=sql.Literal(TTL_KEY_PREFIX + role_name(role)),
    )
    refused(fleet, getattr(fleet, role), text, {"big": "x" * BIG})
    assert snapshot(fleet, fleet.table) == before, what


@pytest.fixture
def runs(fleet: Fleet, db: psycopg.Connection[Any]) -> tuple[str, ...]:
    """The history table of the fleet's lock table, covered by billing's grant, with
    one unfinished run of billing's."""
    history = with_history(fleet, db, BILLING)
    plain_writes(fleet, BILLING_ROLE)  # by hand, not only through the history functions
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at)"
            " VALUES ('billing-running', 'lease', 'o', 'h', 1, NOW())"
        ).format(sql.Identifier(*history))
    )
    return history


STARTED = "lock_key, modes, owner, host, pid, started_at, cron, cron_tz"
HONEST = {
    "lock_key": "billing-x",
    "modes": "lease",
    "owner": "host:1:abcd",
    "host": "host",
    "cron": "0 * * * *",
    "cron_tz": "Europe/Berlin",
}


@pytest.mark.parametrize("column", list(HONEST))
def test_a_role_cannot_record_a_run_with_an_oversized_text(
    fleet: Fleet, runs: tuple[str, ...], column: str
) -> None:
    values = dict(HONEST)
    # (A lock key goes into an index, which takes 100 kB compressed but not 5 MB.)
    values[column] = "billing-" + "k" * 100_000 if column == "lock_key" else "x" * BIG
    before = snapshot(fleet, runs)
    statement = sql.SQL(
        "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, cron, cron_tz)"
        " VALUES (%(lock_key)s, %(modes)s, %(owner)s, %(host)s, 1, NOW(), %(cron)s, %(cron_tz)s)"
    ).format(sql.Identifier(*runs))
    refused(fleet, fleet.billing, statement, values)
    assert snapshot(fleet, runs) == before, column


@pytest.mark.parametrize("started_at", ["NOW() + interval '100 years'", "NOW() - interval '1 day'"])
def test_a_run_starts_on_the_servers_clock(
    fleet: Fleet, runs: tuple[str, ...], started_at: str
) -> None:
    """Neither from the future (listed first, as abandoned, past every prune) nor
    backdated: the server's clock, as dislock writes it."""
    before = snapshot(fleet, runs)
    statement = sql.SQL(
        "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at)"
        " VALUES ('billing-x', 'lease', 'o', 'h', 1, {})"
    ).format(sql.Identifier(*runs), sql.SQL(started_at))
    refused(fleet, fleet.billing, statement, {})
    assert snapshot(fleet, runs) == before


@pytest.mark.parametrize(
    "outcome", ["x" * BIG, "\x1b[2J\x1b]0;owned\x07", "ok ", "OK", "running", "abandoned"]
)
def test_a_role_records_no_outcome_dislock_does_not(
    fleet: Fleet, runs: tuple[str, ...], outcome: str
) -> None:
    """Outcomes become label values of ``dislock_runs_total``: only dislock's own
    (``dislock.core.history.OUTCOMES``) are written; ``running`` and ``abandoned``
    are derived when reading, never recorded."""
    before = snapshot(fleet, runs)
    statement = sql.SQL(
        "UPDATE {} SET ended_at = NOW(), outcome = %(outcome)s WHERE lock_key = 'billing-running'"
    ).format(sql.Identifier(*runs))
    refused(fleet, fleet.billing, statement, {"outcome": outcome})
    assert snapshot(fleet, runs) == before


def test_the_longest_texts_dislock_writes_still_go_through(
    fleet: Fleet, runs: tuple[str, ...], db: psycopg.Connection[Any]
) -> None:
    """An owner token of the longest a context accepts, in a lock and a recorded run,
    force-released by the operator (a mark appended), and the longest pause reason."""
    from dislock import LeaseLock, LockContext, acquire_locks

    key = f"billing-{uuid.uuid4().hex[:8]}"
    context = LockContext(
        url=fleet.billing,
        table_parts=list(fleet.table),
        lock_key=key,
        owner="o" * MAX_KEY_BYTES,
        run_ttl_seconds=30.0,
        lease_interval_seconds=10.0,
        history=True,
    )
    with acquire_locks(context, strategies=("lease",)):
        pass
    recorded = db.execute(
        sql.SQL("SELECT octet_length(owner), outcome FROM {} WHERE lock_key = %s").format(
            sql.Identifier(*runs)
        ),
        (key,),
    ).fetchall()
    assert recorded == [(MAX_KEY_BYTES, "ok")]
    with LeaseLock(replace(context, history=False)):
        status, out, err = ctl(fleet.ops, "release", key, "--mode", "lease", table=fleet.table)
        assert status == 0 and "released lease" in out, err
    status, _, err = ctl(
        fleet.ops, "pause", key, "--reason", "r" * MAX_REASON_BYTES, table=fleet.table
    )
    assert status == 0, err
    values = db.execute(
        sql.SQL("SELECT key, octet_length(value) FROM {} WHERE key LIKE %s ORDER BY key").format(
            sql.Identifier(*fleet.table)
        ),
        (f"%:{key}",),
    ).fetchall()
    # The mark names the operator's role and host.
    with fleet.connect(fleet.ops) as ops:
        role = ops.execute("SELECT current_user").fetchone()
    assert role is not None
    released_mark = f" (released by dislockctl as {role[0]} on {socket.gethostname()})"
    assert values == [
        (f"cronjob-lock:lease:{key}", MAX_KEY_BYTES + len(released_mark)),
        (f"cronjob-lock:pause:{key}", MAX_REASON_BYTES),
    ]

"""A granted role holds at most ``--max-keys`` lock keys (``dislock.core.key_quota``): a
machine looping over fresh keys under a broad pattern cannot fill the table.

Each refusal is checked twice, as in test_roles.py: the role is told in one line, and
the table holds exactly what it held before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from dislock import KeyNotGrantedError, LeaseLock, ScheduleLock
from dislock.core.key_quota import DEFAULT_MAX_KEYS
from tests.security.conftest import BILLING_ROLE, Fleet, ctl, plain_writes
from tests.security.test_roles import context, snapshot


def role_of(url: str) -> str:
    return str(conninfo_to_dict(url)["user"])


def regrant(fleet: Fleet, url: str, *options: str) -> str:
    """``dislockctl grant`` again for the role of ``url`` (billing's keys), with
    ``options``: what it prints."""
    status, out, err = ctl(
        fleet.admin_url, "grant", role_of(url), "--keys", "billing-*", *options, table=fleet.table
    )
    assert status == 0, err
    return out


def lock_key_count(fleet: Fleet) -> int:
    with fleet.connect(fleet.admin_url) as admin:
        row = admin.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE key LIKE 'cronjob-lock:%%:billing-%%'").format(
                sql.Identifier(*fleet.table)
            )
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_role_holds_at_most_its_quota_of_keys(fleet: Fleet) -> None:
    said = regrant(fleet, fleet.billing, "--max-keys", "3")
    assert said.rstrip().endswith("(at most 3 keys)"), said
    keys = [f"billing-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for key in keys:  # a key with both strategies, and a lease of three slots, are one key
        with LeaseLock(context(fleet, fleet.billing, key, slots=3)):
            pass
        with ScheduleLock(context(fleet, fleet.billing, key)):
            pass
    before = snapshot(fleet)
    for lock in (
        LeaseLock(context(fleet, fleet.billing, "billing-one-too-many")),
        ScheduleLock(context(fleet, fleet.billing, "billing-one-too-many")),
    ):
        with pytest.raises(KeyNotGrantedError) as refused:
            lock.__enter__()
        message = str(refused.value)
        assert "may hold at most 3 keys" in message and "'billing-one-too-many'" in message
        assert "--max-keys" in message and "\n" not in message
    assert snapshot(fleet) == before
    # The keys it holds are taken again as ever: an update, which the quota never sees.
    for key in keys:
        with LeaseLock(context(fleet, fleet.billing, key, slots=3)):
            pass
    # A higher quota lets the next key in; another role's quota is its own.
    regrant(fleet, fleet.billing, "--max-keys", "4")
    with LeaseLock(context(fleet, fleet.billing, "billing-one-too-many")):
        pass
    with LeaseLock(context(fleet, fleet.reports, f"reports-{uuid.uuid4().hex[:8]}")):
        pass


def test_the_wrapper_says_the_quota_in_one_line(fleet: Fleet, tmp_path: Any) -> None:
    regrant(fleet, fleet.billing, "--max-keys", "1")
    env = {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": fleet.billing,
        "LOCK_TABLE": ".".join(fleet.table),
        "LOCK_STRATEGY": "lease",
    }
    runs = []
    for key in ("billing-first", "billing-second"):
        runs.append(
            subprocess.run(
                [sys.executable, "-m", "dislock.cli", "DATABASE_URL", "touch", str(tmp_path / key)],
                env={**env, "LOCK_KEY": key},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        )
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[1].returncode == 1, runs[1]
    assert runs[1].stderr.count("\n") == 1, runs[1].stderr
    assert "may hold at most 1 key in" in runs[1].stderr and "Traceback" not in runs[1].stderr
    assert (tmp_path / "billing-first").exists() and not (tmp_path / "billing-second").exists()


def test_the_default_quota_and_no_limit(fleet: Fleet) -> None:
    """Every grant has a quota unless it says ``--max-keys 0``; ``grants`` lists it."""
    status, out, err = ctl(fleet.admin_url, "grants", "--json", table=fleet.table)
    assert status == 0, err
    listed = {g["role"]: g for g in json.loads(out)["grants"]}
    assert listed[role_of(fleet.billing)]["max_keys"] == DEFAULT_MAX_KEYS
    assert listed[role_of(fleet.reader)]["max_keys"] is None
    assert listed[role_of(fleet.ops)]["max_keys"] is None  # an operator: a person's role
    regrant(fleet, fleet.billing, "--max-keys", "1")
    with LeaseLock(context(fleet, fleet.billing, "billing-a")):
        pass
    with pytest.raises(KeyNotGrantedError):
        LeaseLock(context(fleet, fleet.billing, "billing-b")).__enter__()
    said = regrant(fleet, fleet.billing, "--max-keys", "0")
    assert said.rstrip().endswith("(any number of keys)"), said
    for n in range(3):
        with LeaseLock(context(fleet, fleet.billing, f"billing-{n}")):
            pass
    assert lock_key_count(fleet) == 4
    status, out, _ = ctl(fleet.admin_url, "grants", table=fleet.table)
    line = next(line for line in out.splitlines() if line.startswith(role_of(fleet.billing)))
    assert line.endswith("(any number of keys), 256 MiB of history"), out


@pytest.mark.parametrize("bad", ["-1", "many", "1.5"])
def test_a_bad_quota_is_one_line(fleet: Fleet, bad: str) -> None:
    ran = subprocess.run(
        [
            *(sys.executable, "-m", "dislock.cli.ctl", "DISLOCK_ADMIN_URL"),
            *("--table", ".".join(fleet.table), "grant", role_of(fleet.billing)),
            *("--keys", "billing-*", "--max-keys", bad),
        ],
        env={"PATH": "/usr/bin:/bin", "DISLOCK_ADMIN_URL": fleet.admin_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 2 and ran.stdout == "", ran
    assert "--max-keys" in ran.stderr and "whole number" in ran.stderr, ran.stderr
    assert ran.stderr.count("\n") == 1, ran.stderr


def test_the_owner_and_ungranted_fleets_have_no_quota(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """The table's owner is the administrator: no quota binds it, though the trigger
    fires for its inserts too."""
    regrant(fleet, fleet.billing, "--max-keys", "1")
    for n in range(3):
        with LeaseLock(context(fleet, fleet.admin_url, f"billing-owner-{n}")):
            pass
    assert lock_key_count(fleet) == 3


def test_over_its_quota_a_role_still_writes_the_rows_of_keys_it_has(fleet: Fleet) -> None:
    """A quota lowered below what a role holds refuses new keys only: the first
    schedule row of a key it already leases is not one more key."""
    keys = [f"billing-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for key in keys:
        with LeaseLock(context(fleet, fleet.billing, key)):
            pass
    regrant(fleet, fleet.billing, "--max-keys", "1")
    with ScheduleLock(context(fleet, fleet.billing, keys[0])):
        pass
    with pytest.raises(KeyNotGrantedError, match="may hold at most 1 key in"):
        LeaseLock(context(fleet, fleet.billing, "billing-new")).__enter__()


def test_a_member_of_a_granted_role_is_held_to_its_quota(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """A login role that takes its grant through a team's role (GRANT team TO member)
    is held to the team's quota, though it has no quota of its own."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    member = f"dislock_sec_member_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(member)))
    try:
        db.execute(
            sql.SQL("GRANT {} TO {}").format(
                sql.Identifier(role_of(fleet.billing)), sql.Identifier(member)
            )
        )
        regrant(fleet, fleet.billing, "--max-keys", "2")
        url = make_conninfo("", **{**conninfo_to_dict(fleet.billing), "user": member})
        for n in range(2):
            with LeaseLock(context(fleet, url, f"billing-member-{n}")):
                pass
        before = snapshot(fleet)
        with pytest.raises(KeyNotGrantedError, match="may hold at most 2 keys"):
            LeaseLock(context(fleet, url, "billing-member-2")).__enter__()
        assert snapshot(fleet) == before
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(member)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(member)))


def test_a_keys_further_slots_are_bounded_as_dislock_numbers_them(fleet: Fleet) -> None:
    """The quota counts keys, so a key's slot rows must not be without end: a granted
    role writes slots 2 to the most a lease may have (``LOCK_SLOTS``), as dislock
    numbers them, and no others."""
    import re

    from dislock.core.kinds import SLOT_NUMBER
    from dislock.core.variables import SLOTS

    plain_writes(fleet, BILLING_ROLE)  # by hand, not only through the lock functions
    numbers = re.compile(f"^{SLOT_NUMBER}$")
    assert [n for n in range(0, int(SLOTS.high) + 100) if numbers.match(str(n))] == list(
        range(2, int(SLOTS.high) + 1)
    )
    table = sql.Identifier(*fleet.table)
    insert = sql.SQL("INSERT INTO {} VALUES (%s, 'o', NOW() + interval '5 seconds')").format(table)
    with fleet.connect(fleet.billing) as billing:
        billing.execute(insert, (f"cronjob-lock:lease#{int(SLOTS.high)}:billing-x",))
        before = snapshot(fleet)
        for slot in (str(int(SLOTS.high) + 1), "02", "99999"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                billing.execute(insert, (f"cronjob-lock:lease#{slot}:billing-x",))
    assert snapshot(fleet) == before

"""``dislockctl check`` and failover: a read-only session, the timeline and the lock delay.

(A real standby is refused in tests/reliability/test_failover.py.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dislock.core.failover import CURRENT_TIMELINE, TIMELINE_KEY

CTL = [sys.executable, "-m", "dislock.cli.ctl", "DATABASE_URL", "check"]


def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CTL, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_check_refuses_a_read_only_session_in_one_line(cli_env: dict[str, str]) -> None:
    params = conninfo_to_dict(cli_env["DATABASE_URL"])
    params["options"] = "-c default_transaction_read_only=on"
    result = check({**cli_env, "DATABASE_URL": make_conninfo("", **params)})
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "read-only" in result.stderr and "default_transaction_read_only" in result.stderr


def test_check_shows_the_standbys_and_whether_a_commit_waits_for_one(
    cli_env: dict[str, str], db: psycopg.Connection[Any], lock_table: tuple[str, str]
) -> None:
    from tests.support.herd import limited_role
    from tests.support.replication import NOWHERE, synchronous_standby_nowhere

    alone = check(cli_env)
    assert alone.returncode == 0, alone.stderr
    assert "\n  standbys        0\n" in alone.stdout
    assert (
        "\n  synchronous     no: a commit waits for no standby (synchronous_standby_names='',"
        " synchronous_commit=on)\n"
    ) in alone.stdout
    with limited_role(db, cli_env["DATABASE_URL"], lock_table, 5) as url:
        unprivileged = check({**cli_env, "DATABASE_URL": url})
        assert unprivileged.returncode == 0, unprivileged.stderr
        assert (
            "\n  standbys        0 (names and states need pg_monitor, which this role lacks)\n"
        ) in unprivileged.stdout
        role = sql.Identifier(str(conninfo_to_dict(url)["user"]))
        db.execute(sql.SQL("GRANT pg_monitor TO {}").format(role))
        monitor = check({**cli_env, "DATABASE_URL": url})
        assert "\n  standbys        0\n" in monitor.stdout, monitor.stdout
    with synchronous_standby_nowhere(db, cli_env["DATABASE_URL"]):
        waits = check(cli_env)  # (it only reads: nothing of it waits)
        params = conninfo_to_dict(cli_env["DATABASE_URL"])
        params["options"] = "-c synchronous_commit=local"
        local = check({**cli_env, "DATABASE_URL": make_conninfo("", **params)})
    assert (
        "\n  synchronous     yes: a commit waits for a standby (synchronous_standby_names="
        f"'{NOWHERE}', synchronous_commit=on)\n"
    ) in waits.stdout, waits.stdout
    assert "\n  synchronous     no: a commit waits for no standby" in local.stdout, local.stdout


def test_check_shows_the_timeline_and_a_running_lock_delay(
    cli_env: dict[str, str], db: psycopg.Connection[Any], lock_table: tuple[str, str]
) -> None:
    before = check(cli_env)
    assert before.returncode == 0, before.stderr
    assert "timeline        not recorded yet" in before.stdout
    taken = subprocess.run(
        [sys.executable, "-m", "dislock.cli", "DATABASE_URL", "true"],
        env={**cli_env, "LOCK_STRATEGY": "lease"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert taken.returncode == 0, taken.stderr
    recorded = check(cli_env)
    line = next(line for line in recorded.stdout.splitlines() if "timeline" in line)
    assert line.split()[1].isdigit() and "lock delay" not in line
    table = sql.Identifier(*lock_table)
    db.execute(sql.SQL("UPDATE {} SET value = '999' WHERE key = %s").format(table), (TIMELINE_KEY,))
    changed = check(cli_env)
    assert "(recorded 999: the next lock taken starts a lock delay" in changed.stdout
    timeline = db.execute(CURRENT_TIMELINE).fetchone()
    assert timeline is not None
    # The failover noticed 30 s ago; the lease above recorded the default TTL, 60 s.
    db.execute(
        sql.SQL(
            "UPDATE {} SET value = %s, expire_at = NOW() - interval '30 seconds' WHERE key = %s"
        ).format(table),
        (str(timeline[0]), TIMELINE_KEY),
    )
    delayed = check(cli_env)
    said = re.search(
        r"lock delay after failover: each key waits for the longest TTL of the roles that"
        r" may hold it, the last ends in (\d+\.\d)s",
        delayed.stdout,
    )
    assert said is not None, delayed.stdout
    assert 0 < float(said[1]) <= 30

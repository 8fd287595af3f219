"""The lock functions beside the table (``dislock.core.protocol``): a table without them
works as before, ``init`` adds them (the docs' block as pasted), a second ``init``
writes nothing, an older version is rewritten, and ``--print-sql`` carries them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.protocol import ARGUMENTS, VERSION, function, signature
from tests.cli.conftest import Ctl, RunCli, dislock_on_path, run_pasted

HEADING = "## The lock functions beside the table"


def _functions(db: psycopg.Connection[Any], table: tuple[str, str]) -> dict[str, tuple[str, Any]]:
    """The table's lock functions found: name (a key of ARGUMENTS) -> (comment, row version)."""
    found = {}
    for name in ARGUMENTS:
        row = db.execute(
            "SELECT obj_description(p.oid, 'pg_proc'), p.xmin::text FROM pg_proc p"
            " WHERE p.oid = to_regprocedure(%s)",
            (signature(table, name),),
        ).fetchone()
        if row is not None:
            found[name] = (row[0], row[1])
    return found


def _drop_functions(db: psycopg.Connection[Any], table: tuple[str, str]) -> None:
    for name in ARGUMENTS:
        db.execute(sql.SQL("DROP FUNCTION IF EXISTS {} CASCADE").format(function(table, name)))


def _calls(db: psycopg.Connection[Any], table: tuple[str, str], name: str) -> int:
    row = db.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
        " WHERE funcid = to_regprocedure(%s)",
        (signature(table, name),),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _calls_reach(db: psycopg.Connection[Any], table: tuple[str, str], name: str) -> int:
    """The calls counted once the exited wrapper's backend has flushed its statistics."""
    deadline = time.monotonic() + 10
    while (calls := _calls(db, table, name)) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return calls


@pytest.fixture
def lease_env(cli_env: dict[str, str]) -> dict[str, str]:
    """A lease run whose server session counts its function calls."""
    return {**cli_env, "LOCK_STRATEGY": "lease", "PGOPTIONS": "-c track_functions=all"}


def test_a_table_without_the_functions_works_until_init_adds_them(
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    lease_env: dict[str, str],
    run_cli: RunCli,
    tmp_path: Path,
) -> None:
    _drop_functions(db, lock_table)
    ran = run_cli(["DATABASE_URL", "echo", "ran"], lease_env)
    assert (ran.returncode, ran.stdout) == (0, "ran\n"), ran.stderr
    assert _functions(db, lock_table) == {}
    # The lease was taken and released all the same, by the plain statements.
    (row,) = db.execute(
        sql.SQL("SELECT value, expire_at <= now() FROM {} WHERE key = %s").format(
            sql.Identifier(*lock_table)
        ),
        (f"cronjob-lock:lease:{lease_env['LOCK_KEY']}",),
    ).fetchall()
    assert row[0].endswith(" (released)") and row[1]

    pasted = run_pasted("schema.md", HEADING, {**lease_env, "PATH": dislock_on_path(tmp_path)})
    assert pasted.returncode == 0, pasted.stderr
    found = _functions(db, lock_table)
    assert set(found) == set(ARGUMENTS)
    assert {comment for comment, _ in found.values()} >= {VERSION}

    ran = run_cli(["DATABASE_URL", "echo", "again"], lease_env)
    assert (ran.returncode, ran.stdout) == (0, "again\n"), ran.stderr
    assert _calls_reach(db, lock_table, "acquire") == 1
    assert _calls_reach(db, lock_table, "release") == 1


def test_a_second_init_writes_nothing_and_an_older_version_is_rewritten(
    db: psycopg.Connection[Any], lock_table: tuple[str, str], ctl: Ctl
) -> None:
    assert ctl("init").returncode == 0
    before = _functions(db, lock_table)
    again = ctl("init")
    assert again.returncode == 0 and "already exists" in again.stdout
    assert _functions(db, lock_table) == before

    acquire = function(lock_table, "acquire")
    db.execute(
        sql.SQL(
            "COMMENT ON FUNCTION {}(text, text, text, timestamptz, float8, boolean)"
            " IS 'dislock protocol 0'"
        ).format(acquire)
    )
    upgraded = ctl("init")
    assert upgraded.returncode == 0 and "is ready" in upgraded.stdout, upgraded.stderr
    after = _functions(db, lock_table)
    assert after["acquire"][0] == VERSION
    assert after["acquire"][1] != before["acquire"][1]


def test_print_sql_carries_the_functions(
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    lease_env: dict[str, str],
    ctl: Ctl,
    run_cli: RunCli,
) -> None:
    _drop_functions(db, lock_table)
    printed = ctl("init", "--print-sql")
    assert printed.returncode == 0, printed.stderr
    # The lock functions, and the audit trail's writer.
    assert printed.stdout.count("CREATE OR REPLACE FUNCTION") == len(ARGUMENTS) + 1
    assert function(lock_table, "acquire").as_string(None) in printed.stdout
    db.execute(printed.stdout.encode())  # as a migration tool would apply it
    assert len(_functions(db, lock_table)) == len(ARGUMENTS)
    ran = run_cli(["DATABASE_URL", "true"], lease_env)
    assert ran.returncode == 0, ran.stderr
    assert _calls_reach(db, lock_table, "acquire") == 1


def test_check_says_what_init_would_add(
    db: psycopg.Connection[Any], lock_table: tuple[str, str], ctl: Ctl
) -> None:
    assert ctl("init").returncode == 0
    before = ctl("check")
    assert before.returncode == 0, before.stderr
    assert "  lock functions  installed (one call per lock step)" in before.stdout
    _drop_functions(db, lock_table)
    after = ctl("check")
    assert after.returncode == 0, after.stderr
    assert "  lock functions  not installed: plain statements are sent" in after.stdout
    assert "init adds the functions" in after.stdout

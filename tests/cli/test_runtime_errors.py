"""Runtime failures: exit 1, one line, no traceback, no password, no lock claimed."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from dislock.core.rows import lease_key, schedule_key
from tests.cli.conftest import RunCli
from tests.support.proxy import SilentHost
from tests.support.rows import Rows


def assert_one_line_failure(result: Any, *expected: str) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in lines[0]


def test_unreachable_database(run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path) -> None:
    env = {
        **cli_env,
        "DATABASE_URL": "postgresql://app:hunter2-secret@127.0.0.1:1/app",
        # A refused connection is retried (it may be a restarting server): briefly here.
        "LOCK_CONNECT_PATIENCE_SECONDS": "0.5",
    }
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_one_line_failure(result, "cannot connect to the database", "password=***")
    # libpq's two lines, joined as two sentences: not "Connection refused Is the server"
    assert "Connection refused. Is the server running" in result.stderr
    assert "hunter2" not in result.stderr
    assert not marker.exists()


def test_a_host_that_never_answers_is_reported_after_the_patience(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with SilentHost() as silent:
        env = {
            **cli_env,
            "DATABASE_URL": silent.alone(cli_env["DATABASE_URL"]),
            "LOCK_STRATEGY": "lease",
            "LOCK_CONNECT_PATIENCE_SECONDS": "3",
        }
        started = time.monotonic()
        result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
        elapsed = time.monotonic() - started
    assert_one_line_failure(
        result,
        "cannot connect to the database",
        "unreachable for",
        "(LOCK_CONNECT_PATIENCE_SECONDS=3)",
        "timeout expired",
    )
    assert elapsed >= 3
    assert not marker.exists()


def test_a_slot_that_ends_while_no_host_answers_is_named(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with SilentHost() as silent:
        env = {
            **cli_env,
            "DATABASE_URL": silent.alone(cli_env["DATABASE_URL"]),
            "CRON_SCHEDULE": "* * * * * */4",  # a slot every 4 s (seconds last)
            "LOCK_CONNECT_PATIENCE_SECONDS": "60",
        }
        started = time.monotonic()
        result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
        elapsed = time.monotonic() - started
    assert_one_line_failure(
        result,
        f"the schedule slot of {cli_env['LOCK_KEY']!r} ending ",
        " ended while the database was unreachable for ",
        "the command did not run",
    )
    assert elapsed < 30  # the slot's end, not the 60 s patience
    assert not marker.exists()


def test_missing_table_names_it_and_how_to_create_it(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**cli_env, "LOCK_TABLE": "no_such_locks"}
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_one_line_failure(
        result,
        "lock table no_such_locks does not exist",
        'CREATE TABLE IF NOT EXISTS "no_such_locks"',
    )
    assert not marker.exists()


@pytest.fixture
def restricted_url(db: psycopg.Connection[Any], database_url: str) -> Any:
    """A role that may connect but has no rights on the lock table."""
    role = f"r_{uuid.uuid4().hex[:8]}"
    db.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'hunter2-secret'").format(sql.Identifier(role))
    )
    params = conninfo_to_dict(database_url)
    params.update(user=role, password="hunter2-secret")
    yield make_conninfo("", **params)
    db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_permission_denied(
    run_cli: RunCli, cli_env: dict[str, str], restricted_url: str, tmp_path: Path
) -> None:
    env = {**cli_env, "DATABASE_URL": restricted_url}
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_one_line_failure(result, "permission denied")
    assert "hunter2" not in result.stderr
    assert not marker.exists()


def test_read_only_database_claims_nothing(
    run_cli: RunCli, cli_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    params = conninfo_to_dict(cli_env["DATABASE_URL"])
    params["options"] = "-c default_transaction_read_only=on"
    env = {**cli_env, "DATABASE_URL": make_conninfo("", **params)}
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_one_line_failure(result, "read-only")
    assert not marker.exists()
    table = sql.Identifier(*cli_env["LOCK_TABLE"].split("."))
    count = db.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    assert count == (0,)


def test_debug_level_shows_the_traceback_but_still_no_password(
    run_cli: RunCli, cli_env: dict[str, str]
) -> None:
    env = {
        **cli_env,
        "DATABASE_URL": "postgresql://app:hunter2-secret@127.0.0.1:1/app",
        "CRONJOB_LOCK_LOG_LEVEL": "DEBUG",
        "LOCK_CONNECT_PATIENCE_SECONDS": "0.5",
    }
    result = run_cli(["DATABASE_URL", "true"], env)
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "retrying" in result.stderr  # the refusals were waited out first, and logged
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize(("program", "status"), [("no-such-command-dislock", 127), ("/etc", 126)])
def test_unrunnable_command_fails_before_taking_any_lock(
    run_cli: RunCli, cli_env: dict[str, str], rows: Rows, program: str, status: int
) -> None:
    env = {**cli_env, "LOCK_STRATEGY": "schedule,lease"}
    result = run_cli(["DATABASE_URL", program], env)
    assert result.returncode == status
    assert ("command not found" if status == 127 else "permission denied") in result.stderr
    # A typo in a crontab must not use up the slot for every machine.
    assert rows.get(schedule_key(cli_env["LOCK_KEY"])) is None
    assert rows.get(lease_key(cli_env["LOCK_KEY"])) is None


@pytest.mark.parametrize("content", [b"echo no #! line\n", b"\x7fELF not really"])
def test_an_executable_that_is_no_program_exits_126_in_one_line(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path, content: bytes
) -> None:
    """What env(1) and the shells say of it (exec format error), with their 126."""
    program = tmp_path / "job"
    program.write_bytes(content)
    program.chmod(0o755)
    result = run_cli(["DATABASE_URL", str(program)], cli_env)
    assert result.returncode == 126, result.stderr
    assert result.stderr == f"dislock: error: cannot run '{program}': exec format error\n"


def test_missing_column_claims_no_lock(
    run_cli: RunCli, cli_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    schema = cli_env["LOCK_TABLE"].split(".")[0]
    db.execute(
        sql.SQL("CREATE TABLE {}.no_value (key text PRIMARY KEY, expire_at timestamptz)").format(
            sql.Identifier(schema)
        )
    )
    marker = tmp_path / "ran"
    env = {**cli_env, "LOCK_TABLE": f"{schema}.no_value"}
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_one_line_failure(result, "lacks a column dislock needs")
    assert not marker.exists()
    count = db.execute(
        sql.SQL("SELECT count(*) FROM {}.no_value").format(sql.Identifier(schema))
    ).fetchone()
    assert count == (0,)


def test_password_never_printed_even_at_debug_on_a_working_run(
    run_cli: RunCli, cli_env: dict[str, str]
) -> None:
    params = conninfo_to_dict(cli_env["DATABASE_URL"])
    params["password"] = "hunter2-secret"  # trust authentication ignores it
    env = {
        **cli_env,
        "DATABASE_URL": make_conninfo("", **params),
        "LOCK_STRATEGY": "schedule,lease",
        "CRONJOB_LOCK_LOG_LEVEL": "DEBUG",
    }
    first = run_cli(["DATABASE_URL", "true"], env)
    second = run_cli(["DATABASE_URL", "true"], env)  # the slot is taken: the skip is logged
    assert first.returncode == 0 and second.returncode == 0
    assert "acquired lease" in first.stderr and "not running" in second.stderr
    assert "hunter2" not in first.stderr + second.stderr


def test_a_missing_history_table_is_one_warning_line_and_the_run_goes_on(
    run_cli: RunCli, cli_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    env = {**cli_env, "LOCK_HISTORY": "1", "LOCK_HISTORY_TABLE": "no_such_history"}
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert result.returncode == 0 and marker.exists(), result.stderr
    (line,) = result.stderr.splitlines()  # not the statement the server quotes
    assert line == (
        f"dislock: could not record the start of {env['LOCK_KEY']!r} in history table"
        ' no_such_history: relation "no_such_history" does not exist'
        " (dislockctl init --history creates it)"
    ), line

"""``dislockctl rerun``: one more run of a key's current slot, whatever became of it,
taken once by the next wrapper that starts; refused while a run holds the lease."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from dislock.core.history import history_table
from dislock.core.rows import schedule_key
from tests.cli.conftest import DISLOCK, Ctl, RunCli
from tests.support.eventually import eventually
from tests.support.rows import Rows, history_runs


def _job(marker: Path, status: int) -> list[str]:
    return ["DATABASE_URL", "sh", "-c", f'echo "$DISLOCK_ATTEMPT" >> "{marker}"; exit {status}']


def _runs(marker: Path) -> list[str]:
    return marker.read_text().split() if marker.exists() else []


def test_a_failed_slot_is_run_once_more_after_a_rerun_and_only_once(
    history_env: dict[str, str],
    run_cli: RunCli,
    ctl: Ctl,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    marker = tmp_path / "runs"
    env = history_env
    assert run_cli(_job(marker, 3), env).returncode == 3
    assert run_cli(_job(marker, 0), env).returncode == 0
    assert _runs(marker) == ["1"], "without a rerun the slot is spent"

    result = ctl("rerun", env["LOCK_KEY"], "--reason", "fixed the export bucket", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"reopened the slot of {env['LOCK_KEY']!r} that ends ")
    assert "the next wrapper to start before then, on any machine, runs it; recorded in" in (
        result.stdout
    )

    assert run_cli(_job(marker, 0), env).returncode == 0
    assert run_cli(_job(marker, 0), env).returncode == 0
    assert _runs(marker) == ["1", "1"], "one run after the rerun, not two"

    runs = history_runs(db, history_table(lock_table), env["LOCK_KEY"])
    assert [run["outcome"] for run in runs] == ["failed", "rerun", "ok"]
    assert runs[1]["owner"] == "rerun by postgres: fixed the export bucket"
    # A rerun is not a start: missed still judges the slot by its runs.
    again = ctl("rerun", env["LOCK_KEY"], env=env)
    assert again.returncode == 0 and "reopened" in again.stdout


def test_a_rerun_of_a_slot_whose_retries_are_used_gives_a_fresh_first_attempt(
    cli_env: dict[str, str], run_cli: RunCli, ctl: Ctl, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    env = {**cli_env, "LOCK_RETRIES": "1", "LOCK_RETRY_DELAY_SECONDS": "1"}
    assert run_cli(_job(marker, 3), env).returncode == 3

    def second_attempt() -> bool:
        run_cli(_job(marker, 4), env)
        return len(_runs(marker)) == 2

    eventually(second_attempt, timeout=60, interval=0.5)
    assert run_cli(_job(marker, 0), env).returncode == 0
    assert _runs(marker) == ["1", "2"]
    result = ctl("rerun", env["LOCK_KEY"], env=env)
    assert result.returncode == 0, result.stderr
    assert "recorded" not in result.stdout  # no history table: nothing to record in
    assert run_cli(_job(marker, 0), env).returncode == 0
    assert _runs(marker) == ["1", "2", "1"]


def test_a_rerun_while_a_run_holds_the_lease_is_refused(
    cli_env: dict[str, str], ctl: Ctl, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    env = {**cli_env, "LOCK_STRATEGY": "schedule,lease", "RUN_LOCK_TTL_SECONDS": "30"}
    holder = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f'touch "{started}"; sleep 60'],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(started.exists, timeout=60)
        result = ctl("rerun", env["LOCK_KEY"], env=env)
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"dislockctl: error: a run of {env['LOCK_KEY']!r} is still going")
    finally:
        holder.terminate()
        holder.wait(timeout=30)


def test_a_rerun_of_a_slot_not_started_changes_nothing_and_a_typo_is_an_error(
    cli_env: dict[str, str],
    run_cli: RunCli,
    ctl: Ctl,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    marker = tmp_path / "runs"
    assert run_cli(_job(marker, 0), cli_env).returncode == 0
    Rows(db, lock_table).expire(schedule_key(cli_env["LOCK_KEY"]))  # as the slot's end would
    result = ctl("rerun", cli_env["LOCK_KEY"], env=cli_env)
    assert result.returncode == 0 and result.stdout.startswith("nothing to reopen"), result
    typo = ctl("rerun", "no-such-job", env=cli_env)
    assert typo.returncode == 1 and "no schedule lock row for 'no-such-job'" in typo.stderr
    long_reason = ctl("rerun", cli_env["LOCK_KEY"], "--reason", "x" * 1001, env=cli_env)
    assert long_reason.returncode == 2 and long_reason.stderr.count("\n") == 1


def test_a_rerun_the_history_refuses_is_still_a_rerun_and_leaves_no_half_row(
    history_env: dict[str, str],
    run_cli: RunCli,
    ctl: Ctl,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    """As under a grant made before the outcome ``rerun`` existed: the end is refused."""
    marker = tmp_path / "runs"
    assert run_cli(_job(marker, 0), history_env).returncode == 0
    history = history_table(lock_table)
    db.execute(
        sql.SQL("ALTER TABLE {} ADD CONSTRAINT no_rerun CHECK (outcome <> 'rerun')").format(
            sql.Identifier(*history)
        )
    )
    result = ctl("rerun", history_env["LOCK_KEY"], env=history_env)
    assert result.returncode == 0, result.stderr
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("dislockctl: warning: the rerun is not recorded in "), warning
    assert result.stdout.rstrip().endswith("; not recorded in " + ".".join(history))
    assert [run["outcome"] for run in history_runs(db, history, history_env["LOCK_KEY"])] == ["ok"]
    assert run_cli(_job(marker, 0), history_env).returncode == 0
    assert _runs(marker) == ["1", "1"]


def test_a_rerun_says_how_long_the_slot_has_left_and_refuses_too_little_of_it(
    history_env: dict[str, str], ctl: Ctl, db: psycopg.Connection[Any], lock_table: tuple[str, str]
) -> None:
    """A slot that ends in 58 s has less than a minute left; one that ends in half an hour
    less than the two hours its key's runs take; one that ends in a day enough.  --force
    reopens the first two."""
    rows, key = Rows(db, lock_table), history_env["LOCK_KEY"]
    # Ten runs of two hours: the key's envelope (dislock.cli.runs.envelope), from 10 on.
    runs = sql.SQL(
        "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome)"
        " SELECT %s, 'schedule', 'o', 'h', 1, now() - n * interval '3 hours',"
        " now() - n * interval '3 hours' + interval '2 hours', 'ok'"
        " FROM generate_series(1, %s) AS n"
    ).format(sql.Identifier(*history_table(lock_table)))
    rows.plant(schedule_key(key), "web-1:1:aa", 1)
    for seconds, recorded, why in ((58, 9, "a minute"), (1800, 10, "its usual runtime (2h00m")):
        db.execute(runs, (key, recorded))
        rows.steal(schedule_key(key), "web-1:1:aa", seconds)  # a slot taken, ending so
        before = rows.get(schedule_key(key))
        refused = ctl("rerun", key, env=history_env)
        assert refused.returncode == 1, refused
        (line,) = refused.stderr.splitlines()
        assert line.startswith(f"dislockctl: error: not reopened: the slot of {key!r} ends ")
        assert f", in {'5' if seconds == 58 else '29m'}" in line and f"less than {why}" in line
        assert line.endswith("--force reopens it anyway"), line
        assert rows.get(schedule_key(key)) == before, "a refused rerun leaves the slot alone"
        forced = ctl("rerun", key, "--force", env=history_env)
        assert forced.returncode == 0 and forced.stdout.startswith("reopened"), forced
    rows.steal(schedule_key(key), "web-1:1:aa", 86400)
    result = ctl("rerun", key, env=history_env)
    assert result.returncode == 0, result.stderr
    ends = rf"reopened the slot of {re.escape(repr(key))} that ends \S+ \S+ UTC, in 23h5\dm"
    assert re.match(ends, result.stdout), result.stdout

"""dislockctl for a fleet: an honest ls, pause/resume, run history, missed slots."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.cli.runs.missed_slots import Slot, from_first_run, schedule_slots, slot_indexes
from dislock.cli.time_args import parse_duration, parse_time
from dislock.core.errors import ConfigurationError
from dislock.core.rows import lease_key, pause_key, schedule_key
from tests.cli.conftest import CTL, DISLOCK, Ctl, RunCli, env_context, holding
from tests.support.clock import clear_of_boundary
from tests.support.eventually import wait_for
from tests.support.rows import Rows

LEASE = {"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "2", "LOCK_LEASE_INTERVAL": "0.3"}


def history_table(cli_env: dict[str, str]) -> sql.Identifier:
    schema, table = cli_env["LOCK_TABLE"].split(".")
    return sql.Identifier(schema, f"{table}_history")


@pytest.fixture
def with_history(ctl: Ctl, cli_env: dict[str, str]) -> dict[str, str]:
    """The test's environment with a history table, recording runs."""
    created = ctl("init", "--history")
    assert created.returncode == 0, created.stderr
    assert "history table" in created.stdout
    return {**cli_env, "LOCK_HISTORY": "1", "CRONJOB_LOCK_LOG_LEVEL": "INFO"}


def test_help_shows_status_as_an_alias_and_every_command() -> None:
    result = subprocess.run([*CTL, "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    commands = [
        line.split()[0]
        for line in result.stdout.splitlines()
        if line.startswith("    ") and not line.startswith("     ")
    ]
    assert "ls (status)" in result.stdout
    assert "status" not in commands
    for command in ("init", "ls", "release", "pause", "resume", "history", "missed", "check"):
        assert command in commands


def test_ls_tells_held_released_expired_ended_and_paused(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows, run_cli: RunCli
) -> None:
    key = cli_env["LOCK_KEY"]
    released = run_cli(["DATABASE_URL", "true"], {**cli_env, **LEASE, "LOCK_KEY": "released-job"})
    assert released.returncode == 0, released.stderr
    insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, NOW() + make_interval(secs => %s))")
    for row_key, value, seconds in [
        (lease_key("held-job"), "h:1:aa", 60),
        (lease_key("dead-job"), "d:1:bb", -300),  # its holder stopped renewing
        (schedule_key("old-slot"), "s:1:cc", -60),
    ]:
        rows.db.execute(insert.format(rows.table), (row_key, value, seconds))
    paused = ctl("pause", key, "--for", "2h", "--reason", "disk full")
    assert paused.returncode == 0, paused.stderr
    # NOW() + 2h, to the second: no microseconds in what people read
    assert re.search(
        r" until 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d \(disk full\)", paused.stdout
    )

    listing = ctl("ls")
    assert listing.returncode == 0, listing.stderr
    state = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert state["held-job"].endswith("running")
    assert state["released-job"].endswith("released") and ":" in state["released-job"]
    assert "(released)" not in state["released-job"]  # the owner is shown without the mark
    assert state["dead-job"].endswith("expired")
    assert state["old-slot"].endswith("ended")
    assert state[key].endswith("paused: disk full") and "until 20" in state[key]
    assert re.search(r"until 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d ", state[key]), state[key]

    entries = {e["lock_key"]: e for e in json.loads(ctl("ls", "--json").stdout)}
    assert {name: e["state"] for name, e in entries.items()} == {
        "held-job": "held",
        "released-job": "released",
        "dead-job": "expired",
        "old-slot": "ended",
        key: "paused",
    }
    assert entries[key]["reason"] == "disk full" and entries[key]["mode"] == "pause"

    forced = ctl("release", "held-job")
    assert forced.returncode == 0 and "released lease 'held-job' held by h:1:aa" in forced.stdout
    after = json.loads(ctl("ls", "held-job", "--json").stdout)
    assert [(e["state"], e["owner"], e["forced"]) for e in after] == [("released", "h:1:aa", True)]
    assert "released (by dislockctl as " in ctl("ls", "held-job").stdout  # its role and host


def test_release_of_a_key_without_a_row_fails(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows
) -> None:
    result = ctl("release", "no-such-job")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "dislockctl: error: no schedule or lease lock row for 'no-such-job' in "
        f"{cli_env['LOCK_TABLE']} (see dislockctl ls)"
    )
    rows.db.execute(
        sql.SQL("INSERT INTO {} VALUES (%s, 'x', NOW() - interval '1 minute')").format(rows.table),
        (lease_key("old-job"),),
    )
    idle = ctl("release", "old-job")  # a row, but nothing held: not an error
    assert idle.returncode == 0 and idle.stdout.startswith("nothing to release")


def test_pause_and_resume_across_wrappers(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows, run_cli: RunCli, tmp_path: Path
) -> None:
    key = cli_env["LOCK_KEY"]
    env = {**cli_env, "LOCK_STRATEGY": "schedule,lease", "CRONJOB_LOCK_LOG_LEVEL": "INFO"}
    paused = ctl("pause", key, "--reason", "vendor outage")
    assert paused.returncode == 0, paused.stderr
    assert f"paused {key!r} until resumed (vendor outage)" in paused.stdout
    assert "has no lock row yet" in paused.stderr  # a typo would show here

    marker = tmp_path / "ran"
    skipped = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert skipped.returncode == 0 and not marker.exists()
    assert skipped.stderr.strip() == (
        f"dislock: not running touch: {key!r} is paused until resumed: vendor outage"
    )
    assert rows.get(schedule_key(key)) is None  # the slot was not used up

    assert ctl("resume", key).returncode == 0
    assert rows.get(pause_key(key)) is None
    again = ctl("resume", key)
    assert again.returncode == 1 and again.stderr.strip() == (
        f"dislockctl: error: {key!r} is not paused"
    )
    ran = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert ran.returncode == 0 and marker.exists(), ran.stderr


def test_check_says_a_paused_key_would_skip(ctl: Ctl, cli_env: dict[str, str]) -> None:
    key = cli_env["LOCK_KEY"]
    assert "paused" not in ctl("check").stdout
    assert ctl("pause", key, "--for", "90m", "--reason", "upgrade").returncode == 0
    checked = ctl("check")
    assert checked.returncode == 0, checked.stderr
    assert "paused          for 1h29m" in checked.stdout or "for 1h30m" in checked.stdout
    assert "upgrade: a run now would skip" in checked.stdout
    assert "history         off" in checked.stdout


def test_check_shows_the_history_table(ctl: Ctl, with_history: dict[str, str]) -> None:
    checked = subprocess.run(
        [*CTL, "DATABASE_URL", "check"],
        env=with_history,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    line = next(line for line in checked.stdout.splitlines() if "history" in line)
    assert line.strip().endswith("key_value_history")
    missing = subprocess.run(
        [*CTL, "DATABASE_URL", "check"],
        env={**with_history, "LOCK_HISTORY_TABLE": "nowhere"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert "nowhere (MISSING: dislockctl init --history" in missing.stdout


def test_check_shows_the_bounds_of_a_run(
    ctl: Ctl, with_history: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    env = {
        **with_history,
        "CRON_SCHEDULE": "0 3 * * *",
        "LOCK_MAX_RUNTIME_SECONDS": "3600",
        "LOCK_RETRIES": "2",
        "LOCK_RETRY_DELAY_SECONDS": "300",
        "LOCK_START_DEADLINE_SECONDS": "21600",
        "LOCK_OUTPUT_TAIL_BYTES": "4096",
        "LOCK_STRATEGY": "schedule,lease",
        "LOCK_REPLACE": "1",
    }
    assert "  replace " not in ctl("check", env={**env, "LOCK_REPLACE": "0"}).stdout
    checked = ctl("check", env=env)
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout
    assert "  max runtime     3600 s (then SIGTERM" in lines
    assert "  retries         2 more attempts in a failed slot, the first 300 s after" in lines
    assert "must tick more often than the schedule" in lines
    assert "  start deadline  21600 s after the slot began" in lines
    assert "  output tail     the last 4096 bytes of stdout and of stderr" in lines, lines
    assert "  replace         a running copy is asked to stop (it exits 75)" in lines, lines
    assert "MISSING" not in lines
    db.execute(
        sql.SQL("ALTER TABLE {} DROP COLUMN stdout_tail, DROP COLUMN stderr_tail").format(
            history_table(with_history)
        )
    )
    again = ctl("check", env=env).stdout
    assert "stderr, kept for a run that fails (its columns are MISSING" in again, again


def test_pause_until_a_time(ctl: Ctl, cli_env: dict[str, str], rows: Rows) -> None:
    key = cli_env["LOCK_KEY"]
    until = (datetime.now(timezone.utc) + timedelta(days=1)).replace(microsecond=0)
    result = ctl("pause", key, "--until", until.replace(tzinfo=None).isoformat())
    assert result.returncode == 0, result.stderr
    row = rows.get(pause_key(key))
    assert row is not None and row.expire_at == until and row.value == ""
    past = ctl("pause", key, "--until", "2001-01-01T00:00+00:00")
    assert past.returncode == 2 and "not in the future" in past.stderr
    row = rows.get(pause_key(key))
    assert row is not None and row.expire_at == until  # nothing written


def test_the_documented_pause_until_times_stay_in_the_future(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows
) -> None:
    """An absolute ``--until`` in the docs is decades ahead: one a year ahead is refused
    (not in the future) the year after."""
    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *root.glob("docs/*.md"), *root.glob("packages/*/README.md")]
    times = [t for page in pages for t in re.findall(r"--until (\S+)", page.read_text())]
    times += re.findall(r"like (\S+) or (\S+),", ctl("pause", "k", "--until", "soon").stderr)[0]
    assert len(times) >= 3, times
    for text in times:
        assert parse_time(text, name="--until").year >= 2099, text
        result = ctl("pause", cli_env["LOCK_KEY"], "--until", text)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["pause", "job", "--for", "soon"], 2, "--for must be a duration"),
        (["pause", "job", "--for", "0s"], 2, "more than 0"),
        (["pause", "job", "--until", "tomorrow"], 2, "--until must be an ISO 8601 time"),
        (["pause", "job", "--for", "1h", "--until", "2030-01-01"], 2, "not allowed with"),
        (["pause", "job", "--reason", "two\nlines"], 2, "--reason must not contain control"),
        (["pause", "job", "--reason", "\u202eevil"], 2, "--reason must not contain control"),
        (["pause", "job", "--reason", "é" * 501], 2, "at most 1000 bytes"),
        (["history", "--since", "3 days"], 2, "--since must be a duration"),
        (["history", "--limit", "0"], 2, "positive whole number"),
        (["history", "job", "--prune-older-than", "30d"], 2, "drop LOCK_KEY"),
        (["missed", "job", "--schedule", "61 * * * *"], 2, "--schedule is not a valid cron"),
        (["missed", "job", "--since", "1y"], 2, "--since must be a duration"),
        (["history"], 1, "history table"),
        (["missed", "job"], 1, "init --history"),
        (["history", "--prune-older-than", "30d"], 1, "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows, args: Sequence[str], status: int, message: str
) -> None:
    result = ctl(*args)
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
    assert rows.get(pause_key("job")) is None


def test_init_print_sql_shows_the_history_table(ctl: Ctl, cli_env: dict[str, str]) -> None:
    printed = ctl("init", "--history", "--print-sql")
    assert printed.returncode == 0
    schema = cli_env["LOCK_TABLE"].split(".")[0]
    assert f'CREATE TABLE IF NOT EXISTS "{schema}"."key_value_history" (' in printed.stdout
    assert "(lock_key, started_at DESC)" in printed.stdout and "cron_tz text" in printed.stdout
    named = ctl("init", "--history", "--history-table", "ops.runs", "--print-sql")
    assert 'CREATE SCHEMA IF NOT EXISTS "ops";' in named.stdout
    assert 'CREATE TABLE IF NOT EXISTS "ops"."runs"' in named.stdout
    assert "key_value_history" not in ctl("init", "--print-sql").stdout


def test_history_shows_runs_newest_first_with_outcomes(
    ctl: Ctl, with_history: dict[str, str], run_cli: RunCli, db: psycopg.Connection[Any]
) -> None:
    env = {**with_history, **LEASE}
    key = env["LOCK_KEY"]
    assert run_cli(["DATABASE_URL", "true"], env).returncode == 0
    assert run_cli(["DATABASE_URL", "sh", "-c", "exit 4"], env).returncode == 4
    assert run_cli(["DATABASE_URL", "sh", "-c", "kill -KILL $$"], env).returncode == 137
    other = run_cli(["DATABASE_URL", "true"], {**env, "LOCK_KEY": f"{key}-other"})
    assert other.returncode == 0, other.stderr

    table = ctl("history", key)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "STARTED",
        "(UTC)",
        "LOCK",
        "KEY",
        "HOST",
        "PID",
        "DURATION",
        "OUTCOME",
    ]
    assert [line.split("  ")[-1].strip() for line in lines[1:]] == [
        "killed (SIGKILL)",
        "failed (4)",
        "ok",
    ]
    runs = json.loads(ctl("history", "--json").stdout)
    assert [run["key"] for run in runs][:1] == [f"{key}-other"] and len(runs) == 4
    for run in runs:
        assert {"key", "owner", "started_at", "ended_at", "outcome", "exit_code"} <= run.keys()
        assert run["duration_seconds"] >= 0 and run["host"] and run["pid"] > 0
    assert json.loads(ctl("history", "--limit", "1", "--json").stdout)[0]["key"] == f"{key}-other"
    # The window is measured on the database clock.
    db.execute(
        sql.SQL("UPDATE {} SET started_at = started_at - interval '2 days'").format(
            history_table(with_history)
        )
    )
    assert ctl("history", key).stdout.startswith("no runs of")
    assert len(json.loads(ctl("history", key, "--since", "3d", "--json").stdout)) == 3

    unknown = ctl("history", "no-such-job")
    assert unknown.returncode == 1 and "no run of 'no-such-job' is recorded" in unknown.stderr


def test_history_escapes_what_it_prints_as_ls_does(
    ctl: Ctl, with_history: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    """A row written by hand (or by a hostile machine): its terminal escapes are shown,
    never sent to the terminal, and the run stays on one line."""
    key = with_history["LOCK_KEY"]
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome)"
            " VALUES (%s, 'lease', 'o', %s, 1, NOW(), NOW(), %s)"
        ).format(history_table(with_history)),
        (key, "web\x1b]0;pwned\x07\x1b[2J1\nnext", "ok\x1b[31m"),
    )
    shown = ctl("history", key)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    lines = shown.stdout.splitlines()
    assert len(lines) == 2, shown.stdout
    assert "web\\x1b]0;pwned\\x07\\x1b[2J1\\nnext" in lines[1]
    assert lines[1].endswith("ok\\x1b[31m")
    (run,) = json.loads(ctl("history", key, "--json").stdout)
    assert run["host"] == "web\x1b]0;pwned\x07\x1b[2J1\nnext"  # JSON escapes it itself


def test_history_tells_running_from_abandoned(
    ctl: Ctl, with_history: dict[str, str], tmp_path: Path, rows: Rows
) -> None:
    env = {**with_history, **LEASE}
    key = env["LOCK_KEY"]
    script = f'touch "{tmp_path}/started"; exec sleep 60'
    holder = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", script],
        env=env,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(tmp_path / "started")
        (run,) = json.loads(ctl("history", key, "--json").stdout)
        assert run["outcome"] == "running" and run["ended_at"] is None
        # The machine dies: no end is written, and the lease runs out.
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=20)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=20)
    rows.expire(lease_key(key))
    (run,) = json.loads(ctl("history", key, "--json").stdout)
    assert run["outcome"] == "abandoned" and run["duration_seconds"] is None
    assert "abandoned" in ctl("history", key).stdout


def test_prune_deletes_old_runs_only(
    ctl: Ctl, with_history: dict[str, str], run_cli: RunCli, db: psycopg.Connection[Any]
) -> None:
    env = {**with_history, **LEASE}
    for _ in range(3):
        assert run_cli(["DATABASE_URL", "true"], env).returncode == 0
    db.execute(
        sql.SQL(
            "UPDATE {} SET started_at = started_at - interval '40 days'"
            " WHERE id IN (SELECT min(id) FROM {})"
        ).format(history_table(with_history), history_table(with_history))
    )
    pruned = ctl("history", "--prune-older-than", "30d")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("deleted 1 run(s) started more than 30d")
    assert len(json.loads(ctl("history", "--since", "1d", "--json").stdout)) == 2


def test_missed_lists_slots_nobody_started(
    ctl: Ctl,
    with_history: dict[str, str],
    run_cli: RunCli,
    db: psycopg.Connection[Any],
    rows: Rows,
) -> None:
    env = {**with_history, "LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": "* * * * *"}
    key = env["LOCK_KEY"]
    first = run_cli(["DATABASE_URL", "true"], env)
    assert first.returncode == 0, first.stderr
    # That run is moved back into the slot that began 3 minutes ago (by start
    # time and claimed slot end); the slots after it had none.  The reports below
    # must come in the same minute as the move, or the run leaves their 4-minute
    # window: they start in a minute's first half (a loaded machine's start-ups).
    clear_of_boundary(rows, "* * * * *", seconds=25)
    table = history_table(with_history)
    db.execute(
        sql.SQL(
            "UPDATE {} SET started_at = date_trunc('minute', NOW()) - interval '3 minutes',"
            " slot_end = date_trunc('minute', NOW()) - interval '2 minutes'"
        ).format(table)
    )
    result = ctl("missed", key, "--since", "4m", "--grace", "0", "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["schedule"] == "* * * * *" and report["runs"] == 1
    # Slots from 3 minutes ago to the current one (one more if a minute began meanwhile).
    assert report["slots"] in (4, 5)
    ends = [datetime.fromisoformat(slot["slot_end"]) for slot in report["missed"]]
    assert len(ends) == report["slots"] - 1  # all but the run's
    assert ends == sorted(ends) and all(end.second == 0 for end in ends)
    text = ctl("missed", key, "--since", "4m", "--grace", "0")
    assert text.returncode == 1
    assert f"{len(ends)} of {report['slots']} slot(s) of '* * * * *'" in text.stdout
    # A longer window judges the same slots: the job's first run is its first slot.
    longer = json.loads(ctl("missed", key, "--since", "10m", "--grace", "0", "--json").stdout)
    assert longer["slots"] in (4, 5) and len(longer["missed"]) == longer["slots"] - 1
    # Once a run before the window is known, every slot of the window is judged.
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, owner, host, pid, modes, started_at, ended_at, outcome)"
            " SELECT lock_key, owner, host, pid, modes, started_at - interval '1 hour',"
            " ended_at - interval '1 hour', outcome FROM {}"
        ).format(table, table)
    )
    older = json.loads(ctl("missed", key, "--since", "10m", "--grace", "0", "--json").stdout)
    assert older["slots"] in (10, 11) and len(older["missed"]) == older["slots"] - 1

    judged_later = ctl("missed", key, "--since", "4m", "--grace", "5m")
    assert judged_later.returncode == 0 and "0 of 0 slot(s)" in judged_later.stdout
    hourly = ctl("missed", key, "--schedule", "0 0 1 1 *", "--since", "1h")
    assert hourly.returncode == 0 and "0 of 0 slot(s)" in hourly.stdout

    unknown = ctl("missed", "no-such-job")
    assert unknown.returncode == 1 and "no run of 'no-such-job' is recorded" in unknown.stderr
    db.execute(sql.SQL("UPDATE {} SET cron = NULL").format(table))
    no_schedule = ctl("missed", key)
    assert no_schedule.returncode == 2 and "pass --schedule" in no_schedule.stderr


def test_a_failing_history_write_is_a_warning(
    ctl: Ctl, with_history: dict[str, str], run_cli: RunCli, db: psycopg.Connection[Any]
) -> None:
    db.execute(sql.SQL("DROP TABLE {}").format(history_table(with_history)))
    started = time.monotonic()
    result = run_cli(["DATABASE_URL", "sh", "-c", "echo done"], {**with_history, **LEASE})
    assert result.returncode == 0 and result.stdout == "done\n"
    assert time.monotonic() - started < 30  # not held up by the failure (generous: a loaded CI)
    warnings = [line for line in result.stderr.splitlines() if "could not record" in line]
    assert len(warnings) == 1 and "key_value_history" in warnings[0]


def test_slot_arithmetic() -> None:
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=timezone.utc)
    slots = list(
        schedule_slots("*/10 * * * *", now - timedelta(hours=1, seconds=30), now, timedelta(0))
    )
    assert [s.start.minute for s in slots] == [0, 10, 20, 30, 40, 50, 0]
    assert slots[-1] == Slot(now.replace(second=0), now.replace(minute=10, second=0))
    early = slots[1].start - timedelta(seconds=0.5)  # a host clock a little ahead
    late = slots[2].start + timedelta(minutes=9)
    found = slot_indexes(slots, [(early, None), (late, None), (slots[4].start, slots[5].end)])
    assert found == [1, 2, 5]  # the slots 0, 30, 40 and the last one no run began in
    from zoneinfo import ZoneInfo

    berlin = list(
        schedule_slots(
            "0 3 * * *", now - timedelta(days=2), now, timedelta(0), ZoneInfo("Europe/Berlin")
        )
    )
    assert [slot.start.hour for slot in berlin] == [2, 2]  # 03:00 in Berlin is 02:00 UTC in winter
    assert parse_duration("1h30m", name="x") == timedelta(minutes=90)
    with pytest.raises(ConfigurationError):
        parse_duration("1 fortnight", name="x")


def test_a_new_job_is_judged_from_its_first_runs_slot_on() -> None:
    now = datetime(2026, 1, 1, 12, 10, 30, tzinfo=timezone.utc)
    slots = list(schedule_slots("* * * * *", now - timedelta(minutes=10), now, timedelta(0)))
    assert [slot.start.minute for slot in slots] == list(range(1, 11))

    def first_minute(starts: Sequence[tuple[datetime, datetime | None]]) -> int:
        return from_first_run(slots, starts)[0].start.minute

    # A start in 12:03's last second claimed 12:04's slot: 12:03's slot is not the job's.
    last_second = datetime(2026, 1, 1, 12, 3, 59, 200000, tzinfo=timezone.utc)
    claimed = [(last_second, slots[3].end)]
    assert first_minute(claimed) == 4
    assert slot_indexes(from_first_run(slots, claimed), claimed) == [0]
    # The same start as a lease with a schedule (no slot claimed) counts the same way.
    assert first_minute([(last_second, None)]) == 4
    # A start well inside its minute belongs to that minute; the earliest run decides.
    inside = datetime(2026, 1, 1, 12, 3, 30, tzinfo=timezone.utc)
    assert first_minute([(last_second, None), (inside, None)]) == 3
    assert from_first_run(slots, []) == slots


def test_latest_run_and_success_per_key(
    ctl: Ctl, with_history: dict[str, str], run_cli: RunCli, db: psycopg.Connection[Any]
) -> None:
    """The per-key summary a fleet report (an exporter, a status page) reads."""
    from dislock.cli.runs.run_history import latest as latest_runs
    from dislock.cli.sending import send

    env = {**with_history, **LEASE}
    key = env["LOCK_KEY"]
    assert run_cli(["DATABASE_URL", "true"], env).returncode == 0
    assert run_cli(["DATABASE_URL", "sh", "-c", "exit 5"], env).returncode == 5
    never = {**env, "LOCK_KEY": f"{key}-quiet", "LOCK_HISTORY": "0"}
    assert run_cli(["DATABASE_URL", "true"], never).returncode == 0
    schema, table = with_history["LOCK_TABLE"].split(".")
    found = {
        row.key: row for row in send(db, latest_runs((schema, f"{table}_history"), (schema, table)))
    }
    assert set(found) == {key, f"{key}-quiet"}
    latest = found[key]
    assert latest.outcome == "failed" and latest.duration_seconds is not None
    assert latest.last_success_started_at is not None and latest.started_at is not None
    assert latest.last_success_started_at < latest.started_at
    assert found[f"{key}-quiet"].run_id is None and found[f"{key}-quiet"].outcome is None


def test_runs_holding_any_slot_of_a_lease_show_as_running(
    ctl: Ctl, with_history: dict[str, str]
) -> None:
    import dislock

    def context(owner: str) -> dislock.LockContext:
        return env_context(
            with_history,
            owner,
            run_ttl_seconds=30,
            lease_interval_seconds=5,
            slots=2,
            history=True,
        )

    key = with_history["LOCK_KEY"]
    with (
        dislock.acquire_locks(context("first"), ["lease"]),
        dislock.acquire_locks(context("second"), ["lease"]),  # slot 2
    ):
        runs = json.loads(ctl("history", key, "--json").stdout)
        assert sorted((run["owner"], run["outcome"]) for run in runs) == [
            ("first", "running"),
            ("second", "running"),
        ]
    runs = json.loads(ctl("history", key, "--json").stdout)
    assert [run["outcome"] for run in runs] == ["ok", "ok"]


def test_missed_reads_the_schedule_in_its_recorded_zone(
    ctl: Ctl, with_history: dict[str, str], run_cli: RunCli, db: psycopg.Connection[Any]
) -> None:
    env = {
        **with_history,
        "LOCK_STRATEGY": "schedule",
        "CRON_SCHEDULE": "0 * * * *",
        "CRON_TZ": "Asia/Kolkata",  # UTC+05:30: its hours start at :30 UTC
    }
    ran = run_cli(["DATABASE_URL", "true"], env)
    assert ran.returncode == 0, ran.stderr
    (run,) = json.loads(ctl("history", env["LOCK_KEY"], "--json").stdout)
    assert run["cron_tz"] == "Asia/Kolkata"
    # The job ran before the window (or its slots before the run would not be judged).
    db.execute(
        sql.SQL(
            "UPDATE {} SET started_at = started_at - interval '4 hours',"
            " ended_at = ended_at - interval '4 hours', slot_end = slot_end - interval '4 hours'"
        ).format(history_table(with_history))
    )
    report = json.loads(ctl("missed", env["LOCK_KEY"], "--since", "3h", "--json").stdout)
    assert report["tz"] == "Asia/Kolkata"
    starts = [datetime.fromisoformat(slot["slot_start"]) for slot in report["missed"]]
    assert starts and all(start.minute == 30 for start in starts)
    utc = json.loads(
        ctl("missed", env["LOCK_KEY"], "--since", "3h", "--tz", "UTC", "--json").stdout
    )
    assert all(datetime.fromisoformat(s["slot_start"]).minute == 0 for s in utc["missed"])
    bad = ctl("missed", env["LOCK_KEY"], "--tz", "Mars/Olympus")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_runs_reading_the_schedule_in_different_zones_are_flagged(
    ctl: Ctl, with_history: dict[str, str], run_cli: RunCli
) -> None:
    env = {**with_history, "LOCK_STRATEGY": "lease", "CRON_SCHEDULE": "0 * * * *"}
    for zone in ("America/New_York", "Europe/Berlin"):
        ran = run_cli(["DATABASE_URL", "true"], {**env, "CRON_TZ": zone})
        assert ran.returncode == 0, ran.stderr
    key = env["LOCK_KEY"]
    for command in (["missed", key, "--since", "1h"], ["history", key], ["history"]):
        result = ctl(*command)
        warnings = [line for line in result.stderr.splitlines() if "differently" in line]
        assert len(warnings) == 1, (command, result.stderr)
        assert "America/New_York" in warnings[0] and "Europe/Berlin" in warnings[0]
        assert "CRON_TZ" in warnings[0]
    report = json.loads(ctl("missed", key, "--since", "1h", "--json").stdout)
    assert sorted(r["cron_tz"] for r in report["readings"]) == ["America/New_York", "Europe/Berlin"]


def test_runs_that_agree_on_the_zone_draw_no_warning(
    ctl: Ctl, with_history: dict[str, str], run_cli: RunCli
) -> None:
    env = {**with_history, "LOCK_STRATEGY": "lease", "CRON_SCHEDULE": "0 * * * *"}
    for _ in range(2):
        ran = run_cli(["DATABASE_URL", "true"], {**env, "CRON_TZ": "Europe/Berlin"})
        assert ran.returncode == 0, ran.stderr
    for command in (["missed", env["LOCK_KEY"], "--since", "1h"], ["history"]):
        assert "differently" not in ctl(*command).stderr


def test_ls_says_when_a_held_leases_process_is_gone_from_this_host(
    ctl: Ctl, cli_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**cli_env, "LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "120"}
    with holding(env, tmp_path) as wrapper:
        (running,) = json.loads(ctl("ls", env["LOCK_KEY"], "--json", env=env).stdout)
        assert running["state"] == "held" and running["holder_gone_pid"] is None, running
        assert "not running on this host" not in ctl("ls", env["LOCK_KEY"], env=env).stdout
        os.kill(wrapper.pid, signal.SIGKILL)
        wrapper.wait(timeout=30)
        (gone,) = json.loads(ctl("ls", env["LOCK_KEY"], "--json", env=env).stdout)
        # Still held in the table (until its TTL), and said to be gone here.
        assert gone["state"] == "held" and gone["holder_gone_pid"] == wrapper.pid, gone
        listed = ctl("ls", env["LOCK_KEY"], env=env).stdout
        assert f"held (its process {wrapper.pid} is not running on this host" in listed, listed
    # A schedule slot is held until it ends, its run long over: nothing to say.
    slot = {**cli_env, "LOCK_KEY": f"{cli_env['LOCK_KEY']}-slot"}
    assert subprocess.run([*DISLOCK, "DATABASE_URL", "true"], env=slot, check=False).returncode == 0
    (ended,) = json.loads(ctl("ls", slot["LOCK_KEY"], "--json", env=slot).stdout)
    assert ended["state"] == "held" and ended["holder_gone_pid"] is None, ended
    assert "not running on this host" not in ctl("ls", slot["LOCK_KEY"], env=slot).stdout


def test_check_says_a_slot_past_its_start_deadline_would_not_start(
    ctl: Ctl, cli_env: dict[str, str]
) -> None:
    # The slot began on January 1st: long past a deadline of a minute.
    late = {**cli_env, "CRON_SCHEDULE": "0 0 1 1 *", "LOCK_START_DEADLINE_SECONDS": "60"}
    checked = ctl("check", env=late)
    assert checked.returncode == 0, checked.stderr
    assert (
        "  schedule        free: a run now would mark it late and not start"
        " (past its start deadline)"
    ) in checked.stdout, checked.stdout
    # Every minute's slot began less than a day ago.
    timely = {**late, "CRON_SCHEDULE": "* * * * *", "LOCK_START_DEADLINE_SECONDS": "86400"}
    assert "  schedule        free: a run now would take it\n" in ctl("check", env=timely).stdout

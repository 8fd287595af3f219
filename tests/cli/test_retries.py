"""``LOCK_RETRIES`` through the wrapper: a machine that dies mid-run leaves its slot
to another once its lease has expired, and a reopened slot raced by many machines
gets one start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from psycopg import sql

from dislock.core.retries import grace, slot_end_of
from dislock.core.rows import lease_key, schedule_key
from tests.cli.conftest import DISLOCK, Ctl, RunCli, dislock_on_path, run_pasted
from tests.cli.serving import sample, serving
from tests.support.eventually import eventually
from tests.support.hosts import on_host
from tests.support.processes import alive
from tests.support.rows import Rows

RACERS = 20
WHEN = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"
"""A moment as the wrapper says it, to the second."""


def test_the_docs_block_runs_as_pasted(cli_env: dict[str, str], tmp_path: Path) -> None:
    # The block's own key and schedule, on this test's table: each run starts afresh.
    env = {k: v for k, v in cli_env.items() if k not in ("LOCK_KEY", "CRON_SCHEDULE")}
    env["PATH"] = dislock_on_path(tmp_path)
    # The block's two runs must fall in one slot of its '0 3 * * *': read it in a zone
    # where 03:00 is hours away (Etc/GMT-6 is UTC+6).
    near_three = datetime.now(timezone.utc).hour in (2, 3)
    env["CRON_TZ"] = "Etc/GMT-6" if near_three else "UTC"
    result = run_pasted("cli.md", "## Retries within a slot", env)
    assert result.stdout == "attempt 1 failed\nattempt 2 succeeded\n", result.stderr
    (line,) = result.stderr.splitlines()
    assert re.fullmatch(
        r"dislock: lock 'flaky-export': attempt 1 of 3 in this slot failed; attempt 2 may start"
        rf" on another machine from {WHEN}, on this one from {WHEN}",
        line,
    ), line


def _attempt_script(attempts: Path, status: int, pid_file: Path | None = None) -> str:
    record = f'echo "$DISLOCK_ATTEMPT" >> "{attempts}"'
    if pid_file is None:
        return f"{record}; exit {status}"
    return f'echo $$ > "{pid_file}"; {record}; sleep 300'


def test_a_machine_killed_mid_run_is_retried_once_its_lease_expired_not_before(
    cli_env: dict[str, str],
    run_cli: RunCli,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    attempts, pid_file = tmp_path / "attempts", tmp_path / "first.pid"
    env = {
        **cli_env,
        "LOCK_STRATEGY": "schedule,lease",
        "LOCK_RETRIES": "1",
        "LOCK_RETRY_DELAY_SECONDS": "1",
        # Long enough that the refused try below cannot come after the expiry.
        "RUN_LOCK_TTL_SECONDS": "15",
        "LOCK_LEASE_INTERVAL": "1",
    }
    rows = Rows(db, lock_table)
    first = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", _attempt_script(attempts, 0, pid_file)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=60)
        command = int(pid_file.read_text())
        first.send_signal(signal.SIGKILL)  # the machine dies: nothing is recorded or released
        first.wait(timeout=30)
        lease = rows.get(lease_key(env["LOCK_KEY"]))
        assert lease is not None and not lease.expired
        refused = run_cli(["DATABASE_URL", "sh", "-c", _attempt_script(attempts, 0)], env)
        assert refused.returncode == 0, refused.stderr
        assert attempts.read_text().split() == ["1"], "a retry before the lease expired"

        def retried() -> bool:
            result = run_cli(["DATABASE_URL", "sh", "-c", _attempt_script(attempts, 0)], env)
            assert result.returncode == 0, result.stderr
            return len(attempts.read_text().split()) > 1

        eventually(retried, timeout=90, interval=1)
        # The guard stopped the first attempt's command by its lease's deadline.
        assert not alive(command)
        assert attempts.read_text().split() == ["1", "2"]
        slot = rows.get(schedule_key(env["LOCK_KEY"]))
        assert slot is not None and slot.value.endswith(" (attempt 2) (done)"), slot
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_machines_racing_for_a_reopened_slot_start_one_attempt(
    cli_env: dict[str, str],
    run_cli: RunCli,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    attempts = tmp_path / "attempts"
    env = {
        **cli_env,
        "LOCK_RETRIES": "3",
        "LOCK_RETRY_DELAY_SECONDS": "1",
        "CRONJOB_LOCK_LOG_LEVEL": "INFO",
    }
    failed = run_cli(["DATABASE_URL", "sh", "-c", _attempt_script(attempts, 3)], env)
    assert failed.returncode == 3, failed.stderr
    assert "attempt 2 may start on another machine from" in failed.stderr
    rows = Rows(db, lock_table)
    key = schedule_key(env["LOCK_KEY"])
    eventually(lambda: (row := rows.get(key)) is not None and row.expired, timeout=30)
    racers = [
        subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "sh", "-c", _attempt_script(attempts, 0)],
            env=on_host(env, f"racer-{n}"),  # other machines: none leaves the retry to others
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(RACERS)
    ]
    said = [racer.communicate(timeout=120)[1] for racer in racers]
    assert [racer.returncode for racer in racers] == [0] * RACERS, said
    assert attempts.read_text().split() == ["1", "2"], said
    assert sum("not running" in text for text in said) == RACERS - 1, said[0]


def test_a_slot_past_its_deadline_is_refused_in_one_line_and_missed_says_late(
    history_env: dict[str, str], run_cli: RunCli, ctl: Ctl, tmp_path: Path
) -> None:
    began = datetime.now(timezone.utc) - timedelta(hours=2)
    env = {
        **history_env,
        "CRON_SCHEDULE": f"{began.minute} {began.hour} * * *",
        "CRON_TZ": "UTC",
        "LOCK_START_DEADLINE_SECONDS": "60",
        "CRONJOB_LOCK_LOG_LEVEL": "INFO",
    }
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert result.returncode == 0 and not marker.exists()
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"dislock: not running touch: schedule slot of {env['LOCK_KEY']!r}")
    assert line.endswith("more than 60 s ago (its start deadline): not started; marked late")
    again = run_cli(["DATABASE_URL", "touch", str(marker)], {**env, "LOCK_CONFLICT_EXIT_CODE": "3"})
    assert again.returncode == 3 and "marked late already" in again.stderr
    assert not marker.exists()

    history = ctl("history", env["LOCK_KEY"], env=env)
    assert history.returncode == 0 and " late" in history.stdout, history.stdout
    missed = ctl("missed", env["LOCK_KEY"], "--since", "3h", "--json", env=env)
    assert missed.returncode == 1, missed.stderr
    report = json.loads(missed.stdout)
    assert [slot["state"] for slot in report["missed"]] == ["late"], report
    assert report["runs"] == 0
    text = ctl("missed", env["LOCK_KEY"], "--since", "3h", env=env)
    assert text.returncode == 1 and text.stdout.splitlines()[1].split()[-2:] == ["late", "0"], (
        text.stdout
    )
    with serving(env) as served:
        metrics = served.metrics()
    assert sample(metrics, "dislock_late_slots", key=env["LOCK_KEY"]) == 1.0
    assert sample(metrics, "dislock_missed_slots", key=env["LOCK_KEY"]) == 1.0  # late ones too
    assert sample(metrics, "dislock_failed_slots", key=env["LOCK_KEY"]) == 0.0


def test_retries_on_a_lease_alone_are_refused_in_one_line(
    cli_env: dict[str, str], run_cli: RunCli, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    for name, value in (("LOCK_RETRIES", "2"), ("LOCK_START_DEADLINE_SECONDS", "60")):
        env = {**cli_env, "LOCK_STRATEGY": "lease", name: value}
        result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"dislock: error: {name}") and "schedule strategy" in line, line
    assert not marker.exists()


def test_a_later_attempt_still_going_reads_as_running_in_history(
    history_env: dict[str, str],
    run_cli: RunCli,
    ctl: Ctl,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    """Its slot row's owner has the attempt after it: history still finds the run's lock."""
    env = {**history_env, "LOCK_RETRIES": "1", "LOCK_RETRY_DELAY_SECONDS": "1"}
    assert run_cli(["DATABASE_URL", "false"], env).returncode == 1
    key = schedule_key(env["LOCK_KEY"])
    rows = Rows(db, lock_table)
    eventually(lambda: (row := rows.get(key)) is not None and row.expired, timeout=30)
    started, release = tmp_path / "started", tmp_path / "release"
    second = subprocess.Popen(
        [
            *DISLOCK,
            "DATABASE_URL",
            "sh",
            "-c",
            f'touch "{started}"; while [ ! -e "{release}" ]; do sleep 0.05; done',
        ],
        env=on_host(env, "another-machine"),  # it takes the retry as soon as it is due
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(started.exists, timeout=60)
        shown = ctl("history", env["LOCK_KEY"], "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        assert [run["outcome"] for run in json.loads(shown.stdout)] == ["running", "failed"]
    finally:
        release.touch()
        second.wait(timeout=60)
    assert second.returncode == 0


def test_a_reopened_slot_tells_its_retry_time_in_ls_and_on_the_page(
    history_env: dict[str, str],
    run_cli: RunCli,
    ctl: Ctl,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
) -> None:
    """Not the slot's end in seconds since 1970: the time the retry may start, in the
    database server's zone, and how long until it."""
    env = {**history_env, "LOCK_RETRIES": "1", "LOCK_RETRY_DELAY_SECONDS": "600"}
    assert run_cli(["DATABASE_URL", "false"], env).returncode == 1
    row = Rows(db, lock_table).get(schedule_key(env["LOCK_KEY"]))
    assert row is not None and "retry in slot" in row.value
    zone = db.execute("SHOW TimeZone").fetchone()
    assert zone is not None
    # psycopg reads a timestamptz in the session's zone, the server's unless told otherwise.
    when = row.expire_at.astimezone(ZoneInfo(zone[0])).strftime("%Y-%m-%d %H:%M:%S %Z")
    told = re.escape(f"(failed; retry from {when}, in ") + r"(9m[0-5]\ds|10m00s)\)"
    listing = ctl("ls", env=env)
    assert listing.returncode == 0, listing.stderr
    assert re.search(told, listing.stdout) and "retry in slot" not in listing.stdout, listing
    with serving(env) as served:
        _, _, page = served.get("/")
    assert re.search(told, page) and "retry in slot" not in page, page


def _said_retry_times(stderr: str) -> tuple[datetime, datetime]:
    """When the failed wrapper said another machine, then this one, may retry."""
    found = re.search(rf"another machine from ({WHEN}), on this one from ({WHEN})", stderr)
    assert found is not None, stderr
    return datetime.fromisoformat(found.group(1)), datetime.fromisoformat(found.group(2))


def test_a_retry_goes_to_another_machine_first_and_history_says_which_ran_each(
    history_env: dict[str, str], run_cli: RunCli, ctl: Ctl, rows: Rows, tmp_path: Path
) -> None:
    attempts = tmp_path / "attempts"
    env = {
        **history_env,
        "LOCK_RETRIES": "2",
        "LOCK_RETRY_DELAY_SECONDS": "120",
        "CRONJOB_LOCK_LOG_LEVEL": "INFO",
    }
    machine_a, machine_b = on_host(env, "machine-a"), on_host(env, "machine-b")
    failed = run_cli(["DATABASE_URL", "sh", "-c", _attempt_script(attempts, 3)], machine_a)
    assert failed.returncode == 3, failed.stderr
    elsewhere, here = _said_retry_times(failed.stderr)
    assert here - elsewhere == timedelta(seconds=120), failed.stderr  # its grace: the delay
    key = schedule_key(env["LOCK_KEY"])
    # The delay has passed (as waiting would): another machine may retry, this one for
    # the two minutes of its grace.
    rows.db.execute(
        sql.SQL("UPDATE {} SET expire_at = NOW() WHERE key = %s").format(rows.table), (key,)
    )
    left = run_cli(["DATABASE_URL", "sh", "-c", _attempt_script(attempts, 0)], machine_a)
    assert left.returncode == 0 and attempts.read_text().split() == ["1"], left.stderr
    assert re.search(rf"leaves attempt 2 to another until {WHEN}$", left.stderr.strip()), left
    taken = run_cli(["DATABASE_URL", "sh", "-c", _attempt_script(attempts, 0)], machine_b)
    assert taken.returncode == 0 and attempts.read_text().split() == ["1", "2"], taken.stderr

    shown = ctl("history", env["LOCK_KEY"], "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    runs = [(run["host"], run["attempt"], run["outcome"]) for run in json.loads(shown.stdout)]
    assert runs == [("machine-b", 2, "ok"), ("machine-a", 1, "failed")], runs
    table = ctl("history", env["LOCK_KEY"], env=env).stdout.splitlines()
    assert re.search(r"machine-b .* ok, attempt 2$", table[1]), table
    assert re.search(r"machine-a .* failed \(3\), attempt 1$", table[2]), table


def test_without_another_machine_the_failed_one_retries_once_its_grace_is_over(
    cli_env: dict[str, str], run_cli: RunCli, rows: Rows, tmp_path: Path
) -> None:
    attempts = tmp_path / "attempts"
    env = {**cli_env, "LOCK_RETRIES": "1", "LOCK_RETRY_DELAY_SECONDS": "1"}
    failed = run_cli(["DATABASE_URL", "sh", "-c", _attempt_script(attempts, 3)], env)
    assert failed.returncode == 3, failed.stderr
    row = rows.get(schedule_key(env["LOCK_KEY"]))
    assert row is not None and "(failed; retry in slot " in row.value, row
    slot = slot_end_of(row.value, row.expire_at)
    over = row.expire_at + timedelta(seconds=grace(1, row.expire_at, slot))
    assert over - row.expire_at == timedelta(seconds=1)
    assert _said_retry_times(failed.stderr)[1] == over.replace(microsecond=0)
    eventually(lambda: rows.now() >= over, timeout=30)  # by the database clock
    again = run_cli(["DATABASE_URL", "sh", "-c", _attempt_script(attempts, 0)], env)
    assert again.returncode == 0 and attempts.read_text().split() == ["1", "2"], again.stderr

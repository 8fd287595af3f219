"""``LOCK_AFTER`` through the wrapper: a slot held back until the keys it names
succeeded in it, then started once; waiting for their success; the refusals.

The jobs' schedule is ``cli_env``'s yearly one: no slot boundary falls in a test."""

from __future__ import annotations

import re
import subprocess
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock.core.rows import schedule_key
from tests.cli.conftest import (
    DISLOCK,
    ROOT,
    RunCli,
    assert_refused_in_one_line,
    dislock_on_path,
)


@pytest.fixture
def jobs(history_env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """An export (A) and a report (B) that comes after it, logging at INFO."""
    export = {**history_env, "LOCK_KEY": f"export-{uuid.uuid4().hex[:6]}"}
    export["CRONJOB_LOCK_LOG_LEVEL"] = "INFO"
    report = {
        **export,
        "LOCK_KEY": f"report-{uuid.uuid4().hex[:6]}",
        "LOCK_AFTER": export["LOCK_KEY"],
    }
    return export, report


def _marker_command(marker: Path, status: int = 0) -> list[str]:
    return ["sh", "-c", f'echo ran >> "{marker}"; exit {status}']


def _refusal(result: subprocess.CompletedProcess[str], waited_for: str) -> str:
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("dislock: not running sh: schedule slot of "), line
    assert f"waits for {waited_for!r}" in line, line
    return line


def test_held_back_until_the_export_succeeded_in_the_slot_then_run_once(
    jobs: tuple[dict[str, str], dict[str, str]],
    run_cli: RunCli,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
) -> None:
    export, report = jobs
    ran = tmp_path / "report-ran"
    refused = run_cli(
        ["DATABASE_URL", *_marker_command(ran)], {**report, "LOCK_CONFLICT_EXIT_CODE": "3"}
    )
    assert refused.returncode == 3, refused.stderr
    _refusal(refused, export["LOCK_KEY"])
    assert not ran.exists()
    # Nothing written: the slot stays open for a later tick.
    table = sql.Identifier(*lock_table)
    rows = db.execute(sql.SQL("SELECT key FROM {}").format(table)).fetchall()
    assert rows == []

    assert run_cli(["DATABASE_URL", "true"], export).returncode == 0
    first = run_cli(["DATABASE_URL", *_marker_command(ran)], report)
    assert first.returncode == 0, first.stderr
    assert ran.read_text() == "ran\n"
    again = run_cli(["DATABASE_URL", *_marker_command(ran)], report)
    assert again.returncode == 0
    assert "already started" in again.stderr
    assert ran.read_text() == "ran\n"
    keys = {row[0] for row in db.execute(sql.SQL("SELECT key FROM {}").format(table))}
    assert schedule_key(report["LOCK_KEY"]) in keys


def test_held_back_after_the_export_failed(
    jobs: tuple[dict[str, str], dict[str, str]], run_cli: RunCli, tmp_path: Path
) -> None:
    export, report = jobs
    assert run_cli(["DATABASE_URL", "false"], export).returncode == 1
    ran = tmp_path / "report-ran"
    result = run_cli(["DATABASE_URL", *_marker_command(ran)], report)
    assert result.returncode == 0
    _refusal(result, export["LOCK_KEY"])
    assert not ran.exists()


@pytest.mark.parametrize("listen", ["auto", "0"])
def test_a_waiting_report_starts_once_the_export_succeeded(
    jobs: tuple[dict[str, str], dict[str, str]],
    run_cli: RunCli,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
    listen: str,
) -> None:
    export, report = jobs
    ran = tmp_path / "report-ran"
    env = {**report, "LOCK_WAIT_SECONDS": "120", "LOCK_WAIT_POLL_SECONDS": "0.2"}
    env["LOCK_WAIT_LISTEN"] = listen
    waiter = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", *_marker_command(ran)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stderr is not None
        # It says it waits before it listens: the export comes after that line.
        line = waiter.stderr.readline()
        assert f"waits for {export['LOCK_KEY']!r}" in line and "waiting up to 120 s" in line
        assert not ran.exists()
        assert run_cli(["DATABASE_URL", "true"], export).returncode == 0
        assert waiter.wait(timeout=60) == 0
    finally:
        waiter.kill()
        waiter.communicate()
    assert ran.read_text() == "ran\n"
    history = sql.Identifier(lock_table[0], f"{lock_table[1]}_history")
    ((order,),) = db.execute(
        sql.SQL(
            "SELECT (SELECT started_at FROM {h} WHERE lock_key = %s)"
            " >= (SELECT ended_at FROM {h} WHERE lock_key = %s)"
        ).format(h=history),
        (report["LOCK_KEY"], export["LOCK_KEY"]),
    ).fetchall()
    assert order


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"LOCK_HISTORY": "0"}, "LOCK_AFTER reads the keys' successful runs from the history:"),
        ({"LOCK_STRATEGY": "lease"}, "it needs LOCK_STRATEGY=schedule"),
        ({"LOCK_AFTER": "a,,b"}, "LOCK_AFTER='a,,b': an empty key between commas"),
        ({"LOCK_AFTER": "a,a"}, "LOCK_AFTER names a key twice"),
        ({"LOCK_WAIT_SECONDS": "5", "LOCK_AFTER": ""}, "waiting (5 s) needs the lease strategy"),
    ],
)
def test_refused_configurations(
    jobs: tuple[dict[str, str], dict[str, str]],
    run_cli: RunCli,
    tmp_path: Path,
    change: dict[str, str],
    expected: str,
) -> None:
    marker = tmp_path / "ran"
    env = {**jobs[1], **change, "DATABASE_URL": "postgresql://u:hunter2@127.0.0.1:9/db"}
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_refused_in_one_line(result, expected, marker)


def test_the_docs_crontab_runs_as_pasted(
    history_env: dict[str, str], run_cli: RunCli, tmp_path: Path
) -> None:
    """docs/cli.md's two crontab lines, their commands run by bash as cron would
    (the environment file's line left out: the test gives its variables)."""
    text = (ROOT / "docs/cli.md").read_text().split("## After other jobs", 1)[1]
    found = re.search(r"```crontab\n(.*?)```", text, re.S)
    assert found is not None
    lines = [line for line in found.group(1).splitlines() if re.match(r"[\d*]", line)]
    export_line, report_line = (line.split(None, 5)[5] for line in lines)
    report_ran = tmp_path / "report-ran"
    path = dislock_on_path(tmp_path)

    def tick(line: str) -> subprocess.CompletedProcess[str]:
        command = line.removeprefix(". /etc/dislock/jobs.env && ")
        command = command.replace("/opt/jobs/export.sh", "true")
        command = command.replace("/opt/jobs/report.sh", f"sh -c 'echo ran >> {report_ran}'")
        env = {k: v for k, v in history_env.items() if k not in ("LOCK_KEY", "CRON_SCHEDULE")}
        env["PATH"] = path
        env["CRONJOB_LOCK_LOG_LEVEL"] = "INFO"
        # The night's slot of '0 2 * * *' must not change during the test: it is read
        # in a zone where 02:00 is hours away (Etc/GMT-6 is UTC+6).
        env["CRON_TZ"] = "Etc/GMT-6" if datetime.now(timezone.utc).hour in (1, 2) else "UTC"
        return subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60
        )

    early = tick(report_line)
    assert early.returncode == 0 and "waits for 'nightly-export'" in early.stderr
    assert not report_ran.exists()
    assert tick(export_line).returncode == 0
    assert tick(report_line).returncode == 0
    assert tick(report_line).returncode == 0  # a later tick: the night's report ran already
    assert report_ran.read_text() == "ran\n"

"""``LOCK_MAX_RUNTIME_SECONDS``: a run is bounded as ``timeout(1)`` bounds one, by the
wrapper while it can act, and by its guard when it cannot (stopped or frozen)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dislock.core.supervision import KILL_GRACE
from tests.cli.conftest import (
    DISLOCK,
    Ctl,
    RunCli,
    assert_refused_in_one_line,
    dislock_on_path,
    run_pasted,
)
from tests.support.eventually import eventually
from tests.support.processes import alive, killed_if_left
from tests.support.rows import history_runs


def test_the_docs_block_runs_as_pasted(cli_env: dict[str, str], tmp_path: Path) -> None:
    env = {**cli_env, "PATH": dislock_on_path(tmp_path)}
    started = time.monotonic()
    result = run_pasted("cli.md", "## Bounding a run", env, timeout=60)
    took = time.monotonic() - started
    assert result.stdout == "exit 124\n", (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "dislock: lock 'stuck-job': the command ran past its maximum runtime of 2 s;"
        " terminating sleep (pid "
    ), lines[0]
    assert lines[0].endswith(", SIGKILL after 10 s), exit 124"), lines[0]
    # sleep goes at SIGTERM: the bound, not the grace, decides when.
    assert 2.0 <= took < 2.0 + KILL_GRACE, took


@pytest.mark.parametrize("strategy", ["schedule", "lease", "schedule,lease"])
def test_a_command_ignoring_sigterm_is_killed_after_the_grace_with_its_helpers(
    history_env: dict[str, str],
    run_cli: RunCli,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    strategy: str,
) -> None:
    helper = tmp_path / "helper.pid"
    # Ignored signals are inherited: the background helper ignores SIGTERM too.
    script = f"trap '' TERM; sleep 300 & echo $! > {helper}; sleep 300"
    env = {**history_env, "LOCK_STRATEGY": strategy, "LOCK_MAX_RUNTIME_SECONDS": "1"}
    started = time.monotonic()
    result = run_cli(["DATABASE_URL", "sh", "-c", script], env, timeout=120)
    took = time.monotonic() - started
    assert result.returncode == 124, result.stderr
    assert "maximum runtime of 1 s" in result.stderr and "exit 124" in result.stderr
    assert "Traceback" not in result.stderr
    assert 1.0 + KILL_GRACE <= took < 1.0 + KILL_GRACE + 20, took
    assert not alive(int(helper.read_text())), "the background helper outlived the bound"
    schema, table = env["LOCK_TABLE"].split(".")
    (run,) = history_runs(db, (schema, f"{table}_history"), env["LOCK_KEY"])
    assert (run["outcome"], run["exit_code"], run["signal"]) == ("timed_out", 124, 9)
    assert run["ordered"]


def test_a_command_within_its_bound_keeps_its_exit_status(
    cli_env: dict[str, str], run_cli: RunCli
) -> None:
    env = {**cli_env, "LOCK_MAX_RUNTIME_SECONDS": "30"}
    result = run_cli(["DATABASE_URL", "sh", "-c", "exit 124"], env)
    assert result.returncode == 124 and result.stderr == "", result.stderr
    result = run_cli(["DATABASE_URL", "sh", "-c", "exit 0"], {**env, "LOCK_KEY": "other"})
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("strategy", ["schedule", "lease"])
def test_the_bound_holds_while_the_wrapper_is_stopped(
    cli_env: dict[str, str], tmp_path: Path, strategy: str
) -> None:
    """Frozen at its bound, the wrapper cannot stop the command: its guard kills the
    group once the bound and the grace are over, and the wrapper, resumed, says so."""
    pid_file = tmp_path / "command.pid"
    env = {
        **cli_env,
        "LOCK_STRATEGY": strategy,
        "LOCK_MAX_RUNTIME_SECONDS": "1",
        # A lease long enough that its own deadline is no part of this.
        "RUN_LOCK_TTL_SECONDS": "600",
    }
    wrapper = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with killed_if_left(wrapper):
        eventually(
            lambda: pid_file.exists() and pid_file.read_text().strip(),
            timeout=30,
            message=f"{pid_file} never written",
        )
        command = int(pid_file.read_text())
        wrapper.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        deadline = stopped + 1.0 + KILL_GRACE + 30
        while alive(command):
            assert time.monotonic() < deadline, "the guard never killed the command"
            time.sleep(0.05)
        gone = time.monotonic() - stopped
        # Not before the bound and its grace (the guard is no quicker than the
        # wrapper would be), and not much after.
        assert gone >= KILL_GRACE, gone
        wrapper.send_signal(signal.SIGCONT)
        _, stderr = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 124, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, lines
    assert "maximum runtime of 1 s" in lines[0] and "its guard killed" in lines[0], lines[0]


@pytest.mark.parametrize("value", ["0", "0.5", "forever", "-3", "2592001"])
def test_a_bound_out_of_range_is_one_line_and_exit_2(
    cli_env: dict[str, str], run_cli: RunCli, tmp_path: Path, value: str
) -> None:
    marker = tmp_path / "ran"
    env = {**cli_env, "LOCK_MAX_RUNTIME_SECONDS": value}
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_refused_in_one_line(result, "LOCK_MAX_RUNTIME_SECONDS", marker)


def test_history_shows_a_timed_out_run_with_its_exit_status(
    history_env: dict[str, str], run_cli: RunCli, ctl: Ctl
) -> None:
    env = {**history_env, "LOCK_MAX_RUNTIME_SECONDS": "1"}
    assert run_cli(["DATABASE_URL", "sleep", "30"], env).returncode == 124
    shown = ctl("history", env["LOCK_KEY"], env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1].endswith("timed out (124)"), shown.stdout

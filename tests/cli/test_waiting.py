"""The wrapper's waiting settings: conflict exit codes, signals while waiting, bad values."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dislock
from tests.cli.conftest import (
    DISLOCK,
    UNREACHABLE,
    RunCli,
    assert_refused_in_one_line,
    env_context,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def held(logged_lease_env: dict[str, str]) -> Iterator[None]:
    """The lease of ``logged_lease_env``'s key, held by someone else for the test."""
    context = env_context(
        logged_lease_env, "other-machine", run_ttl_seconds=10, lease_interval_seconds=1
    )
    with dislock.LeaseLock(context):
        yield


@pytest.mark.usefixtures("held")
@pytest.mark.parametrize(("code", "waited"), [("0", None), ("3", None), ("99", "0.5")])
def test_conflict_exit_code_after_any_wait(
    run_cli: RunCli, logged_lease_env: dict[str, str], tmp_path: Path, code: str, waited: str | None
) -> None:
    env = {**logged_lease_env, "LOCK_CONFLICT_EXIT_CODE": code}
    if waited is not None:
        env["LOCK_WAIT_SECONDS"] = waited
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert result.returncode == int(code), result.stderr
    assert "not running touch" in result.stderr
    assert not marker.exists()


def test_conflict_exit_code_leaves_a_run_that_got_the_lock_alone(
    run_cli: RunCli, logged_lease_env: dict[str, str]
) -> None:
    result = run_cli(
        ["DATABASE_URL", "sh", "-c", "exit 7"], {**logged_lease_env, "LOCK_CONFLICT_EXIT_CODE": "3"}
    )
    assert result.returncode == 7, result.stderr


def wait_started(process: subprocess.Popen[str], needle: str, timeout: float = 30) -> str:
    """Read the wrapper's stderr until ``needle`` shows up."""
    assert process.stderr is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        line = process.stderr.readline()
        if not line or time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} never logged; stderr: {seen}")
        seen += line
    return seen


@pytest.mark.usefixtures("held")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_while_waiting_ends_the_wait_at_once(
    logged_lease_env: dict[str, str], tmp_path: Path, signum: signal.Signals
) -> None:
    marker = tmp_path / "ran"
    env = {**logged_lease_env, "LOCK_WAIT_SECONDS": "60"}
    process = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "touch", str(marker)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_started(process, "waiting up to 60 s")
        sent = time.monotonic()
        process.send_signal(signum)
        assert process.wait(timeout=20) == 128 + signum
        assert time.monotonic() - sent < 10  # at once, not at the end of the 60 s wait
    finally:
        process.kill()
        process.communicate()
    assert not marker.exists()


@pytest.mark.usefixtures("held")
def test_a_signal_ends_an_asyncio_wait_too(
    logged_lease_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    script = (
        "import asyncio, logging, os, sys\n"
        "import dislock.aio\n"
        "from dislock import LockContext\n"
        "from dislock.core.supervision import FORWARDED_SIGNALS\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "context = LockContext(url=os.environ['DATABASE_URL'],"
        " table_parts=os.environ['LOCK_TABLE'].split('.'), lock_key=os.environ['LOCK_KEY'],"
        " owner='aio-waiter', run_ttl_seconds=10, lease_interval_seconds=1, wait_seconds=60)\n"
        "sys.exit(asyncio.run(dislock.aio.run_with_locks(['touch', sys.argv[1]],"
        " context=context, strategies=['lease'], forward_signals=FORWARDED_SIGNALS)))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(marker)],
        env=logged_lease_env,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        wait_started(process, "waiting up to 60 s")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        process.kill()
        process.communicate()
    assert not marker.exists()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"LOCK_WAIT_SECONDS": "-1"}, "LOCK_WAIT_SECONDS must not be negative, got '-1'"),
        ({"LOCK_WAIT_SECONDS": "soon"}, "LOCK_WAIT_SECONDS must be a number of seconds"),
        ({"LOCK_WAIT_SECONDS": "inf"}, "LOCK_WAIT_SECONDS must be a finite number"),
        ({"LOCK_WAIT_POLL_SECONDS": "0"}, "LOCK_WAIT_POLL_SECONDS must be greater than 0"),
        ({"LOCK_WAIT_LISTEN": "maybe"}, "LOCK_WAIT_LISTEN must be auto"),
        ({"LOCK_SLOTS": "0"}, "LOCK_SLOTS must be between 1 and 1000, got '0'"),
        ({"LOCK_SLOTS": "-2"}, "LOCK_SLOTS must be between 1 and 1000, got '-2'"),
        ({"LOCK_SLOTS": "many"}, "LOCK_SLOTS must be a whole number, got 'many'"),
        ({"LOCK_SLOTS": "2.5"}, "LOCK_SLOTS must be a whole number, got '2.5'"),
        ({"LOCK_CONFLICT_EXIT_CODE": "256"}, "LOCK_CONFLICT_EXIT_CODE must be between 0 and 255"),
        ({"LOCK_CONFLICT_EXIT_CODE": "-1"}, "LOCK_CONFLICT_EXIT_CODE must be between 0 and 255"),
        ({"LOCK_CONFLICT_EXIT_CODE": "x"}, "LOCK_CONFLICT_EXIT_CODE must be a whole number"),
        (
            {"LOCK_STRATEGY": "schedule", "LOCK_WAIT_SECONDS": "5"},
            "LOCK_STRATEGY='schedule': waiting (5 s) needs the lease strategy",
        ),
        (
            {"LOCK_STRATEGY": "schedule", "LOCK_SLOTS": "3"},
            "LOCK_STRATEGY='schedule': 3 slots need the lease strategy",
        ),
    ],
)
def test_bad_waiting_values_exit_2_with_one_line(
    run_cli: RunCli,
    logged_lease_env: dict[str, str],
    tmp_path: Path,
    overrides: dict[str, str],
    expected: str,
) -> None:
    env = {**logged_lease_env, "DATABASE_URL": UNREACHABLE, **overrides}
    marker = tmp_path / "ran"
    result = run_cli(["DATABASE_URL", "touch", str(marker)], env)
    assert_refused_in_one_line(result, expected, marker)


def test_schedule_lease_may_wait(run_cli: RunCli, logged_lease_env: dict[str, str]) -> None:
    env = {**logged_lease_env, "LOCK_STRATEGY": "schedule,lease", "LOCK_WAIT_SECONDS": "5"}
    result = run_cli(["DATABASE_URL", "true"], env)
    assert result.returncode == 0, result.stderr


def test_check_shows_the_waiting_settings(logged_lease_env: dict[str, str]) -> None:
    env = {
        **logged_lease_env,
        "LOCK_WAIT_SECONDS": "30",
        "LOCK_SLOTS": "4",
        "LOCK_CONFLICT_EXIT_CODE": "3",
    }
    result = subprocess.run(
        [sys.executable, "-m", "dislock.cli.ctl", "DATABASE_URL", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "up to 30 s (LISTEN on a direct connection, else polling" in result.stdout
    assert "4 holders at once" in result.stdout
    assert "exit 3" in result.stdout


@pytest.mark.usefixtures("held")
def test_check_counts_held_slots(logged_lease_env: dict[str, str]) -> None:
    def check(**extra: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "dislock.cli.ctl", "DATABASE_URL", "check"],
            env={**logged_lease_env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "1/2 slots held: a run now would take one" in check(LOCK_SLOTS="2")
    assert "held by other-machine" in check()
    assert "a run now would wait" in check(LOCK_WAIT_SECONDS="5")

"""The herd at :00: every machine's wrapper starts in the same second against a server
that refuses connections past a cap. Exactly one command runs; every other wrapper
exits 0 and says nothing above INFO (refusals are waited out, not reported)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.cli.conftest import DISLOCK, RunCli
from tests.support.eventually import eventually
from tests.support.herd import pgbouncer, pgbouncer_available

HERD = 24
LIMIT = 4
CLIENTS = 8


def about_to_connect(process: subprocess.Popen[str]) -> bool:
    """Whether a wrapper has loaded libpq (or is gone already)."""
    if process.poll() is not None:
        return True
    try:
        return "libpq" in Path(f"/proc/{process.pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True


def stampede(env: dict[str, str], tmp_path: Path, blockers: int) -> None:
    """Start the herd while ``blockers`` connections use up every slot the server
    allows, as the first machines of the minute do; free them once most wrappers have tried."""
    ran, release = tmp_path / "ran", tmp_path / "release"
    busy = [psycopg.connect(env["DATABASE_URL"], prepare_threshold=None) for _ in range(blockers)]
    # The command that runs holds on until every other wrapper has decided, so that
    # a late wrapper cannot take a lease the first one already gave back.
    script = f'echo $$ >> "{ran}"; while [ ! -e "{release}" ]; do sleep 0.05; done'
    processes = [
        subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "sh", "-c", script],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(HERD)
    ]
    try:
        # Python takes a while to start 24 times on a loaded machine: free the
        # slots only once every wrapper is about to connect (libpq is loaded).
        eventually(
            lambda: sum(about_to_connect(process) for process in processes) >= HERD,
            timeout=60,
            interval=0.05,
            message="not every wrapper came to connect",
        )
        time.sleep(2.0)
        for conn in busy:
            conn.close()
        eventually(
            lambda: sum(process.poll() is not None for process in processes) >= HERD - 1,
            timeout=120,
            interval=0.05,
            message="the herd did not decide",
        )
        release.touch()
        outcomes = [(process.wait(60), *process.communicate()) for process in processes]
    finally:
        for conn in busy:
            conn.close()
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    failures = [(code, err) for code, _, err in outcomes if code != 0 or err]
    assert failures == []
    assert len(ran.read_text().split()) == 1


@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_herd_against_a_role_connection_limit_runs_once_and_fails_nobody(
    cli_env: dict[str, str], limited_url: str, tmp_path: Path, strategy: str
) -> None:
    env = {**cli_env, "DATABASE_URL": limited_url, "LOCK_STRATEGY": strategy}
    stampede(env, tmp_path, blockers=LIMIT)


@pytest.mark.slow
@pytest.mark.skipif(not pgbouncer_available(), reason="pgbouncer is not installed")
@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_herd_through_pgbouncer_with_small_caps_runs_once_and_fails_nobody(
    cli_env: dict[str, str], limited_url: str, tmp_path: Path, strategy: str
) -> None:
    # max_db_connections queues clients; max_client_conn refuses them outright.
    with pgbouncer(limited_url, max_db_connections=2, max_client_conn=CLIENTS) as url:
        env = {**cli_env, "DATABASE_URL": url, "LOCK_STRATEGY": strategy}
        stampede(env, tmp_path, blockers=CLIENTS)


def test_refusals_are_reported_after_the_patience_runs_out(
    run_cli: RunCli,
    cli_env: dict[str, str],
    limited_url: str,
    tmp_path: Path,
) -> None:
    # Every connection the role may hold is taken: the wrapper waits, then says why.
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    try:
        env = {
            **cli_env,
            "DATABASE_URL": limited_url,
            "LOCK_CONNECT_PATIENCE_SECONDS": "1.5",
            "CRONJOB_LOCK_LOG_LEVEL": "INFO",
        }
        started = time.monotonic()
        result = run_cli(["DATABASE_URL", "touch", str(tmp_path / "ran")], env)
        elapsed = time.monotonic() - started
    finally:
        for blocker in blockers:
            blocker.close()
    assert result.returncode == 1
    assert elapsed >= 1.5
    assert "retrying" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dislock: error: cannot connect") and "too many connections" in last
    assert "herd-secret" not in result.stderr
    assert not (tmp_path / "ran").exists()


def test_a_refused_wrapper_runs_once_a_connection_frees_up(
    cli_env: dict[str, str], limited_url: str, tmp_path: Path
) -> None:
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    marker = tmp_path / "ran"
    try:
        process = subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", "touch", str(marker)],
            env={**cli_env, "DATABASE_URL": limited_url},
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)
        assert process.poll() is None  # still waiting for a connection
    finally:
        for blocker in blockers:
            blocker.close()
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert stderr == ""
    assert marker.exists()


def test_permanent_refusal_is_not_retried(
    run_cli: RunCli, cli_env: dict[str, str], limited_url: str, tmp_path: Path
) -> None:
    wrong = limited_url.replace("herd-secret", "wrong-secret")
    assert wrong != limited_url
    # A server that trusts every local connection accepts any password: then ask
    # for a database that does not exist instead, which no server forgives.
    missing = wrong.replace("dbname=", "dbname=no_such_db_")
    assert missing != wrong
    started = time.monotonic()
    result = run_cli(
        ["DATABASE_URL", "touch", str(tmp_path / "ran")],
        {**cli_env, "DATABASE_URL": missing, "LOCK_CONNECT_PATIENCE_SECONDS": "20"},
    )
    assert result.returncode == 1
    assert time.monotonic() - started < 15  # reported at once, not after 20 s (a slow start-up)
    assert result.stderr.startswith("dislock: error: cannot connect"), result.stderr

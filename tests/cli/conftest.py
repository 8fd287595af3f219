"""Fixtures for the wrapper's own tests: its environment and a way to run it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dislock import LockContext
from dislock.core.history import create_history

DISLOCK = [sys.executable, "-m", "dislock.cli"]
RunCli = Callable[..., subprocess.CompletedProcess[str]]
CTL = [sys.executable, "-m", "dislock.cli.ctl"]
Ctl = Callable[..., subprocess.CompletedProcess[str]]
UNREACHABLE = "postgresql://app:hunter2-secret@127.0.0.1:1/app"
"""A URL no server answers, with a password that must never be printed."""


ROOT = Path(__file__).resolve().parents[2]


def docs_block(page: str, heading: str) -> str:
    """The first shell block under ``heading`` of ``docs/<page>``, as a user would paste it."""
    section = (ROOT / "docs" / page).read_text().split(heading, 1)[1]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found is not None, f"no sh block under {heading!r} in docs/{page}"
    return found.group(1)


def run_pasted(
    page: str, heading: str, env: Mapping[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The first shell block under ``heading`` of ``docs/<page>``, run by bash as pasted."""
    return subprocess.run(
        ["bash", "-c", docs_block(page, heading)],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dislock_on_path(tmp_path: Path) -> str:
    """A ``PATH`` on which ``dislock`` and ``dislockctl`` are this checkout's, as a
    pasted block finds them after an install."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, argv in (("dislock", DISLOCK), ("dislockctl", CTL)):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {" ".join(argv)} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def assert_refused_in_one_line(
    result: subprocess.CompletedProcess[str], expected: str, marker: Path
) -> None:
    """A refused configuration: exit 2, one ``dislock: error:`` line that says
    ``expected``, no password of ``UNREACHABLE``, and the command (which would
    create ``marker``) never ran."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dislock: error: ")
    assert expected in lines[0]
    assert "hunter2" not in result.stderr + result.stdout
    assert not marker.exists()


@pytest.fixture
def cli_env(database_url: str, lock_table: tuple[str, str]) -> dict[str, str]:
    """A working environment for ``dislock DATABASE_URL …`` on this test's table."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("LOCK_", "CRON"))}
    env.update(
        DATABASE_URL=database_url,
        LOCK_TABLE=".".join(lock_table),
        LOCK_KEY=f"job-{uuid.uuid4().hex[:8]}",
        CRON_SCHEDULE="0 0 1 1 *",
    )
    return env


@pytest.fixture
def short_lease_env(cli_env: dict[str, str]) -> dict[str, str]:
    """The wrapper on a lease that expires soon (TTL 2 s, renewed every 0.3 s): a
    renewal that stops is noticed within a test's patience."""
    return {
        **cli_env,
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": "2",
        "LOCK_LEASE_INTERVAL": "0.3",
    }


@pytest.fixture
def logged_lease_env(cli_env: dict[str, str]) -> dict[str, str]:
    """The wrapper on a lease with its default timings, logging at INFO (so that
    it says when it waits)."""
    return {**cli_env, "LOCK_STRATEGY": "lease", "CRONJOB_LOCK_LOG_LEVEL": "INFO"}


def env_context(env: Mapping[str, str], owner: str, **fields: Any) -> LockContext:
    """A LockContext on the lock of a wrapper environment (its URL, table and key),
    for a holder the test plays itself."""
    return LockContext(
        url=env["DATABASE_URL"],
        table_parts=env["LOCK_TABLE"].split("."),
        lock_key=env["LOCK_KEY"],
        owner=owner,
        **fields,
    )


@pytest.fixture
def history_env(cli_env: dict[str, str], db: psycopg.Connection[Any]) -> dict[str, str]:
    """The wrapper's environment with run history on, its table created."""
    schema, table = cli_env["LOCK_TABLE"].split(".")
    for statement in create_history((schema, f"{table}_history")):
        db.execute(statement)
    return {**cli_env, "LOCK_HISTORY": "1"}


@pytest.fixture
def run_cli() -> RunCli:
    def run(
        args: Sequence[str], env: Mapping[str, str], timeout: float = 60, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*DISLOCK, *args],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kwargs,
        )

    return run


@pytest.fixture
def ctl(cli_env: dict[str, str]) -> Ctl:
    """Run ``dislockctl DATABASE_URL ARGS…`` in the test's environment (or ``env=``)."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CTL, "DATABASE_URL", *args],
            env=cli_env if env is None else env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    return run


@contextlib.contextmanager
def holding(env: Mapping[str, str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A wrapper (in a session of its own) whose command has started and sleeps ten
    minutes, holding its locks; it and its group are killed at the end."""
    from tests.support.eventually import wait_for

    started = tmp_path / "started"
    holder = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", f'touch "{started}"; exec sleep 600'],
        env=dict(env),
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(started, timeout=60)
        yield holder
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)

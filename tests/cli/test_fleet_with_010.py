"""A fleet upgraded machine by machine: wrappers of dislock 0.1.0 and of this
version on one table keep each other out, for leases and for schedule slots,
whichever of the two holds the lock.

0.1.0 comes from PyPI into a cached venv (``tests/support/old_release.py``); both
wrappers are run as a crontab would run them, with the same variables.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from dislock.core.rows import lease_key, schedule_key
from tests.cli.conftest import DISLOCK
from tests.support.eventually import eventually, wait_for
from tests.support.old_release import PyPIUnreachable, old_dislock_venv
from tests.support.rows import Rows

# Some twenty seconds of wrapper runs, and a download on the first run.
pytestmark = pytest.mark.slow

PAIRS = [("0.1.0", "0.2.0"), ("0.2.0", "0.1.0")]


@pytest.fixture(scope="session")
def wrappers() -> dict[str, list[str]]:
    """The two versions' ``dislock`` commands."""
    try:
        old_python = old_dislock_venv() / "bin" / "python"
    except PyPIUnreachable as exc:
        pytest.skip(f"{exc}; the tests of a mixed 0.1.0/0.2.0 fleet need it")
    return {"0.1.0": [str(old_python), "-m", "dislock"], "0.2.0": DISLOCK}


@pytest.fixture(params=PAIRS, ids=[f"{holder}-holds" for holder, _ in PAIRS])
def versions(
    request: pytest.FixtureRequest, wrappers: dict[str, list[str]]
) -> tuple[list[str], list[str]]:
    """The commands of the version holding the lock and of the one contending for it."""
    holder, contender = request.param
    return wrappers[holder], wrappers[contender]


@pytest.fixture
def fleet_env(cli_env: dict[str, str]) -> dict[str, str]:
    # CRON_SCHEDULE is yearly (cli_env): no slot boundary falls inside a test.
    return {**cli_env, "RUN_LOCK_TTL_SECONDS": "30"}


class Holder:
    """A wrapper running ``sh``, holding its locks until told to finish."""

    def __init__(self, wrapper: Sequence[str], env: dict[str, str], tmp: Path) -> None:
        started, self.finish = tmp / "started", tmp / "finish"
        script = f'touch "{started}"; while [ ! -e "{self.finish}" ]; do sleep 0.02; done'
        self.process = subprocess.Popen(
            [*wrapper, "DATABASE_URL", "sh", "-c", script],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        eventually(
            lambda: started.exists() or self.process.poll() is not None,
            timeout=120,
            message="the wrapper neither ran its command nor exited",
        )
        wait_for(started, timeout=0.1)  # or the wrapper exited without running it

    def stop(self) -> None:
        self.finish.touch()
        _, stderr = self.process.communicate(timeout=30)
        assert self.process.returncode == 0, stderr


def ran(wrapper: Sequence[str], env: dict[str, str], tmp: Path) -> bool:
    """Run a copy of the job; whether its command ran."""
    marker = tmp / f"{uuid.uuid4().hex}.ran"
    result = subprocess.run(
        [*wrapper, "DATABASE_URL", "touch", str(marker)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr  # "held elsewhere" is a quiet 0 in both
    return marker.exists()


def test_a_lease_held_by_one_version_keeps_the_other_out(
    versions: tuple[list[str], list[str]], fleet_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    holder, contender = versions
    env = {**fleet_env, "LOCK_STRATEGY": "lease"}
    key = lease_key(env["LOCK_KEY"])
    held = Holder(holder, env, tmp_path)
    try:
        row = rows.get(key)
        assert row is not None and not row.expired
        assert not ran(contender, env, tmp_path)
        after = rows.get(key)
        assert after is not None and after.value == row.value and not after.expired
    finally:
        held.stop()
    # Released on exit by either version: the other one runs now.
    assert ran(contender, env, tmp_path)


def test_a_slot_started_by_one_version_is_not_started_again_by_the_other(
    versions: tuple[list[str], list[str]], fleet_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    holder, contender = versions
    env = {**fleet_env, "LOCK_STRATEGY": "schedule"}
    key = schedule_key(env["LOCK_KEY"])
    assert ran(holder, env, tmp_path)  # the first machine runs the job
    row = rows.get(key)
    assert row is not None and not row.expired
    assert not ran(contender, env, tmp_path)  # the next one, in the same slot, not
    assert rows.get(key) == row


def test_a_run_into_the_next_slot_keeps_the_other_version_out_by_its_lease(
    versions: tuple[list[str], list[str]], fleet_env: dict[str, str], rows: Rows, tmp_path: Path
) -> None:
    holder, contender = versions
    env = {**fleet_env, "LOCK_STRATEGY": "schedule,lease"}
    held = Holder(holder, env, tmp_path)
    try:
        assert not ran(contender, env, tmp_path)  # same slot
        rows.expire(schedule_key(env["LOCK_KEY"]))  # as if the next slot had begun
        assert not ran(contender, env, tmp_path)  # the run still going holds the lease
    finally:
        held.stop()

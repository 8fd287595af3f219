"""A fleet mixing versions runs the same Python code: one script written for 0.1.0's
``with_locks(context, strategies)``, run by dislock 0.1.0 and by this version on one
table, sync and asyncio, keeps the other version out whichever holds the lease."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.eventually import wait_for
from tests.support.old_release import PyPIUnreachable, old_dislock_venv

pytestmark = pytest.mark.slow

# 0.1.0's API, as its users wrote it: every LockContext field given.
SCRIPT = textwrap.dedent(
    """
    import asyncio, os, pathlib, socket, sys, time

    from dislock import LockContext, LockNotAcquiredError

    context = LockContext(
        url=os.environ["TEST_URL"],
        table_parts=os.environ["TEST_TABLE"].split("."),
        lock_key=os.environ["TEST_KEY"],
        owner=f"{socket.gethostname()}:{os.getpid()}",
        run_ttl_seconds=30.0,
        lease_interval_seconds=1.0,
    )
    started, finish = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])

    if sys.argv[1] == "sync":
        from dislock import with_locks

        @with_locks(context, ["lease"])
        def job():
            started.touch()
            while not finish.exists():
                time.sleep(0.02)

        run = job
    else:
        from dislock.aio import with_locks

        @with_locks(context, ["lease"])
        async def job():
            started.touch()
            while not finish.exists():
                await asyncio.sleep(0.02)

        def run():
            asyncio.run(job())

    try:
        run()
        print("ran")
    except LockNotAcquiredError:
        print("busy")
    """
)
PAIRS = [("0.1.0", "0.2.0"), ("0.2.0", "0.1.0")]


@pytest.fixture(scope="session")
def pythons() -> dict[str, str]:
    try:
        old_python = old_dislock_venv() / "bin" / "python"
    except PyPIUnreachable as exc:
        pytest.skip(f"{exc}; the tests of a mixed 0.1.0/0.2.0 fleet need it")
    return {"0.1.0": str(old_python), "0.2.0": sys.executable}


@pytest.mark.parametrize("flavour", ["sync", "aio"])
@pytest.mark.parametrize(("holder", "contender"), PAIRS)
def test_the_same_decorated_code_excludes_across_versions(
    pythons: dict[str, str],
    database_url: str,
    lock_table: tuple[str, str],
    tmp_path: Path,
    flavour: str,
    holder: str,
    contender: str,
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {
        "TEST_URL": database_url,
        "TEST_TABLE": ".".join(lock_table),
        "TEST_KEY": f"job-{flavour}",
        "PATH": "/usr/bin:/bin",
    }
    started, finish = tmp_path / "started", tmp_path / "finish"
    holding = subprocess.Popen(
        [pythons[holder], str(script), flavour, str(started), str(finish)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(started, timeout=60)
        other = subprocess.run(
            [pythons[contender], str(script), flavour, str(tmp_path / "x"), str(finish)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (other.returncode, other.stdout.strip()) == (0, "busy"), other.stderr
        assert not (tmp_path / "x").exists()
    finally:
        finish.touch()
        out, err = holding.communicate(timeout=60)
    assert (holding.returncode, out.strip()) == (0, "ran"), err

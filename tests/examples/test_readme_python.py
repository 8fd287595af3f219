"""Every Python block of README.md, and the decorator block it points to (docs/api-sync.md),
run as printed: each one alone, as a program of its own (``python block.py``), against the real
database. ``$DATABASE_URL``, which the blocks read, names this test's table; nothing else is
given to them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[2]
RunBlock = Callable[[str], str]


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", page.read_text(), flags=re.M | re.S)


BLOCKS = python_blocks(ROOT / "README.md")
DIGEST = [
    block for block in python_blocks(ROOT / "docs" / "api-sync.md") if "daily_digest" in block
]


@pytest.fixture
def run_block(database_url: str, lock_table: tuple[str, str], tmp_path: Path) -> RunBlock:
    params = conninfo_to_dict(database_url)
    params["options"] = f"-c search_path={lock_table[0]}"  # key_value: this test's table
    # The nightly slot (03:00) and the digest's (06:00) must not end while the test runs.
    zone = "Etc/GMT-12" if datetime.now(UTC).hour in (2, 3, 5, 6) else "UTC"
    env = {**os.environ, "DATABASE_URL": make_conninfo("", **params), "TZ": zone}

    def run(marker: str) -> str:
        (block,) = [block for block in BLOCKS + DIGEST if marker in block]
        program = tmp_path / "block.py"
        program.write_text(block)
        done = subprocess.run(
            [sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=60
        )
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        return done.stdout

    return run


def held(url: str) -> dict[str, bool]:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(
            conn.execute(
                "SELECT key, expire_at > NOW() FROM key_value WHERE key LIKE 'cronjob-lock:%'"
            ).fetchall()
        )


def test_the_readme_has_the_python_blocks_this_test_runs() -> None:
    assert len(BLOCKS) == 2, "a new Python block in README.md: run it here too"
    assert len(DIGEST) == 1, "docs/api-sync.md's daily_digest block is not there once"


def test_the_sync_example_builds_the_report_once_per_slot_and_loads_under_the_lease(
    run_block: RunBlock, database_url: str, lock_table: tuple[str, str]
) -> None:
    first = run_block("ScheduleLock(nightly)")
    assert first == "report built\nloaded batch 1\nloaded batch 2\n"
    again = run_block("ScheduleLock(nightly)")  # the slot is taken: no second report
    assert again == "loaded batch 1\nloaded batch 2\n"
    url = make_conninfo(database_url, options=f"-c search_path={lock_table[0]}")
    assert held(url) == {
        "cronjob-lock:schedule:nightly-report": True,  # until the next 03:00
        "cronjob-lock:lease:importer": False,  # released after the import
    }


def test_the_decorator_block_defines_the_function(run_block: RunBlock) -> None:
    # What calling it does, on two replicas, is tests/examples/test_readme_decorator.py's.
    assert run_block("@with_locks(") == ""


def test_the_asyncio_example_is_a_whole_program(
    run_block: RunBlock, database_url: str, lock_table: tuple[str, str]
) -> None:
    assert run_block("asyncio.run(main())") == "imported\n"
    url = make_conninfo(database_url, options=f"-c search_path={lock_table[0]}")
    assert held(url) == {"cronjob-lock:lease:importer": False}

"""The examples users copy from the specification, run as written (the URL aside)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SPEC_URL = "postgresql://user:pass@localhost:5432/app"

HIGH_LEVEL = """
from datetime import datetime, timedelta, UTC

from dislock import LockContext, run_with_locks

context = LockContext(
    url="postgresql://user:pass@localhost:5432/app",
    table_parts=["key_value"],
    lock_key="daily-report",
    owner="host:12345",
    next_run_time=datetime.now(UTC) + timedelta(hours=1),
)

exit_code = run_with_locks(
    ["python3", "worker.py"],
    context=context,
    strategies=("schedule",),
)
"""

SCHEDULE_LOCK = """
from datetime import datetime, timedelta, UTC

from dislock import LockContext, ScheduleLock
from dislock import LockNotAcquiredError

context = LockContext(
    url="postgresql://user:pass@localhost:5432/app",
    table_parts=["key_value"],
    lock_key="daily-report",
    owner="host:12345",
    next_run_time=datetime.now(UTC) + timedelta(hours=1),
)

try:
    with ScheduleLock(context):
        run_my_job()
except LockNotAcquiredError:
    pass  # another process already owns this schedule slot
"""

LEASE_LOCK = """
from dislock import LockContext, LeaseLock

context = LockContext(
    url="postgresql://user:pass@localhost:5432/app",
    table_parts=["key_value"],
    lock_key="importer",
    owner="host:12345",
    run_ttl_seconds=120.0,
    lease_interval_seconds=30.0,
)

with LeaseLock(context):
    run_long_job()
"""

COMBINED_CONTEXT = """
from datetime import datetime, timedelta, UTC

from dislock import LockContext

context = LockContext(
    url="postgresql://user:pass@localhost:5432/app",
    table_parts=["key_value"],
    lock_key="etl",
    owner="host:12345",
    next_run_time=datetime.now(UTC) + timedelta(hours=1),
    run_ttl_seconds=120.0,
    lease_interval_seconds=30.0,
)
"""

ACQUIRE_LOCKS = """
from dislock import LockContext, acquire_locks

with acquire_locks(context, strategies=("schedule", "lease")) as session:
    run_my_job()
"""

LEASE_LOST_LOOP = """
with acquire_locks(context, strategies=("lease",)) as session:
    for item in items:
        if session.lease_lost is not None and session.lease_lost.is_set():
            break  # another process may already own the lease
        process(item)
"""

# The README's form of it (0.2.0: ``lease_lost`` is always an event).
LEASE_LOST_LOOP_README = """
with acquire_locks(context, strategies=("lease",)) as session:
    for item in items:
        if session.lease_lost.is_set():
            break
        process(item)
"""

ASYNC_LEASE = """
import asyncio

from dislock import LockContext
from dislock.aio import LeaseLock


async def main() -> None:
    context = LockContext(
        url="postgresql://user:pass@localhost:5432/app",
        table_parts=["key_value"],
        lock_key="importer",
        owner="host:12345",
        run_ttl_seconds=120.0,
        lease_interval_seconds=30.0,
    )

    async with LeaseLock(context):
        await run_long_job()


asyncio.run(main())
"""

ASYNC_COMBINED = """
import asyncio

from dislock import LockContext
from dislock import aio

async def main() -> None:
    async with aio.acquire_locks(context, strategies=("schedule", "lease")):
        await run_my_job()

asyncio.run(main())
"""


@pytest.fixture
def example_url(database_url: str, lock_table: tuple[str, str]) -> str:
    """The test database, with the examples' unqualified ``key_value`` resolving to
    this test's own table."""
    params = conninfo_to_dict(database_url)
    params["options"] = f"-c search_path={lock_table[0]}"
    return make_conninfo("", **params)


def run_example(source: str, url: str, namespace: dict[str, Any]) -> dict[str, Any]:
    code = textwrap.dedent(source).replace(SPEC_URL, url)
    exec(compile(code, "<spec example>", "exec"), namespace)
    return namespace


def locked_rows(url: str) -> dict[str, bool]:
    with psycopg.connect(url, autocommit=True) as conn:
        # lock rows only: the table also holds dislock's failover metadata rows
        return dict(
            conn.execute(
                "SELECT key, expire_at > NOW() FROM key_value WHERE key LIKE 'cronjob-lock:%'"
            ).fetchall()
        )


def test_run_with_locks_example(
    example_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "worker.py").write_text("raise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    namespace = run_example(HIGH_LEVEL, example_url, {})
    assert namespace["exit_code"] == 3
    assert locked_rows(example_url) == {"cronjob-lock:schedule:daily-report": True}


def test_schedule_lock_example_runs_once_per_slot(example_url: str) -> None:
    runs: list[str] = []
    namespace = {"run_my_job": lambda: runs.append("ran")}
    run_example(SCHEDULE_LOCK, example_url, namespace)
    run_example(SCHEDULE_LOCK, example_url, namespace)
    assert runs == ["ran"]


def test_lease_lock_example(example_url: str) -> None:
    seen: dict[str, bool] = {}
    namespace = {"run_long_job": lambda: seen.update(locked_rows(example_url))}
    run_example(LEASE_LOCK, example_url, namespace)
    assert seen == {"cronjob-lock:lease:importer": True}
    assert locked_rows(example_url) == {"cronjob-lock:lease:importer": False}


def test_acquire_locks_examples(example_url: str) -> None:
    namespace = run_example(COMBINED_CONTEXT, example_url, {})
    held: dict[str, bool] = {}
    namespace["run_my_job"] = lambda: held.update(locked_rows(example_url))
    run_example(ACQUIRE_LOCKS, example_url, namespace)
    assert held == {"cronjob-lock:schedule:etl": True, "cronjob-lock:lease:etl": True}

    processed: list[int] = []
    namespace.update(items=[1, 2, 3], process=processed.append)
    run_example(LEASE_LOST_LOOP, example_url, namespace)
    assert processed == [1, 2, 3]
    run_example(LEASE_LOST_LOOP_README, example_url, namespace)
    assert processed == [1, 2, 3] * 2


def test_async_examples(example_url: str) -> None:
    seen: dict[str, bool] = {}

    async def run_long_job() -> None:
        seen.update(locked_rows(example_url))

    run_example(ASYNC_LEASE, example_url, {"run_long_job": run_long_job})
    assert seen == {"cronjob-lock:lease:importer": True}

    namespace = run_example(COMBINED_CONTEXT, example_url, {})
    namespace["run_my_job"] = run_long_job
    seen.clear()
    run_example(ASYNC_COMBINED, example_url, namespace)
    assert seen["cronjob-lock:lease:etl"] is True
    assert seen["cronjob-lock:schedule:etl"] is True

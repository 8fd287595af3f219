"""Contract: ``max_runtime_seconds`` (``LOCK_MAX_RUNTIME_SECONDS``) bounds a command run
under the locks, on every implementation of ``run_with_locks``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dislock import MAX_RUNTIME_EXIT_CODE, LockContext
from dislock.core.rows import lease_key
from dislock.core.supervision import KILL_GRACE
from tests.support.drivers import Driver
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 5.0, "lease_interval_seconds": 0.5}


@pytest.mark.parametrize("strategies", [["lease"], ["schedule", "lease"]])
def test_a_command_past_its_bound_is_stopped_and_its_locks_released(
    driver: Driver, make_context: MakeContext, rows: Rows, tmp_path: Path, strategies: list[str]
) -> None:
    finished = tmp_path / "finished"
    context = make_context(max_runtime_seconds=1, schedule="0 0 1 1 *", **LEASE)
    started = time.monotonic()
    status = driver.run_with_locks(["sh", "-c", f"sleep 30; touch {finished}"], context, strategies)
    took = time.monotonic() - started
    assert status == MAX_RUNTIME_EXIT_CODE == 124
    assert not finished.exists()
    # sh and its sleep go at SIGTERM: the bound decides, not the grace.
    assert 1.0 <= took < 1.0 + KILL_GRACE, took
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired  # released once the group was gone


def test_a_command_within_its_bound_is_left_alone(
    driver: Driver, make_context: MakeContext
) -> None:
    context = make_context(max_runtime_seconds=30, **LEASE)
    assert driver.run_with_locks(["sh", "-c", "exit 3"], context, ["lease"]) == 3

"""``max_runtime_seconds`` on a guarded Python block: ``dislock.aio`` cancels the block at
its bound and raises ``MaxRuntimeExceeded``; the sync flavour, which cannot interrupt a
thread, tells the block through ``LockSession.time_left`` and raises as a late block
ends.  Either way the locks are released and the history says ``timed_out``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import dislock
import dislock.aio
from dislock import LeaseLossPolicy, LockContext, MaxRuntimeExceeded
from dislock.core.rows import lease_key
from tests.support.rows import Rows, history_runs

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 5.0, "lease_interval_seconds": 0.5}


def outcome(db: psycopg.Connection[Any], history: tuple[str, ...], key: str) -> str:
    (run,) = history_runs(db, history, key)
    return str(run["outcome"])


def test_sync_a_block_told_its_time_and_raising_when_it_ends_late(
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
) -> None:
    context = make_context(max_runtime_seconds=1, history=True, **LEASE)
    lefts: list[float | None] = []

    def block() -> None:
        with dislock.acquire_locks(context, "lease") as session:
            lefts.append(session.time_left())
            while (session.time_left() or 0.0) > 0:
                time.sleep(0.05)  # work, stopping at a safe point too late
            time.sleep(0.1)

    with pytest.raises(MaxRuntimeExceeded, match="maximum runtime of 1 s"):
        block()
    assert lefts[0] is not None and 0 < lefts[0] <= 1.0
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired
    assert outcome(db, history, context.lock_key) == "timed_out"


def test_sync_a_block_within_its_bound_ends_as_it_would(make_context: MakeContext) -> None:
    context = make_context(max_runtime_seconds=30, **LEASE)
    with dislock.acquire_locks(context, "lease") as session:
        left = session.time_left()
        assert left is not None and left > 20
    with dislock.acquire_locks(make_context(**LEASE), "lease") as session:
        assert session.time_left() is None
    with pytest.raises(KeyError), dislock.acquire_locks(context, "lease"):
        raise KeyError("the block's own error is not masked")


@pytest.mark.parametrize("policy", [LeaseLossPolicy.TERMINATE, LeaseLossPolicy.CONTINUE])
def test_aio_a_block_past_its_bound_is_cancelled(
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    history: tuple[str, ...],
    policy: LeaseLossPolicy,
) -> None:
    context = make_context(max_runtime_seconds=1, history=True, lease_loss_policy=policy, **LEASE)
    reached: list[str] = []

    async def block() -> None:
        async with dislock.aio.acquire_locks(context, "lease"):
            await asyncio.sleep(30)
            reached.append("the end of the block")

    async def run() -> float:
        started = time.monotonic()
        with pytest.raises(MaxRuntimeExceeded, match="the block was cancelled"):
            await block()
        return time.monotonic() - started

    took = asyncio.run(run())
    assert reached == []
    assert 1.0 <= took < 10.0, took
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired
    assert outcome(db, history, context.lock_key) == "timed_out"


def test_aio_a_bound_with_a_schedule_alone_and_a_decorated_function(
    make_context: MakeContext,
) -> None:
    context = make_context(max_runtime_seconds=1, schedule="0 0 1 1 *")

    @dislock.aio.acquire_locks(context, "schedule")
    async def job() -> None:
        await asyncio.sleep(30)

    async def run() -> None:
        with pytest.raises(MaxRuntimeExceeded):
            await job()

    asyncio.run(run())


def test_aio_another_cancellation_still_stands(make_context: MakeContext) -> None:
    context = make_context(max_runtime_seconds=30, **LEASE)

    async def block() -> None:
        async with dislock.aio.acquire_locks(context, "lease"):
            await asyncio.sleep(30)

    async def run() -> None:
        task = asyncio.create_task(block())
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())

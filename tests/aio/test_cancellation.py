"""asyncio-only behaviour: cancelling the task that holds a lock."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

import dislock.aio
from dislock import LockContext
from dislock.core.rows import lease_key
from tests.support.eventually import eventually_async
from tests.support.rows import Row, Rows

MakeContext = Callable[..., LockContext]
# Frequent renewals; a TTL that leaves a loaded machine over a second of stalled
# renewals before the lease is lost (the local deadline is 90 % of the TTL).
LEASE = {"run_ttl_seconds": 2.0, "lease_interval_seconds": 0.2}


async def hold_until_cancelled(
    context: LockContext, entered: asyncio.Event, lost: list[asyncio.Event] | None = None
) -> None:
    async with dislock.aio.acquire_locks(context, ["lease"]) as session:
        if lost is not None:
            lost.append(session.lease_lost)
        entered.set()
        await asyncio.sleep(3600)


def other_tasks() -> set[asyncio.Task[Any]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


@pytest.mark.asyncio
async def test_cancelling_the_holder_releases_the_lease_and_stops_the_renewer(
    make_context: MakeContext, rows: Rows, caplog: pytest.LogCaptureFixture
) -> None:
    context = make_context(**LEASE)
    entered = asyncio.Event()
    holder = asyncio.create_task(hold_until_cancelled(context, entered))
    await entered.wait()
    key = lease_key(context.lock_key)

    def renewed_past(seen: Row) -> Row | None:
        row = rows.get(key)
        return row if row is not None and row.expire_at > seen.expire_at else None

    seen = rows.get(key)
    assert seen is not None
    for _ in range(2):  # a couple of renewals
        seen = await eventually_async(partial(renewed_past, seen), message="no renewal")
    assert any("dislock-renewer" in task.get_name() for task in other_tasks())

    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder

    assert other_tasks() == set()
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired
    gc.collect()
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]


@pytest.mark.asyncio
async def test_cancelling_after_loss_leaves_the_new_owner_alone(
    make_context: MakeContext, rows: Rows
) -> None:
    # CONTINUE: the loss itself cancels nothing, and the block is still running.
    context = make_context(lease_loss_policy="continue", **LEASE)
    entered = asyncio.Event()
    lost: list[asyncio.Event] = []
    holder = asyncio.create_task(hold_until_cancelled(context, entered, lost))
    await entered.wait()
    key = lease_key(context.lock_key)
    rows.steal(key)
    stolen = rows.get(key)
    await asyncio.wait_for(lost[0].wait(), 10.0)  # the renewer noticed, however slowly

    holder.cancel()
    with pytest.raises(asyncio.CancelledError):  # not masked by LeaseLostError
        await holder
    assert other_tasks() == set()
    assert rows.get(key) == stolen


@pytest.mark.asyncio
async def test_under_terminate_the_loss_cancels_the_block_itself(
    make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    entered = asyncio.Event()
    lost: list[asyncio.Event] = []
    holder = asyncio.create_task(hold_until_cancelled(context, entered, lost))
    await entered.wait()
    key = lease_key(context.lock_key)
    rows.steal(key)
    stolen = rows.get(key)
    with pytest.raises(dislock.LeaseLostError, match="the block was cancelled"):
        await asyncio.wait_for(holder, 30.0)
    assert lost[0].is_set()
    assert other_tasks() == set()
    assert rows.get(key) == stolen


@pytest.mark.asyncio
async def test_cancelling_a_wrapped_command_kills_it_and_releases(
    make_context: MakeContext, rows: Rows, tmp_path: Any
) -> None:
    context = make_context(**LEASE)
    started = tmp_path / "started"
    runner = asyncio.create_task(
        dislock.aio.run_with_locks(
            ["sh", "-c", f'echo $$ > "{started}.pid"; touch "{started}"; exec sleep 600'],
            context=context,
            strategies=["lease"],
        )
    )
    await eventually_async(started.exists, message="the command did not start")
    pid = int((tmp_path / "started.pid").read_text())
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert other_tasks() == set()
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.asyncio
async def test_forwarding_signals_gives_back_the_previous_handlers(
    make_context: MakeContext,
) -> None:
    import signal

    from dislock.core.supervision import FORWARDED_SIGNALS

    def mine(signum: int, frame: object) -> None:
        return None

    previous = signal.signal(signal.SIGUSR1, mine)
    try:
        status = await dislock.aio.run_with_locks(
            ["true"],
            context=make_context(**LEASE),
            strategies=["lease"],
            forward_signals=FORWARDED_SIGNALS,
        )
        assert status == 0
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.asyncio
async def test_a_lease_lock_can_be_entered_again_with_the_same_event(
    make_context: MakeContext, rows: Rows
) -> None:
    lock = dislock.aio.LeaseLock(make_context(**LEASE))
    before = lock.lease_lost  # fetched before entering: still the one that fires
    async with lock:
        assert lock.lease_lost is before and not before.is_set()
    async with lock:
        assert lock.lease_lost is before and not before.is_set()
    row = rows.get(lease_key(lock.context.lock_key))
    assert row is not None and row.expired

"""The lease-loss surface of the Python API, sync and asyncio alike: ``lease_lost``
is always an event, one per lock object (cleared, never replaced, on re-entry),
``is_lost()`` only asks, ``declare_if_lost()`` makes the loss known."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import dislock
import dislock.aio
from dislock import LeaseLossPolicy, LockContext
from dislock.core.rows import lease_key
from tests.support.eventually import eventually, eventually_async
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
# Frequent renewals; a TTL that leaves a loaded machine over a second of stalled
# renewals before the lease is lost (the local deadline is 90 % of the TTL).
LEASE = {"run_ttl_seconds": 2.0, "lease_interval_seconds": 0.1}
YEARLY = "0 0 1 1 *"


def state(lock: Any) -> tuple[float | None, str | None]:
    """The lock's deadline and loss reason (read afresh: mypy narrows attributes)."""
    return lock.deadline, lock.lost_reason


def test_sync_event_fetched_before_entering_fires_on_a_later_entry(
    make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(lease_loss_policy=LeaseLossPolicy.CONTINUE, **LEASE)
    lock = dislock.LeaseLock(context)
    lost = lock.lease_lost
    with lock:
        assert lock.lease_lost is lost and not lost.is_set() and not lock.is_lost()
        assert lock.deadline is not None and lock.deadline > time.monotonic()
    assert state(lock) == (None, None)
    with lock:
        rows.steal(lease_key(context.lock_key))
        eventually(lost.is_set, timeout=10.0, message="lease_lost was never set")
        assert lock.is_lost() and lock.lost_reason is not None
    # Kept after leaving, until the next entry clears it.
    assert lost.is_set() and lock.is_lost() and "no longer ours" in (lock.lost_reason or "")
    rows.expire(lease_key(context.lock_key))  # free again
    with lock:
        assert lock.lease_lost is lost and not lost.is_set() and state(lock)[1] is None
        # Renewed twice (every 0.1 s) and still not lost: nothing of the lost
        # acquisition reaches this one.
        eventually(lambda: lock.renewals >= 2, timeout=10.0, message="the lock was not renewed")
        assert not lost.is_set()


def test_sync_is_lost_only_asks_and_declare_if_lost_declares(
    make_context: MakeContext, caplog: pytest.LogCaptureFixture
) -> None:
    context = make_context(lease_loss_policy=LeaseLossPolicy.CONTINUE, **LEASE)
    lock = dislock.LeaseLock(context)
    with lock:
        held = lock._held
        assert held is not None
        # Out of the workers' sight, the local deadline passes: nothing has said so.
        held.hub.renewer.unregister(held.renewal)
        held.renewal.clock.deadline = time.monotonic() - 0.001
        records = len(caplog.records)
        assert lock.is_lost() and lock.is_lost()
        assert not lock.lease_lost.is_set() and lock.lost_reason is None  # only asked
        assert caplog.records[records:] == []
        held.hub.renewer.register(held.renewal, lock.lease_lost)  # the watchdog may race us now
        assert lock.declare_if_lost() and lock.lease_lost.is_set()
        assert lock.declare_if_lost()
        losses = [r for r in caplog.records[records:] if "lost:" in r.getMessage()]
        assert len(losses) == 1 and "deadline" in losses[0].getMessage()  # said once


def test_sync_session_event_is_always_there(make_context: MakeContext) -> None:
    with dislock.acquire_locks(make_context(schedule=YEARLY), ["schedule"]) as session:
        assert not session.lease_lost.is_set()
        assert session.lease is None
    context = make_context(lease_loss_policy=LeaseLossPolicy.CONTINUE, **LEASE)
    with dislock.acquire_locks(context, ["lease"]) as session:
        assert session.lease is not None and session.lease_lost is session.lease.lease_lost


def test_aio_event_fetched_before_entering_fires_on_a_later_entry(
    make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(lease_loss_policy=LeaseLossPolicy.CONTINUE, **LEASE)

    async def scenario() -> None:
        lock = dislock.aio.LeaseLock(context)
        lost = lock.lease_lost
        async with lock:
            pass
        async with lock:
            assert lock.lease_lost is lost and not lost.is_set()
            rows.steal(lease_key(context.lock_key))
            await asyncio.wait_for(lost.wait(), 10.0)
            assert lock.is_lost() and lock.lost_reason is not None
        rows.expire(lease_key(context.lock_key))
        async with lock:
            assert not lost.is_set() and lock.renewals == 0
            await eventually_async(  # a renewal every 0.1 s, however loaded
                lambda: lock.renewals >= 1, timeout=10.0, message="the lock was never renewed"
            )
            assert not lost.is_set() and lock.renewals >= 1

    asyncio.run(scenario())


def test_aio_session_event_is_always_there(make_context: MakeContext) -> None:
    async def scenario() -> None:
        async with dislock.aio.acquire_locks(
            make_context(schedule=YEARLY), ["schedule"]
        ) as session:
            assert isinstance(session.lease_lost, asyncio.Event)
            assert not session.lease_lost.is_set()

    asyncio.run(scenario())

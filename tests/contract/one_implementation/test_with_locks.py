"""The decorators (``with_locks``, ``acquire_locks`` on a function), the short
form's defaults and a lost lease cancelling guarded asyncio code, on each Python
flavour in turn (the CLI has no decorators)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

import dislock
import dislock.aio
from dislock import (
    ConfigurationError,
    LeaseLossPolicy,
    LeaseLostError,
    LockContext,
    LockNotAcquiredError,
)
from dislock.core.rows import lease_key, schedule_key
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
# Frequent renewals; a TTL that leaves a loaded machine over a second of stalled
# renewals before the lease is lost (the local deadline is 90 % of the TTL).
LEASE = {"run_ttl_seconds": 2.0, "lease_interval_seconds": 0.1}
YEARLY = "0 0 1 1 *"
OWNER_TOKEN = re.compile(rf"{re.escape(socket.gethostname())}:\d+:[0-9a-f]{{8}}")


def other_tasks() -> set[asyncio.Task[Any]]:
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


# -- the 0.1.0 form --------------------------------------------------------------


def test_sync_with_locks_runs_once_per_slot_and_returns_the_result(
    make_context: MakeContext,
) -> None:
    context = make_context(schedule=YEARLY)

    @dislock.with_locks(context, ["schedule"])
    def job(x: int) -> int:
        return x * 2

    assert job(21) == 42
    with pytest.raises(LockNotAcquiredError):
        job(1)


def test_aio_with_locks_runs_once_per_slot_and_returns_the_result(
    make_context: MakeContext,
) -> None:
    context = make_context(schedule=YEARLY)

    @dislock.aio.with_locks(context, ["schedule"])
    async def job(x: int) -> int:
        return x * 2

    async def scenario() -> None:
        assert await job(21) == 42
        with pytest.raises(LockNotAcquiredError):
            await job(1)

    asyncio.run(scenario())


def test_sync_lease_is_held_during_the_call_and_released_after(
    make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    other = make_context(**LEASE)  # same key, another owner
    seen: list[str] = []

    @dislock.with_locks(context, ["lease"])
    def job() -> None:
        row = rows.get(lease_key(context.lock_key))
        assert row is not None and not row.expired
        seen.append(row.value)
        with pytest.raises(LockNotAcquiredError), dislock.acquire_locks(other, "lease"):
            pass

    job()
    job()  # released: the second call gets it again
    assert seen == [context.owner, context.owner]
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired


def test_sync_lease_lost_during_the_call_raises_on_return(
    make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    finished: list[bool] = []

    @dislock.with_locks(context, ["lease"])
    def job() -> None:
        rows.steal(lease_key(context.lock_key))
        # Past the local deadline (90 % of the TTL) with every renewal refused:
        # lost whatever the scheduler did meanwhile.
        time.sleep(LEASE["run_ttl_seconds"] * 1.25)
        finished.append(True)

    with pytest.raises(LeaseLostError):
        job()
    assert finished == [True]  # a thread is not interrupted
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.value == "thief"  # the new holder's row is left alone


# -- asyncio: a lost lease cancels the guarded code --------------------------------


def test_aio_with_locks_cancels_the_coroutine_when_the_lease_is_lost(
    make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    cancelled: list[bool] = []

    @dislock.aio.with_locks(context, ["lease"])
    async def job() -> str:
        rows.steal(lease_key(context.lock_key))
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "finished"

    async def scenario() -> None:
        started = time.monotonic()
        with pytest.raises(LeaseLostError) as caught:
            await asyncio.wait_for(job(), 60)
        assert time.monotonic() - started < 60
        assert "cancelled" in str(caught.value)
        assert caught.value.reason
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the cancellation was taken back
        assert other_tasks() == set()

    asyncio.run(scenario())
    assert cancelled == [True]
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.value == "thief"


def test_aio_block_under_terminate_is_cancelled_and_ends_with_lease_lost(
    make_context: MakeContext, rows: Rows
) -> None:
    context = make_context(**LEASE)
    reached: list[str] = []

    async def block() -> None:
        async with dislock.aio.acquire_locks(context, "lease"):
            rows.steal(lease_key(context.lock_key))
            await asyncio.sleep(3600)
            reached.append("after the sleep")

    async def scenario() -> None:
        with pytest.raises(LeaseLostError):
            await block()
        # The task goes on: the cancellation became the error.
        await asyncio.sleep(0)
        reached.append("after the block")
        assert other_tasks() == set()

    asyncio.run(scenario())
    assert reached == ["after the block"]


def test_aio_block_under_continue_runs_to_completion(make_context: MakeContext, rows: Rows) -> None:
    context = make_context(lease_loss_policy=LeaseLossPolicy.CONTINUE, **LEASE)

    async def scenario() -> bool:
        async with dislock.aio.acquire_locks(context, "lease") as session:
            rows.steal(lease_key(context.lock_key))
            await asyncio.wait_for(session.lease_lost.wait(), 30)
            await asyncio.sleep(0.3)  # time for a cancellation, had there been one
        return True

    assert asyncio.run(scenario())


def test_aio_cancelling_a_guarded_task_from_outside_still_cancels_it(
    make_context: MakeContext, rows: Rows
) -> None:
    """The guard turns only its own cancellation into LeaseLostError."""
    context = make_context(**LEASE)

    async def scenario() -> None:
        entered = asyncio.Event()

        async def hold() -> None:
            async with dislock.aio.acquire_locks(context, "lease"):
                entered.set()
                await asyncio.sleep(3600)

        holder = asyncio.create_task(hold())
        await entered.wait()
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        assert other_tasks() == set()

    asyncio.run(scenario())
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired


def test_aio_acquire_locks_decorates_a_coroutine_function(make_context: MakeContext) -> None:
    context = make_context(schedule=YEARLY)

    @dislock.aio.acquire_locks(context, "schedule")
    async def job() -> str:
        return "ran"

    async def scenario() -> None:
        assert await job() == "ran"
        with pytest.raises(LockNotAcquiredError):
            await job()

    asyncio.run(scenario())


def test_sync_acquire_locks_decorates_a_function(make_context: MakeContext) -> None:
    context = make_context(schedule=YEARLY)

    @dislock.acquire_locks(context, "schedule")
    def job() -> str:
        return "ran"

    assert job() == "ran"
    with pytest.raises(LockNotAcquiredError):
        job()


# -- the short form ----------------------------------------------------------------


def test_sync_short_form_reads_the_url_and_makes_an_owner_per_call(
    database_url: str,
    lock_table: tuple[str, str],
    rows: Rows,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    seen: list[str] = []

    @dislock.with_locks("short-sync", table_parts=lock_table, run_ttl_seconds=5)
    def job() -> None:
        row = rows.get(lease_key("short-sync"))
        assert row is not None and not row.expired
        seen.append(row.value)

    job()
    job()
    assert len(seen) == 2 and seen[0] != seen[1]
    assert all(OWNER_TOKEN.fullmatch(value) for value in seen)


def test_aio_short_form_with_schedule_and_lease(
    database_url: str,
    lock_table: tuple[str, str],
    rows: Rows,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    held: list[bool] = []

    @dislock.aio.with_locks("short-aio", table_parts=lock_table, schedule=YEARLY, run_ttl_seconds=5)
    async def job() -> None:
        lease = rows.get(lease_key("short-aio"))
        slot = rows.get(schedule_key("short-aio"))
        held.append(lease is not None and not lease.expired and slot is not None)

    async def scenario() -> None:
        await job()
        with pytest.raises(LockNotAcquiredError):  # the slot is used
            await job()

    asyncio.run(scenario())
    assert held == [True]


@pytest.mark.parametrize("flavour", [dislock, dislock.aio])
def test_short_form_mistakes_fail_as_the_function_is_decorated(
    flavour: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    with pytest.raises(ConfigurationError, match="give schedule="):
        flavour.with_locks("nothing-to-lock")
    with pytest.raises(ConfigurationError, match="run_ttl_seconds"):
        flavour.with_locks("bad-ttl", run_ttl_seconds=-1)
    with pytest.raises(ConfigurationError, match="takes no settings"):
        flavour.with_locks(LockContext(lock_key="k", schedule=YEARLY), schedule=YEARLY)
    monkeypatch.delenv("DATABASE_URL")
    with pytest.raises(ConfigurationError, match=r"\$DATABASE_URL is not set"):
        flavour.with_locks("no-url", schedule=YEARLY)


# -- history of a lock entered on its own --------------------------------------------

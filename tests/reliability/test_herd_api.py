"""The herd at :00 through the asyncio API: 24 machines (each its own event loop, so
its own connection, as on separate hosts) race one slot and one lease against a
role whose connection limit is in use at the start. Exactly one takes the lock; every
other one is told it is held elsewhere, none fails. (The sync API shares one
connection per process, so its herd is the CLI's: tests/cli/test_herd.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

import dislock.aio
from dislock import LockContext, LockNotAcquiredError

HERD, LIMIT = 24, 4


@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_aio_herd_takes_the_lock_once_and_fails_nobody(
    make_context: Callable[..., LockContext], limited_url: str, strategy: str
) -> None:
    base = make_context(
        url=limited_url, schedule="0 0 1 1 *", run_ttl_seconds=30, lease_interval_seconds=5
    )
    go, decided = threading.Event(), threading.Barrier(HERD + 1)
    outcomes: list[str] = []

    def wait_for_everyone() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            decided.wait(60)

    async def machine(index: int) -> str:
        context = LockContext(
            url=base.url,
            table_parts=base.table_parts,
            lock_key=base.lock_key,
            owner=f"machine-{index}",
            schedule=base.schedule,
            run_ttl_seconds=base.run_ttl_seconds,
            lease_interval_seconds=base.lease_interval_seconds,
        )
        try:
            async with dislock.aio.acquire_locks(context, [strategy]):
                await asyncio.to_thread(wait_for_everyone)  # hold until everyone decided
                return "ran"
        except LockNotAcquiredError:
            await asyncio.to_thread(wait_for_everyone)
            return "held elsewhere"

    def run(index: int) -> None:
        go.wait()
        try:
            outcomes.append(asyncio.run(machine(index)))
        except Exception as exc:  # the assertion below shows it
            outcomes.append(f"{type(exc).__name__}: {exc}")
            decided.abort()

    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(HERD)]
    for thread in threads:
        thread.start()
    go.set()
    time.sleep(1.0)  # every machine is refused at first
    for blocker in blockers:
        blocker.close()
    with contextlib.suppress(threading.BrokenBarrierError):  # a failure: shown below
        decided.wait(60)
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["held elsewhere"] * (HERD - 1) + ["ran"]

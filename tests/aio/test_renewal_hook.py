"""The renewer tells ``renewal_listeners`` of each renewal (the benchmark's hook)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

import dislock.aio
from dislock import LockContext
from dislock.core.renewal import renewal_listeners
from dislock.core.rows import lease_key

MakeContext = Callable[..., LockContext]


@pytest.mark.asyncio
async def test_listeners_hear_each_renewal_of_a_held_lease(make_context: MakeContext) -> None:
    context = make_context(run_ttl_seconds=2.0, lease_interval_seconds=0.2)
    heard: list[tuple[list[str], float]] = []

    def listener(keys: Sequence[str], seconds: float) -> None:
        heard.append((list(keys), seconds))

    renewal_listeners.append(listener)
    try:
        async with dislock.aio.LeaseLock(context):
            for _ in range(100):  # a few renewals, with room for a loaded machine
                if len(heard) >= 2:
                    break
                await asyncio.sleep(0.1)
    finally:
        renewal_listeners.remove(listener)
    assert len(heard) >= 2
    assert all(keys == [lease_key(context.lock_key)] and seconds >= 0 for keys, seconds in heard)

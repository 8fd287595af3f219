"""Many leases in one asyncio process: the server connections they take.

A process's leases share one connection and are renewed together in one
statement per tick, so the connections used should stay a handful (the target
is ten) whatever the number of leases; the server's ``max_connections`` is the
ceiling a connection per lease would hit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import psycopg

from benchmarks.rows import Row, met


class RenewalTimes:
    """Collects how long each batched renewal took, told by the renewer itself."""

    def __init__(self) -> None:
        self.milliseconds: list[float] = []

    def __call__(self, keys: Sequence[str], seconds: float) -> None:
        self.milliseconds.append(seconds * 1000)


@asynccontextmanager
async def many_leases(
    url: str, table: str, leases: int, ttl: float, interval: float
) -> AsyncIterator[RenewalTimes]:
    """``leases`` asyncio leases held at once in this process."""
    import dislock.aio
    from dislock import LockContext
    from dislock.core.renewal import renewal_listeners

    times = RenewalTimes()
    renewal_listeners.append(times)
    locks = [
        dislock.aio.LeaseLock(
            LockContext(
                url=url,
                table_parts=[table],
                lock_key=f"{table}-{n}",
                owner=f"bench:{n}",
                run_ttl_seconds=ttl,
                lease_interval_seconds=interval,
            )
        )
        for n in range(leases)
    ]
    try:
        async with AsyncExitStack() as stack:
            for lock in locks:
                await stack.enter_async_context(lock)
            yield times
    finally:
        renewal_listeners.remove(times)


def server_connections(url: str) -> tuple[int, int]:
    """Connections dislock has open on the server, and the server's limit."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE application_name = 'dislock'),"
            " current_setting('max_connections')::int FROM pg_stat_activity"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def lease_scale_rows(url: str, leases: int) -> list[Row]:
    async def connections_used() -> tuple[int, int]:
        async with many_leases(url, "key_value", leases, ttl=30.0, interval=5.0):
            return server_connections(url)

    used, limit = asyncio.run(connections_used())
    return [
        Row(
            f"{leases} concurrent leases in one asyncio process (server max_connections"
            f" = {limit}): server connections",
            "{connections}",
            "≤ 10",
            met(used <= 10),
            {"connections": used},
        ),
    ]

"""A warm acquire + release (``keep_connected``): what a lock costs a long-lived process.

Taking and releasing a lease are two writes, and PostgreSQL commits a write only
once its WAL is on disk: two single-row ``UPDATE`` round trips are the floor a
durable lock can reach (two ``SELECT 1`` are shown too, as the floor of any two
round trips).  The same two statements sent by hand with psycopg show what
dislock itself adds; ``pg_stat_database`` counts the statements per cycle.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import psycopg

from benchmarks.rows import Row, met
from benchmarks.server import BARE_TABLE
from benchmarks.timing import ROUNDS
from dislock.core.lock_statements import statements as lock_statements
from dislock.core.preparing import SERVER_PID, prepare_threshold


def commits(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    time.sleep(0.6)  # backends flush their statistics when they exit
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def cycle_context(url: str, table: str = "key_value") -> Any:
    from dislock import LockContext

    return LockContext(
        url=url,
        table_parts=table.split("."),
        lock_key="bench-cycle",
        owner=f"bench:{os.getpid()}",
        run_ttl_seconds=60.0,
        lease_interval_seconds=10.0,
    )


def sync_cycles(url: str, cycles: int, table: str = "key_value") -> float:
    """Seconds per acquire + release of a sync lease on a warm connection."""
    from dislock import LeaseLock, keep_connected

    context = cycle_context(url, table)
    with keep_connected(url):
        with LeaseLock(context):  # the first cycle warms psycopg's caches too
            pass
        started = time.perf_counter()
        for _ in range(cycles):
            with LeaseLock(context):
                pass
        return (time.perf_counter() - started) / cycles


def alternating_sync_cycles(
    url: str, tables: dict[str, str], blocks: int, block: int
) -> dict[str, float]:
    """Seconds per acquire + release of a sync lease on each of ``tables``: one warm
    connection, the tables taking turns in blocks of ``block`` cycles; the median
    of each table's blocks.  Turns a fraction of a second long put a slow spell of
    the machine (a shared host's, a checkpoint's) on every table alike, where
    rounds of a new connection each would see it fall on one."""
    from dislock import LeaseLock, keep_connected

    contexts = {name: cycle_context(url, table) for name, table in tables.items()}
    blocks_of: dict[str, list[float]] = {name: [] for name in tables}
    order = list(contexts)
    with keep_connected(url):
        for _ in range(10):  # past the connection's check and its statements' preparation
            for context in contexts.values():
                with LeaseLock(context):
                    pass
        for turn in range(blocks):
            for name in order if turn % 2 else reversed(order):
                started = time.perf_counter()
                for _ in range(block):
                    with LeaseLock(contexts[name]):
                        pass
                blocks_of[name].append((time.perf_counter() - started) / block)
    return {name: statistics.median(seconds) for name, seconds in blocks_of.items()}


def aio_cycles(url: str, cycles: int) -> float:
    """The same with the asyncio API."""
    import dislock.aio

    context = cycle_context(url)

    async def run() -> float:
        async with dislock.aio.keep_connected(url):
            async with dislock.aio.LeaseLock(context):
                pass
            started = time.perf_counter()
            for _ in range(cycles):
                async with dislock.aio.LeaseLock(context):
                    pass
            return (time.perf_counter() - started) / cycles

    return asyncio.run(run())


def cycle_rows(url: str, cycles: int) -> list[Row]:
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as warm:
        warm.execute("CREATE TABLE IF NOT EXISTS bench_write (k text PRIMARY KEY, t timestamptz)")
        warm.execute("INSERT INTO bench_write VALUES ('k', NOW()) ON CONFLICT DO NOTHING")
        # A session counts as one transaction in pg_stat_database by itself.
        before = commits(warm)
        for _ in range(cycles):
            psycopg.connect(url).close()
        per_connection = (commits(warm) - before - 1) / cycles

        def two(statement: str) -> float:
            started = time.perf_counter()
            for _ in range(cycles):
                warm.execute(statement)
                warm.execute(statement)
            return (time.perf_counter() - started) / cycles

        before = commits(warm)
        sync_cycles(url, cycles)
        # Counted once the shared connection has closed (a backend reports its
        # statistics when it exits): minus reading the counter, the session and
        # the warm-up cycle.
        per_cycle = (commits(warm) - before - 1 - per_connection - 2) / cycles

        # Timed in interleaved rounds, medians kept, so that drift on a noisy
        # machine hits every measure alike.
        statements = lock_statements(("key_value",))
        key = "cronjob-lock:lease:bench-by-hand"
        acquiring = statements.acquire_for(key, "bench", 60.0)
        releasing = statements.release(key, "bench", "bench-by-hand")
        acquire, release = acquiring.query.as_bytes(warm), releasing.query.as_bytes(warm)
        acquire_params, release_params = acquiring.params, releasing.params
        # Prepared as dislock's shared connection prepares them: only when no
        # pooler is in between (dislock.core.preparing).
        manual = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        pid = SERVER_PID.read(manual.execute(SERVER_PID.query).fetchall())
        manual.prepare_threshold = prepare_threshold(manual.info.backend_pid, pid)

        def by_hand() -> float:
            """The same two statements, sent with psycopg and nothing else."""
            started = time.perf_counter()
            for _ in range(cycles):
                manual.execute(acquire, acquire_params).fetchone()
                manual.execute(release, release_params)
            return (time.perf_counter() - started) / cycles

        rounds: dict[str, list[float]] = {
            "reads": [],
            "writes": [],
            "by hand": [],
            "sync": [],
            "aio": [],
            "bare": [],
        }
        for _ in range(ROUNDS):
            rounds["reads"].append(two("SELECT 1"))
            # Every lock statement is a write, and a committed write waits for
            # the WAL to reach the disk: the floor a durable lock can reach.
            rounds["writes"].append(two("UPDATE bench_write SET t = NOW() WHERE k = 'k'"))
            rounds["by hand"].append(by_hand())
            rounds["sync"].append(sync_cycles(url, cycles))
            rounds["aio"].append(aio_cycles(url, cycles))
            rounds["bare"].append(sync_cycles(url, cycles, BARE_TABLE))
        manual.close()
        reads, writes, hand, ours, ours_aio, bare = (statistics.median(rounds[k]) for k in rounds)
    return [
        Row(
            "acquire + release on a warm connection (`keep_connected`), sync:"
            " per cycle / two `SELECT 1` round trips",
            "{ratio:.2f} ({ours_ms:.3f} ms / {floor_ms:.3f} ms)",
            "≤ 1.3",
            met(
                ours / reads <= 1.3,
                "missed: a lock statement is a write, and its commit waits for the WAL flush",
            ),
            {"ratio": ours / reads, "ours_ms": ours * 1000, "floor_ms": reads * 1000},
        ),
        Row(
            "  same, per cycle / two single-row `UPDATE` round trips (durable commits)",
            "{ratio:.2f} ({floor_ms:.3f} ms)",
            "≤ 1.2",
            met(ours / writes <= 1.2),
            {"ratio": ours / writes, "floor_ms": writes * 1000},
        ),
        Row(
            "  same on a table without the lock functions (by hand, or dislock 0.1.0's):"
            " per cycle / two single-row `UPDATE` round trips",
            "{ratio:.2f} ({ours_ms:.3f} ms)",
            "report",
            numbers={"ratio": bare / writes, "ours_ms": bare * 1000},
        ),
        Row(
            "  same, per cycle / the same two statements sent by hand with psycopg"
            " (what dislock itself adds)",
            "{ratio:.2f} ({floor_ms:.3f} ms)",
            "report",
            numbers={"ratio": ours / hand, "floor_ms": hand * 1000},
        ),
        Row(
            "  same with asyncio, per cycle / two single-row `UPDATE` round trips",
            "{ratio:.2f} ({ours_ms:.3f} ms)",
            "≤ 1.2",
            met(ours_aio / writes <= 1.2),
            {"ratio": ours_aio / writes, "ours_ms": ours_aio * 1000},
        ),
        Row(
            "statements per acquire + release (pg_stat_database)",
            "{statements:.1f}",
            "2",
            met(round(per_cycle) <= 2),
            {"statements": per_cycle},
        ),
    ]

"""Renewals as HOT updates: many leases renewed every second must not bloat the lock table.

A renewal changes only ``expire_at``; with a fillfactor below 100 and no index on
that column, PostgreSQL can update the row in place on the same page (a HOT
update), so the table stays the size it reached in its first minute.  The floor
is that: every update HOT, the size flat.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import psycopg

from benchmarks.rows import Row, met
from benchmarks.scale import many_leases
from benchmarks.server import create_lock_table


def hot_rows(url: str, leases: int, seconds: float) -> list[Row]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS hot_locks")
        create_lock_table(conn, ("public", "hot_locks"))
        conn.execute("SELECT pg_stat_reset()")

        def size() -> int:
            row = conn.execute("SELECT pg_relation_size('hot_locks')").fetchone()
            assert row is not None
            return int(row[0])

        sizes: list[int] = []

        async def renew_for_a_while() -> list[float]:
            async with many_leases(url, "hot_locks", leases, ttl=3.0, interval=1.0) as times:
                first = min(60.0, seconds / 2)
                await asyncio.sleep(first)
                sizes.append(size())
                await asyncio.sleep(seconds - first)
                sizes.append(size())
                return times.milliseconds

        renewal_ms = asyncio.run(renew_for_a_while())
        time.sleep(0.6)
        stats = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd, c.reloptions"
            " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
            " WHERE s.relname = 'hot_locks'"
        ).fetchone()
        indexed = conn.execute(
            "SELECT count(*) FROM pg_index i JOIN pg_attribute a"
            " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = 'hot_locks'::regclass AND a.attname = 'expire_at'"
        ).fetchone()
    assert stats is not None and indexed is not None
    updates, hot, options = int(stats[0]), int(stats[1]), stats[2] or []
    share = hot / updates if updates else 0.0
    p99 = statistics.quantiles(renewal_ms, n=100)[98] if len(renewal_ms) >= 2 else float("nan")
    return [
        Row(
            f"{leases} leases renewed every second for {seconds:.0f} s: HOT updates",
            "{hot_share:.0%} of {updates}",
            "≥ 95 %",
            met(share >= 0.95),
            {"hot_share": share, "updates": updates},
        ),
        Row(
            "  table size",
            "{first_kib} KiB after {first_s:.0f} s, {last_kib} KiB at the end",
            "flat after the first minute",
            met(sizes[1] <= sizes[0]),
            {
                "first_kib": sizes[0] // 1024,
                "first_s": min(60.0, seconds / 2),
                "last_kib": sizes[1] // 1024,
            },
        ),
        Row(
            f"  renewal statement ({leases} leases each): p50 / p99",
            "{p50_ms:.1f} ms / {p99_ms:.1f} ms over {renewals}",
            "report",
            numbers={
                "p50_ms": statistics.median(renewal_ms),
                "p99_ms": p99,
                "renewals": len(renewal_ms),
            },
        ),
        Row(
            "  table settings that keep renewals HOT",
            "{options}; indexes on expire_at: {indexes}",
            "fillfactor < 100, no index on expire_at",
            met(bool(options and not indexed[0])),
            {"options": ", ".join(options) or "defaults", "indexes": int(indexed[0])},
        ),
    ]

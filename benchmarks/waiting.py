"""Waiting for a held lock: how soon a waiter starts once the holder releases.

The hand-over is timed from just before the holder's release to the start of the
waiting wrapper's command, through ``LISTEN``/``NOTIFY`` and through polling only
(what a waiter behind PgBouncer does), whose floor is the poll interval itself.
Threads of one process contending for one lease or its slots show the overhead
of hand-overs against the work they did; the last row is what the ``NOTIFY``
adds to every release.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from typing import Any

import psycopg

from benchmarks.rows import Row, met
from benchmarks.timing import percentile_ms
from benchmarks.wrapper import editable_dislock, wrapper_env
from dislock.core.lock_statements import statements as lock_statements


def waiter_context(url: str, lock_key: str, owner: str, **extra: Any) -> Any:
    from dislock import LockContext

    return LockContext(
        url=url,
        table_parts=["key_value"],
        lock_key=lock_key,
        owner=owner,
        run_ttl_seconds=30.0,
        lease_interval_seconds=5.0,
        **extra,
    )


def handover_samples(url: str, trials: int, extra_env: dict[str, str]) -> list[float]:
    """Seconds from the holder's release to the start of the waiting wrapper's command."""
    from dislock import LeaseLock

    samples = []
    for _ in range(trials):
        env = {
            **wrapper_env(url, "lease"),
            "LOCK_WAIT_SECONDS": "30",
            "CRONJOB_LOCK_LOG_LEVEL": "INFO",
            **extra_env,
        }
        holder = LeaseLock(waiter_context(url, env["LOCK_KEY"], "bench-holder"))
        holder.__enter__()
        waiter = subprocess.Popen(
            [editable_dislock(), "DATABASE_URL", "date", "+%s.%N"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiter.stderr is not None
        while "waiting up to" not in waiter.stderr.readline():
            pass
        time.sleep(0.2)  # well into the wait
        released = time.time()
        holder.__exit__(None, None, None)
        stdout, _ = waiter.communicate(timeout=60)
        samples.append(float(stdout.strip()) - released)
    return samples


def waiters_spread(
    url: str, waiters: int, hold: float, slots: int = 1
) -> tuple[list[float], float]:
    """``waiters`` threads asking at once for one lease (or ``slots`` slots of it), each
    holding it ``hold`` seconds: how long each waited, and the time until all were done."""
    from dislock import LeaseLock

    lock_key = f"bench-{uuid.uuid4().hex[:10]}"
    waited: list[float] = []
    start = time.monotonic() + 1.0

    def waiter(n: int) -> None:
        context = waiter_context(url, lock_key, f"waiter-{n}", wait_seconds=60.0, slots=slots)
        time.sleep(max(0.0, start - time.monotonic()))
        asked = time.monotonic()
        with LeaseLock(context):
            waited.append(time.monotonic() - asked)
            time.sleep(hold)

    threads = [threading.Thread(target=waiter, args=(n,)) for n in range(waiters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return waited, time.monotonic() - start


def release_notify_cost(url: str, cycles: int) -> tuple[float, float]:
    """Seconds per lease release statement on a warm connection, without and with the
    ``NOTIFY`` that wakes waiters (what every release now sends)."""
    statements = lock_statements(("key_value",))
    # The release as it was before it woke waiters: the same update, no RETURNING.
    plain = psycopg.sql.SQL(
        "UPDATE key_value SET expire_at = NOW(), value = value || ' (released)'"
        " WHERE key = %(key)s AND value = %(owner)s AND expire_at > NOW()"
    )
    variants: tuple[psycopg.sql.SQL | psycopg.sql.Composed, ...] = (
        plain,
        statements.queries.release,
    )
    key = "cronjob-lock:lease:bench-release"
    params = statements.release(key, "bench", "bench-release").params
    totals = [0.0, 0.0]
    acquire = statements.acquire_for(key, "bench", 60.0)
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        for cycle in range(cycles + 10):
            for index, release in enumerate(variants):  # interleaved: same noise
                conn.execute(acquire.query, acquire.params)
                started = time.perf_counter()
                conn.execute(release, params)
                if cycle >= 10:  # the first ones warm the caches
                    totals[index] += time.perf_counter() - started
    return totals[0] / cycles, totals[1] / cycles


def waiting_rows(url: str, trials: int) -> list[Row]:
    notify = handover_samples(url, trials, {})
    poll = handover_samples(url, trials, {"LOCK_WAIT_LISTEN": "0", "LOCK_WAIT_POLL_SECONDS": "0.5"})
    waited, total = waiters_spread(url, 20, 0.1)
    slot_waits, slot_total = waiters_spread(url, 50, 0.1, slots=5)
    plain, notifying = release_notify_cost(url, max(trials * 10, 50))
    p50 = percentile_ms(notify, 0.5)
    return [
        Row(
            f"hand-over, release to the waiting wrapper's command start, LISTEN/NOTIFY: p50 / p99"
            f" ({len(notify)} trials)",
            "{p50_ms:.1f} ms / {p99_ms:.1f} ms",
            "p50 ≤ 20 ms",
            met(p50 <= 20),
            {"p50_ms": p50, "p99_ms": percentile_ms(notify, 0.99)},
        ),
        Row(
            "  same, polling only every 0.5 s ± 50 % (what a waiter behind PgBouncer does):"
            f" p50 / p99 ({len(poll)} trials)",
            "{p50_ms:.0f} ms / {p99_ms:.0f} ms",
            "report, against the poll interval (0.5 s ± 50 %)",
            numbers={"p50_ms": percentile_ms(poll, 0.5), "p99_ms": percentile_ms(poll, 0.99)},
        ),
        Row(
            "20 waiters on one lease, each holding it 100 ms: waits min / p50 / max",
            "{min_ms:.0f} / {p50_ms:.0f} / {max_ms:.0f} ms ({ran} of 20 ran)",
            "all run within their wait (60 s)",
            met(len(waited) == 20 and max(waited) <= 60, "MISSED"),
            {
                "min_ms": min(waited) * 1000,
                "p50_ms": percentile_ms(waited, 0.5),
                "max_ms": max(waited) * 1000,
                "ran": len(waited),
            },
        ),
        Row(
            "  time until all 20 were done / 20 x 100 ms of work",
            "{total_s:.2f} s / 2.00 s",
            "report",
            numbers={"total_s": total},
        ),
        Row(
            "5 slots, 50 contenders holding 100 ms each: time until all done / 50 x 100 ms / 5",
            "{total_s:.2f} s / 1.00 s ({ran} of 50 ran, max wait {max_ms:.0f} ms)",
            "report",
            numbers={
                "total_s": slot_total,
                "ran": len(slot_waits),
                "max_ms": max(slot_waits) * 1000,
            },
        ),
        Row(
            "lease release statement on a warm connection: with NOTIFY / without",
            "{ratio:.2f} ({with_ms:.3f} ms / {without_ms:.3f} ms)",
            "report",
            numbers={
                "ratio": notifying / plain,
                "with_ms": notifying * 1000,
                "without_ms": plain * 1000,
            },
        ),
    ]

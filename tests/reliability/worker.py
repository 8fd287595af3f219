"""A worker process for the stress tests: ``python -m tests.reliability.worker MODE ...``.

``lease``: take a lease on one of the keys in turn, ``--rounds`` times, recording
each critical section in the ledger and incrementing a plain counter inside it.
``schedule``: at every second of a seconds-level cron, try to start the slot and
record a start when the slot was won.
``--broken`` acquires without the expiry guard, to prove the checker catches it:
everyone gets in, and with ``--meet N`` each worker's first critical section
waits inside until N workers are in theirs, so that the overlap and the lost
increment happen whatever the scheduler does.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from typing import Any

import psycopg
from psycopg import sql

from dislock import (
    LeaseLock,
    LeaseLossPolicy,
    LockContext,
    LockNotAcquiredError,
    ScheduleLock,
    StatementTimeout,
)

MEET_TIMEOUT = 120.0
"""Seconds a ``--meet`` worker waits for the others (a loaded machine starts them slowly)."""


# The two places the acquiring upsert checks that the row expired: the row source
# (empty while the key's row is visibly live) and the conflict's update.
_LIVE_ROW_GUARD = re.compile(
    r" AND NOT EXISTS \(SELECT FROM \S+ AS live WHERE live\.key = %\(key\)s"
    r" AND live\.expire_at > NOW\(\)\)"
)
_UPDATE_GUARD = " WHERE held.expire_at <= NOW()"


def break_acquisition() -> None:
    """Make lease acquisition ignore whether the row expired: everyone gets in."""
    import dislock.core.lock_queries as lock_queries
    from dislock.core.failover import TTL_RECORD
    from dislock.core.lock_queries import Queries

    real = lock_queries.queries

    def unguarded(
        table_parts: tuple[str, ...], fencing: bool = False, record: Any = TTL_RECORD
    ) -> Queries:
        # (The tables of these tests have no lock functions: this text is what is sent.)
        queries = real(table_parts, fencing, record)
        text = queries.acquire_for.as_string(None)
        # Both guards must go: with one left, two holders only meet in a race.
        broken, found = _LIVE_ROW_GUARD.subn("", text)
        assert found == 1 and _UPDATE_GUARD in broken, "the acquiring statement changed"
        broken = broken.replace(_UPDATE_GUARD, "")
        # And the read a new connection sends first, which refuses a live row too:
        # broken, it finds no row, and the acquiring statement decides.
        look = sql.SQL(queries.look.as_string(None) + " AND false")
        return queries._replace(acquire_for=sql.SQL(broken), look=look)  # type: ignore[arg-type]

    # Before any lock was built: the lock statements read their text from here.
    lock_queries.queries = unguarded


def meet(work: psycopg.Connection[Any], holder: str, count: int) -> None:
    """Wait inside the critical section until ``count`` workers are inside theirs
    (each says so after reading the counter, so that none of them has written it
    yet): an overlap and a lost increment that do not depend on the scheduler."""
    work.execute("INSERT INTO inside (holder) VALUES (%s)", (holder,))
    deadline = time.monotonic() + MEET_TIMEOUT
    while True:
        row = work.execute("SELECT count(*) FROM inside").fetchone()
        assert row is not None
        if row[0] >= count:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{holder}: only {row[0]} of {count} workers got inside together")
        time.sleep(0.01)


def lease(args: argparse.Namespace, work: psycopg.Connection[Any]) -> None:
    # Broken, the workers take each other's rows: losing the lease is expected.
    policy = LeaseLossPolicy.CONTINUE if args.broken else LeaseLossPolicy.TERMINATE
    done = 0
    while done < args.rounds:
        key = args.keys[done % len(args.keys)]
        context = LockContext(
            url=args.url,
            table_parts=[args.schema, "key_value"],
            lock_key=key,
            owner=f"{args.holder}:{done}",
            run_ttl_seconds=5.0,
            lease_interval_seconds=1.0,
            lease_loss_policy=policy,
        )
        try:
            with LeaseLock(context):
                row = work.execute(
                    "INSERT INTO ledger (lock_key, holder, started)"
                    " VALUES (%s, %s, clock_timestamp()) RETURNING id",
                    (key, args.holder),
                ).fetchone()
                assert row is not None
                counter = work.execute(
                    "SELECT n FROM counters WHERE lock_key = %s", (key,)
                ).fetchone()
                assert counter is not None
                if args.meet and done == 0:
                    meet(work, args.holder, args.meet)
                time.sleep(0.002)  # widen the window a missing lock would open
                work.execute(
                    "UPDATE counters SET n = %s WHERE lock_key = %s", (counter[0] + 1, key)
                )
                work.execute("UPDATE ledger SET ended = clock_timestamp() WHERE id = %s", row)
            done += 1
        except LockNotAcquiredError:
            time.sleep(random.uniform(0.01, 0.05))  # as a polite retry loop would
        except StatementTimeout:
            # A try whose statement got no answer within its second (a loaded
            # machine, eight workers queued on two rows) is handed back and
            # raised: tried again, as a retry loop would.  Exclusion and the
            # counters are what this test checks, not the server's speed.
            time.sleep(random.uniform(0.01, 0.05))


def agreed_start(work: psycopg.Connection[Any], workers: int) -> float:
    """Slot 0's epoch second, once every worker is up: the second after the last one
    said so (the same answer for all of them), however long a loaded machine took
    to start them."""
    work.execute("INSERT INTO ready DEFAULT VALUES")
    while True:
        row = work.execute(
            "SELECT count(*), ceil(extract(epoch FROM max(at)))::float8 + 1 FROM ready"
        ).fetchone()
        assert row is not None
        if row[0] >= workers:
            return float(row[1])
        time.sleep(0.02)


def schedule(args: argparse.Namespace, work: psycopg.Connection[Any]) -> None:
    if args.workers:
        args.start = agreed_start(work, args.workers)
    context = LockContext(
        url=args.url,
        table_parts=[args.schema, "key_value"],
        lock_key=args.keys[0],
        owner=args.holder,
        schedule="* * * * * *",  # croniter's 6-field form: every second
    )
    for slot in range(1, args.rounds + 1):
        # Every machine's cron fires just after the boundary, in no fixed order.
        time.sleep(max(0.0, args.start + slot + random.uniform(0.02, 0.08) - time.time()))
        lock = ScheduleLock(context)
        try:
            with lock:
                work.execute(
                    "INSERT INTO starts (slot_end, holder) VALUES (%s, %s)",
                    (lock.expires_at, args.holder),
                )
        except LockNotAcquiredError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("lease", "schedule"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--keys", nargs="+", required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--holder", required=True)
    parser.add_argument("--start", type=float, default=0.0, help="epoch second of slot 0")
    parser.add_argument(
        "--workers", type=int, default=0, help="agree on --start once this many are up"
    )
    parser.add_argument("--broken", action="store_true")
    parser.add_argument(
        "--meet", type=int, default=0, help="first section waits until this many are inside"
    )
    args = parser.parse_args()
    if args.broken:
        break_acquisition()
    with psycopg.connect(
        args.url, autocommit=True, options=f"-c search_path={args.schema}"
    ) as work:
        (lease if args.mode == "lease" else schedule)(args, work)


if __name__ == "__main__":
    main()

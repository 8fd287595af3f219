"""Waiters for the reliability tests: ``python -m tests.reliability.wait_worker ...``.

Each of ``--threads`` threads waits (``LockContext.wait_seconds``) for one lease
with ``--slots`` slots, all starting at the epoch second ``--start``, holds it for
``--hold`` seconds while recording its section in the ledger, and records how
long it waited and which slot row it held in ``waits``.
"""

from __future__ import annotations

import argparse
import threading
import time

import psycopg

from dislock import LeaseLock, LockContext, LockNotAcquiredError


def waiter(args: argparse.Namespace, name: str) -> None:
    context = LockContext(
        url=args.url,
        table_parts=[args.schema, "key_value"],
        lock_key=args.key,
        owner=name,
        run_ttl_seconds=5.0,
        lease_interval_seconds=1.0,
        wait_seconds=args.wait,
        slots=args.slots,
    )
    with psycopg.connect(
        args.url, autocommit=True, options=f"-c search_path={args.schema}"
    ) as work:
        time.sleep(max(0.0, args.start - time.time()))
        asked = time.monotonic()
        lock = LeaseLock(context)
        try:
            with lock:
                waited = time.monotonic() - asked
                row = work.execute(
                    "INSERT INTO ledger (lock_key, holder, started)"
                    " VALUES (%s, %s, clock_timestamp()) RETURNING id",
                    (args.key, name),
                ).fetchone()
                assert row is not None
                time.sleep(args.hold)
                work.execute("UPDATE ledger SET ended = clock_timestamp() WHERE id = %s", row)
            work.execute(
                "INSERT INTO waits (holder, slot_key, waited) VALUES (%s, %s, %s)",
                (name, lock.key, waited),
            )
        except LockNotAcquiredError:
            work.execute(
                "INSERT INTO waits (holder, slot_key, waited) VALUES (%s, NULL, %s)",
                (name, time.monotonic() - asked),
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--wait", type=float, required=True)
    parser.add_argument("--hold", type=float, required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--holder", required=True)
    args = parser.parse_args()
    threads = [
        threading.Thread(target=waiter, args=(args, f"{args.holder}-{n}"))
        for n in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()

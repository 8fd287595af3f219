"""A service on several replicas with APScheduler 3.x's BackgroundScheduler and dislock.

Every replica schedules both jobs; the report starts once per 5-second slot on one of them,
the import (longer than the 3 s between its starts) never runs on two at once. Run it with
``DATABASE_URL`` set, in as many processes as you like; SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from dislock import LockContext, LockNotAcquiredError, acquire_locks

OWNER = f"{socket.gethostname()}:{os.getpid()}"
REPORT = LockContext(
    url=os.environ["DATABASE_URL"],
    table_parts=["key_value"],
    lock_key="report",
    owner=OWNER,
    schedule="* * * * * */5",  # croniter's form: seconds last; the trigger below, to the second
)
IMPORT = LockContext(
    url=os.environ["DATABASE_URL"],
    table_parts=["key_value"],
    lock_key="import",
    owner=OWNER,
    run_ttl_seconds=30,
    lease_interval_seconds=10,
)


def report() -> None:
    print(f"report ran at {time.time():.3f}", flush=True)


def long_import() -> None:
    print(f"import started at {time.time():.3f}", flush=True)
    time.sleep(7)
    print(f"import ended at {time.time():.3f}", flush=True)


def locked(
    context: LockContext, strategies: Iterable[str], job: Callable[[], None]
) -> Callable[[], None]:
    """``job`` under the locks; nothing when another replica holds them."""

    def run() -> None:
        try:
            with acquire_locks(context, strategies):
                job()
        except LockNotAcquiredError:
            pass  # another replica has this slot, or is importing

    return run


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scheduler = BackgroundScheduler()
    scheduler.add_job(locked(REPORT, ["schedule"], report), CronTrigger(second="*/5"))
    scheduler.add_job(locked(IMPORT, ["lease"], long_import), "interval", seconds=3)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    scheduler.start()
    stop.wait()
    scheduler.shutdown()  # waits for a running job to end


if __name__ == "__main__":
    main()

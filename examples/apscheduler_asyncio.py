"""A service on several replicas with APScheduler 3.x's AsyncIOScheduler and dislock.aio.

Every replica schedules both jobs; the report starts once per 5-second slot on one of them,
the import (longer than the 3 s between its starts) never runs on two at once. Run it with
``DATABASE_URL`` set, in as many processes as you like; SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from dislock.aio import LockContext, LockNotAcquiredError, acquire_locks

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


async def report() -> None:
    print(f"report ran at {time.time():.3f}", flush=True)


async def long_import() -> None:
    print(f"import started at {time.time():.3f}", flush=True)
    await asyncio.sleep(7)
    print(f"import ended at {time.time():.3f}", flush=True)


def locked(
    context: LockContext, strategies: Iterable[str], job: Callable[[], Awaitable[None]]
) -> Callable[[], Awaitable[None]]:
    """``job`` under the locks; nothing when another replica holds them."""

    async def run() -> None:
        try:
            async with acquire_locks(context, strategies):
                await job()
        except LockNotAcquiredError:
            pass  # another replica has this slot, or is importing

    return run


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scheduler = AsyncIOScheduler()
    scheduler.add_job(locked(REPORT, ["schedule"], report), CronTrigger(second="*/5"))
    scheduler.add_job(locked(IMPORT, ["lease"], long_import), "interval", seconds=3)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    scheduler.start()
    await stop.wait()
    # Start nothing new and let a running import end, as BackgroundScheduler.shutdown()
    # does (this scheduler's shutdown() would cancel it).
    scheduler.pause()
    running = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    await asyncio.gather(*running, return_exceptions=True)
    scheduler.shutdown()


if __name__ == "__main__":
    asyncio.run(main())

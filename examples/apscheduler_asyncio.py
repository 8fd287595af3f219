"""A service on several replicas with APScheduler 3.x's AsyncIOScheduler and dislock.aio.

Every replica schedules both jobs; the report starts once per 5-second slot on one of them,
the import (longer than the 3 s between its starts) never runs on two at once. Run it with
``DATABASE_URL`` set, in as many processes as you like; SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from dislock.aio import with_locks


# Once per 5-second slot (croniter's form: seconds last; the trigger below, to the second),
# and one import at a time. A replica that finds the lock taken skips the call.
@with_locks("report", schedule="* * * * * */5", skip_held=True)
async def report() -> None:
    print(f"report ran at {time.time():.3f}", flush=True)


@with_locks("import", run_ttl_seconds=30, skip_held=True)
async def long_import() -> None:
    print(f"import started at {time.time():.3f}", flush=True)
    await asyncio.sleep(7)
    print(f"import ended at {time.time():.3f}", flush=True)


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scheduler = AsyncIOScheduler()
    scheduler.add_job(report, CronTrigger(second="*/5"))
    scheduler.add_job(long_import, "interval", seconds=3)
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

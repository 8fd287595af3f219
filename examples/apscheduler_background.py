"""A service on several replicas with APScheduler 3.x's BackgroundScheduler and dislock.

Every replica schedules both jobs; the report starts once per 5-second slot on one of them,
the import (longer than the 3 s between its starts) never runs on two at once. Run it with
``DATABASE_URL`` set, in as many processes as you like; SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from dislock import with_locks


# Once per 5-second slot (croniter's form: seconds last; the trigger below, to the second),
# and one import at a time. A replica that finds the lock taken skips the call.
@with_locks("report", schedule="* * * * * */5", skip_held=True)
def report() -> None:
    print(f"report ran at {time.time():.3f}", flush=True)


@with_locks("import", run_ttl_seconds=30, skip_held=True)
def long_import() -> None:
    print(f"import started at {time.time():.3f}", flush=True)
    time.sleep(7)
    print(f"import ended at {time.time():.3f}", flush=True)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scheduler = BackgroundScheduler()
    scheduler.add_job(report, CronTrigger(second="*/5"))
    scheduler.add_job(long_import, "interval", seconds=3)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    scheduler.start()
    stop.wait()
    scheduler.shutdown()  # waits for a running job to end


if __name__ == "__main__":
    main()

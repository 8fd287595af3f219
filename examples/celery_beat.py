"""Celery beat in every replica of a service, with dislock keeping one run per slot.

Every replica runs a worker with its own beat
(``celery -A examples.celery_beat worker -B --pool=solo --without-mingle --without-gossip``),
so each task is sent three times; the locks let one run: the report once per 5-second slot,
the import (longer than the 3 s between its sends) never on two workers at once. The
replicas share one broker, ``CELERY_BROKER_URL`` (Redis here; any broker works the same).
"""

from __future__ import annotations

import os
import time

from celery import Celery

from dislock import with_locks

app = Celery("celery_beat", broker=os.environ["CELERY_BROKER_URL"])
app.conf.update(
    broker_connection_retry_on_startup=True,
    beat_scheduler="celery.beat:Scheduler",  # in memory: each replica's beat starts afresh
    beat_schedule={
        # Beat's intervals are not aligned to the clock: send more often than the slot,
        # and the schedule lock keeps one start per slot. (A crontab() schedule is aligned:
        # crontab(minute="*/15") with schedule="*/15 * * * *".)
        "report": {"task": "report", "schedule": 1.0},
        "import": {"task": "import", "schedule": 3.0},
    },
    worker_redirect_stdouts=False,  # the jobs print their lines as they are
    worker_prefetch_multiplier=1,  # a worker busy importing leaves the reports to the others
)


# Once per 5-second slot (croniter's form: seconds last), and one import at a time. A
# worker that finds the lock taken skips the task.
@with_locks("report", schedule="* * * * * */5", skip_held=True)
def report() -> None:
    print(f"report ran at {time.time():.3f}", flush=True)


@with_locks("import", run_ttl_seconds=30, skip_held=True)
def long_import() -> None:
    print(f"import started at {time.time():.3f}", flush=True)
    time.sleep(7)
    print(f"import ended at {time.time():.3f}", flush=True)


# Registered as Celery tasks by name, which the beat schedule above sends.
app.task(name="report")(report)
app.task(name="import")(long_import)

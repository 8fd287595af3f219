"""One active Celery beat across machines, with a hot standby, under the dislock wrapper.

Each machine runs the same beat wrapped in a lease
(``dislock DATABASE_URL celery -A examples.one_beat beat``): one holds the lease and
sends "tick" every second, the others wait for it. The broker is kombu's filesystem
transport in ``CELERY_BROKER_FOLDER``, so that the example needs no broker server: beat
only writes to it here. Give workers a real broker (Redis, RabbitMQ): the filesystem
transport's reader may take a message file still being written (docs/recipes.md).
"""

from __future__ import annotations

import os

from celery import Celery

FOLDER = os.environ["CELERY_BROKER_FOLDER"]
app = Celery("one_beat", broker="filesystem://")
app.conf.update(
    broker_transport_options={
        "data_folder_in": FOLDER,
        "data_folder_out": FOLDER,
        "control_folder": os.path.join(FOLDER, "control"),  # else ./control
    },
    broker_connection_retry_on_startup=True,
    beat_scheduler="celery.beat:Scheduler",  # in memory: a beat that takes over starts afresh
    beat_schedule={"tick": {"task": "tick", "schedule": 1.0}},
)

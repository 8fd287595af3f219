"""The wrapper's own run as metrics in a node_exporter textfile (``DISLOCK_METRICS_TEXTFILE``).

After each run that started its command, the file is rewritten with that run, the
other lock keys' entries already there kept (one file serves every job of the
host): atomically, under an exclusive lock on ``<path>.lock``, so that two jobs
ending together both land.  A file that cannot be written is logged and never
changes the exit status.
"""

from __future__ import annotations

import fcntl
import logging

from prometheus_client.exposition import write_to_textfile
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from dislock.cli.run_metrics import Families, host_families, read_host_records, record_run
from dislock.core.context import LEASE_LOST_EXIT_CODE
from dislock.core.history import end_of_command

logger = logging.getLogger("dislock")


def outcome_of(status: int) -> str:
    """The run's outcome from the wrapper's exit status, as the history would record
    it.  (A command that itself exits 75 reads as a lost lease here.)"""
    returncode = 128 - status if status > 128 else status
    return end_of_command(returncode, status, lease_lost=status == LEASE_LOST_EXIT_CODE).outcome


def record(path: str, lock_key: str, started: float, ended: float, status: int) -> None:
    try:
        with open(f"{path}.lock", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                with open(path, encoding="utf-8") as existing:
                    text = existing.read()
            except FileNotFoundError:
                text = ""
            try:
                samples = [
                    (sample.name, sample.labels, sample.value)
                    for family in text_string_to_metric_families(text)
                    for sample in family.samples
                ]
            except ValueError:
                logger.warning("%s was not a metrics file; starting it afresh", path)
                samples = []
            records = record_run(
                read_host_records(samples), lock_key, started, ended, outcome_of(status)
            )
            registry = CollectorRegistry(auto_describe=False)
            registry.register(Families(lambda: host_families(records)))
            write_to_textfile(path, registry)
    except OSError as exc:
        logger.warning("could not write the metrics file %s: %s", path, exc.strerror or exc)

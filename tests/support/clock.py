"""Keeping a test's work clear of a schedule's boundaries, on the database clock.

A slot-computing test that straddles a boundary sees two slots (or, within
``EARLY_FIRE_TOLERANCE`` before one, the next slot already): on a loaded machine
its few statements can take seconds.  Tests start their work where enough of
the slot is left, waiting for the next slot if need be, rather than assuming
two reads of the clock fall in the same slot.
"""

from __future__ import annotations

import time
from datetime import datetime

from dislock.core.cron import next_boundary, shortest_interval
from tests.support.rows import Rows


def clear_of_boundary(rows: Rows, expression: str, seconds: float) -> datetime:
    """The database's ``NOW()`` once at least ``seconds`` are left before the next
    boundary of ``expression`` (read in UTC), sleeping past a boundary that is nearer."""
    assert seconds < shortest_interval(expression) / 2, "a slot must leave room to work in"
    while True:
        now = rows.now()
        left = (next_boundary(expression, now) - now).total_seconds()
        if left >= seconds:
            return now
        time.sleep(left + 0.1)

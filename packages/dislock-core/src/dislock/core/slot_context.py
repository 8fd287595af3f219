"""What a run is told of "since when" (docs/recipes.md, "An incremental export"): its
schedule slot's start and end, and the start of its key's last successful run, as the
lock objects' ``slot_start``, ``slot_end`` and ``last_success`` and, for a wrapped
command, ``DISLOCK_SLOT_START``, ``DISLOCK_SLOT_END`` and ``DISLOCK_LAST_SUCCESS``.

The slot is the one the database clock picked; the last success is read from the
history by the run's start statement (``dislock.core.history.start``), in the round
trip that records the run: no lookup of its own, and none without the history.
"""

from __future__ import annotations

from datetime import datetime, timezone

from dislock.core.context import LockContext
from dislock.core.history import RunStart

SLOT_START_VARIABLE = "DISLOCK_SLOT_START"
SLOT_END_VARIABLE = "DISLOCK_SLOT_END"
LAST_SUCCESS_VARIABLE = "DISLOCK_LAST_SUCCESS"


def slot_start_of(context: LockContext, slot_end: datetime | None) -> datetime | None:
    """When the slot ending at ``slot_end`` began (None: no slot, or no cron to tell)."""
    zone = context.cron_zone
    if slot_end is None or context.schedule is None or zone is None:
        return None
    from dislock.core.cron import slot_start

    return slot_start(context.schedule, slot_end, zone.tz)


def last_success(context: LockContext, started: RunStart | None) -> datetime | None:
    """The start of the key's last successful run before this one: its slot's start
    when it was a slot of this schedule (same cron and zone), else when it started."""
    if started is None or started.last is None:
        return None
    started_at, slot_end, cron, cron_tz = started.last
    zone = context.cron_zone
    if zone is not None and (cron, cron_tz) == (context.schedule, zone.name):
        return slot_start_of(context, slot_end) or started_at
    return started_at


def utc_text(instant: datetime) -> str:
    """``2026-12-07T03:00:00+00:00``: ISO 8601 in UTC, with its offset."""
    return instant.astimezone(timezone.utc).isoformat()


def slot_variables(
    slot_start: datetime | None, slot_end: datetime | None, last: datetime | None
) -> dict[str, str | None]:
    """The command's variables (None: unset, never an outer run's value)."""
    given = {SLOT_START_VARIABLE: slot_start, SLOT_END_VARIABLE: slot_end}
    given[LAST_SUCCESS_VARIABLE] = last
    return {name: None if value is None else utc_text(value) for name, value in given.items()}

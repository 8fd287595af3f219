# GENERATED from dislock-aio's dislock/aio/_schedule.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""``ScheduleLock``: one start per schedule slot.

Hand-written in ``dislock/aio/_schedule.py``; ``dislock/_sync/_schedule.py`` is
generated from it by ``tools/async_to_sync.py``.  Which slot, and the statements
that claim it in which order, are ``dislock.core.acquisition``'s.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from functools import partial
from time import monotonic

from dislock.core.acquisition import claiming_schedule_slot, schedule_refusal
from dislock.core.context import LockContext
from dislock.core.cron import slot_end
from dislock.core.errors import ConfigurationError
from dislock.core.exits import Exc, ExcType, Tb
from dislock.core.kinds import SCHEDULE
from dislock.core.patience import ConnectPatience, SlotEnd
from dislock.core.rows import schedule_key
from dislock.core.unknown_outcome import HELD

from ._acquiring import drive
from ._hub import enter_hub, leave_hub
from ._recording import RunRecording, record_alone

logger = logging.getLogger("dislock")


def _slot_end(context: LockContext, started_at: datetime) -> SlotEnd | None:
    """The end of the slot a schedule lock started taking at ``started_at``, which
    its patience never outlasts (by the local clock; the database's is not known
    before connecting)."""
    ends_at = context.next_run_time
    zone = context.cron_zone
    if ends_at is None and context.schedule is not None and zone is not None:
        ends_at = slot_end(context.schedule, started_at, zone.tz)
    return (
        None if ends_at is None else SlotEnd(context.lock_key, ends_at, datetime.now(timezone.utc))
    )


class ScheduleLock:
    """One start per schedule slot.

    Entering claims the slot's row until ``next_run_time`` (or, without it, until
    the next boundary of ``schedule`` on the database clock) and raises
    ``LockNotAcquiredError`` if another owner already started in this slot.
    Leaving does nothing: the slot stays taken until it ends.  A slot is never
    waited for (``LockContext.wait_seconds`` applies to the lease alone).
    """

    def __init__(self, context: LockContext) -> None:
        if context.next_run_time is None and context.schedule is None:
            raise ConfigurationError(
                "a schedule lock needs next_run_time or schedule in its LockContext"
            )
        self.context = context
        self.key = schedule_key(context.lock_key)
        self.expires_at = context.next_run_time
        self.fence: int | None = None
        """The fencing token of this acquisition (with ``LockContext.fencing``)."""
        self.records_history = context.history
        """Whether entering and leaving record the run (``LockContext.history``);
        ``acquire_locks`` turns it off for its locks and records the run itself."""
        self._recording: RunRecording | None = None

    def __enter__(self) -> ScheduleLock:
        context = self.context
        # The connection is given back at once: a slot needs nothing while the job runs.
        hub = enter_hub(context.url, context.connect_timeout_seconds)
        # One patience for every connection on the way to the decision, until the slot ends.
        # (The slot is that of the instant the lock started, computed only if needed.)
        patience = ConnectPatience(
            context.connect_patience_seconds,
            monotonic(),
            slot=partial(_slot_end, context, datetime.now(timezone.utc)),
        )
        try:
            hub.connect_patiently(patience)
            answer, expires_at = drive(hub, claiming_schedule_slot(context, self.key, patience))
        finally:
            leave_hub(hub)
        refusal = schedule_refusal(context, answer, expires_at)
        if refusal is not None:
            raise refusal
        self.expires_at = expires_at
        self.fence = answer.token
        HELD.add(tuple(context.table_parts), self.key, context.owner, slot_end=expires_at)
        logger.info("acquired schedule slot %s until %s", self.key, expires_at.isoformat())
        if self.records_history:
            self._recording = record_alone(context, SCHEDULE, slot_end=expires_at)
        return self

    @property
    def holding(self) -> bool:
        """Whether the exit has anything to do: only a run to record (the slot
        stays taken until it ends)."""
        return self._recording is not None

    def __exit__(self, exc_type: ExcType, exc: Exc, tb: Tb) -> None:
        recording, self._recording = self._recording, None
        if recording is not None:
            recording.__exit__(exc_type, exc, tb)

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
from dislock.core.dsn import one_line, scrub
from dislock.core.errors import ConfigurationError
from dislock.core.exits import Exc, ExcType, Tb
from dislock.core.kinds import SCHEDULE
from dislock.core.lock_statements import statements_for
from dislock.core.patience import ConnectPatience, SlotEnd
from dislock.core.retries import attempt_ended, attempt_suffix, backoff
from dislock.core.rows import schedule_key
from dislock.core.timeouts import RELEASE_TIMEOUT
from dislock.core.unknown_outcome import HELD

from ._acquiring import drive
from ._hub import enter_hub, leave_hub
from ._recording import Alone, Run, RunRecording, record_alone, record_late, run_end

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
        self.attempt = 1
        """Which attempt of its slot this run is (``LockContext.retries``): 1 for the
        slot's first, 2 for its first retry, …"""
        self.lease_row: str | None = None
        """With retries: the lease row whose unreleased expiry proves that a holder of
        this slot vanished (``acquire_locks`` sets it for ``schedule,lease``)."""
        self.run: Run | None = Alone(None)
        """The run the slot was taken for, whose end decides whether it is retried;
        ``acquire_locks`` gives its session once it has one (None before: a run that
        never started leaves its slot as it is)."""
        self._taken_as: str | None = None
        """With retries: the row's value as this attempt took it (it reopens the slot
        with it)."""

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
            answer, expires_at = drive(
                hub, claiming_schedule_slot(context, self.key, patience, lease=self.lease_row)
            )
        finally:
            leave_hub(hub)
        refusal = schedule_refusal(context, answer, expires_at)
        if refusal is not None:
            if answer.began_at is not None and answer.acquired and context.history:
                record_late(context, expires_at)
            raise refusal
        self.expires_at = expires_at
        self.fence = answer.token
        HELD.add(tuple(context.table_parts), self.key, context.owner, slot_end=expires_at)
        if context.retries:
            self.attempt = answer.attempt or 1
            self._taken_as = context.owner + attempt_suffix(self.attempt)
            logger.info(
                "acquired schedule slot %s until %s (attempt %d of %d)",
                self.key,
                expires_at.isoformat(),
                self.attempt,
                context.retries + 1,
            )
        else:
            logger.info("acquired schedule slot %s until %s", self.key, expires_at.isoformat())
        if self.records_history:
            self._recording = record_alone(context, SCHEDULE, slot_end=expires_at)
        return self

    @property
    def holding(self) -> bool:
        """Whether the exit has anything to do: a run to record, or with retries a
        failed attempt's slot to reopen (otherwise the slot stays taken until it ends)."""
        return self._recording is not None or self._taken_as is not None

    def __exit__(self, exc_type: ExcType, exc: Exc, tb: Tb) -> None:
        recording, self._recording = self._recording, None
        try:
            if recording is not None:
                recording.__exit__(exc_type, exc, tb)
        finally:
            taken_as, self._taken_as = self._taken_as, None
            if taken_as is not None and self.run is not None:
                end = run_end(self.context, self.run, exc)
                if end.outcome != "ok":
                    self._reopen(taken_as, end.outcome)

    def closing(self, exc_type: ExcType, exc: Exc, tb: Tb) -> None:
        """With ``lease_row`` (a holder's vanishing is proven by its lease), before the
        lease is released: a successful attempt marks its slot done, so that a lease
        its wrapper could not release afterwards is not taken for a vanished holder."""
        taken_as = self._taken_as
        if taken_as is None or self.run is None:
            return
        if run_end(self.context, self.run, exc).outcome != "ok":
            return  # reopened, if it may be, as the slot is left (after the lease)
        self._taken_as = None
        context = self.context
        assert self.expires_at is not None
        done = statements_for(context).done(self.key, taken_as, self.expires_at)
        hub = enter_hub(context.url, context.connect_timeout_seconds)
        try:
            hub.ask(done, RELEASE_TIMEOUT)
        except Exception as error:
            logger.warning(
                "lock %r: could not mark this slot's successful attempt done (if its lease is"
                " not released either, another attempt may follow once it expires): %s",
                context.lock_key,
                scrub(one_line(str(error)), context.url),
            )
        finally:
            leave_hub(hub)

    def _reopen(self, taken_as: str, outcome: str) -> None:
        """Leave the slot to its next attempt, if one is left: the row expires after
        the backoff, for the first wrapper on any machine to take.  Best effort: a
        slot not reopened stays taken (never two attempts, at worst one too few)."""
        context = self.context
        ended = attempt_ended(context.lock_key, self.attempt, context.retries, outcome)
        if self.attempt > context.retries:
            logger.warning("%s; no attempt is left in this slot", ended)
            return
        assert self.expires_at is not None
        delay = backoff(context.retry_delay_seconds, self.attempt)
        reopen = statements_for(context).reopen(self.key, taken_as, self.expires_at, delay)
        hub = enter_hub(context.url, context.connect_timeout_seconds)
        try:
            retry_at = hub.ask(reopen, RELEASE_TIMEOUT)
        except Exception as error:
            logger.warning(
                "%s, and the slot could not be left to the next attempt (it stays taken until"
                " it ends): %s",
                ended,
                scrub(one_line(str(error)), context.url),
            )
            return
        finally:
            leave_hub(hub)
        if retry_at is None:
            logger.warning("%s; the slot ends before another attempt could start", ended)
        else:
            logger.warning(
                "%s; attempt %d may start on any machine from %s",
                ended,
                self.attempt + 1,
                retry_at.isoformat(timespec="seconds"),
            )

"""What a ``ScheduleLock`` knows and says, whichever its flavour, and its two
statements after the run: marking a successful attempt done, reopening a failed one.
Both flavours' ``ScheduleLock`` extend ``ScheduleState`` with the sending (the claim,
``dislock.core.schedule_claiming``'s, and the sequences below).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial

from dislock.core.acquisition import Ask, Given, Steps
from dislock.core.answers import Acquired
from dislock.core.context import LockContext
from dislock.core.cron import slot_end
from dislock.core.dsn import one_line, scrub
from dislock.core.errors import ConfigurationError
from dislock.core.lock_statements import statements_for
from dislock.core.patience import SlotEnd
from dislock.core.retries import attempt_ended, attempt_suffix, backoff
from dislock.core.rows import schedule_key
from dislock.core.timeouts import RELEASE_TIMEOUT

logger = logging.getLogger("dislock")


def _slot_end(context: LockContext, started_at: datetime, given: Given) -> SlotEnd | None:
    """The end of the slot a schedule lock started taking at ``started_at``, which
    its patience never outlasts (by the local clock, ``given.wall``; the database's
    is not known before connecting)."""
    ends_at = context.next_run_time
    zone = context.cron_zone
    if ends_at is None and context.schedule is not None and zone is not None:
        ends_at = slot_end(context.schedule, started_at, zone.tz)
    return None if ends_at is None else SlotEnd(context.lock_key, ends_at, given.wall())


class ScheduleState:
    """A schedule lock's state between statements (see the flavour's ``ScheduleLock``)."""

    def __init__(self, context: LockContext, given: Given) -> None:
        if context.next_run_time is None and context.schedule is None:
            raise ConfigurationError(
                "a schedule lock needs next_run_time or schedule in its LockContext"
            )
        self.context = context
        self.given = given  # the clocks and the process's rows
        self.key = schedule_key(context.lock_key)
        self.expires_at = context.next_run_time
        self.fence: int | None = None
        """The fencing token of this acquisition (with ``LockContext.fencing``)."""
        self.records_history = context.history
        """Whether entering and leaving record the run (``LockContext.history``);
        ``acquire_locks`` turns it off for its locks and records the run itself."""
        self.attempt = 1
        """Which attempt of its slot this run is (``LockContext.retries``): 1 for the
        slot's first, 2 for its first retry, …"""
        self.lease_row: str | None = None
        """With retries: the lease row whose unreleased expiry proves that a holder of
        this slot vanished (``acquire_locks`` sets it for ``schedule,lease``)."""
        self._taken_as: str | None = None
        """With retries: the row's value as this attempt took it (it reopens the slot
        with it)."""

    def _slot_of_now(self) -> Callable[[], SlotEnd | None]:
        """The end of the slot of this instant, for the claim's patience (computed
        only if the patience needs it)."""
        return partial(_slot_end, self.context, self.given.wall(), self.given)

    def _took(self, answer: Acquired, expires_at: datetime) -> None:
        """Note the slot just taken (until ``expires_at``), and say so."""
        context = self.context
        self.expires_at = expires_at
        self.fence = answer.token
        self.given.held.add(
            tuple(context.table_parts), self.key, context.owner, slot_end=expires_at
        )
        if not context.retries:
            logger.info("acquired schedule slot %s until %s", self.key, expires_at.isoformat())
            return
        self.attempt = answer.attempt or 1
        self._taken_as = context.owner + attempt_suffix(self.attempt)
        logger.info(
            "acquired schedule slot %s until %s (attempt %d of %d)",
            self.key,
            expires_at.isoformat(),
            self.attempt,
            context.retries + 1,
        )

    def _marking_done(self, taken_as: str) -> Steps[None]:
        """Mark this successful attempt's slot done, best effort."""
        context = self.context
        assert self.expires_at is not None
        try:
            yield Ask(
                statements_for(context).done(self.key, taken_as, self.expires_at), RELEASE_TIMEOUT
            )
        except Exception as error:
            logger.warning(
                "lock %r: could not mark this slot's successful attempt done (if its lease is"
                " not released either, another attempt may follow once it expires): %s",
                context.lock_key,
                scrub(one_line(str(error)), context.url),
            )

    def _reopening(self, taken_as: str, outcome: str) -> Steps[None]:
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
        try:
            retry_at: datetime | None = yield Ask(reopen, RELEASE_TIMEOUT)
        except Exception as error:
            logger.warning(
                "%s, and the slot could not be left to the next attempt (it stays taken until"
                " it ends): %s",
                ended,
                scrub(one_line(str(error)), context.url),
            )
            return
        if retry_at is None:
            logger.warning("%s; the slot ends before another attempt could start", ended)
        else:
            logger.warning(
                "%s; attempt %d may start on any machine from %s",
                ended,
                self.attempt + 1,
                retry_at.isoformat(timespec="seconds"),
            )

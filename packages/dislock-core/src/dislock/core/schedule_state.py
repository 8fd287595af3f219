"""A schedule lock, whichever its flavour: its slot's claim in
``dislock.core.acquisition``'s steps and the refusal the answer means, what it knows
between statements (``ScheduleState``, which both flavours' ``ScheduleLock`` extend
with the sending), and its two statements after the run: marking a successful
attempt done, reopening a failed one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from functools import partial
from typing import TypeAlias

from dislock.core import after, errors
from dislock.core.acquisition import Ask, Given, Steps, claiming, riding_out
from dislock.core.answers import Acquired
from dislock.core.context import LockContext
from dislock.core.cron import SlotCandidates, begun_too_long_ago, slot_end, slot_start
from dislock.core.dsn import one_line, scrub
from dislock.core.failover import delayed
from dislock.core.history import history_table
from dislock.core.lock_statements import statements_for
from dislock.core.observing import note
from dislock.core.patience import ConnectPatience, SlotEnd
from dislock.core.pause import paused_error
from dislock.core.retries import LATE_MARK, attempt_ended, attempt_suffix, backoff, grace
from dislock.core.rows import schedule_key
from dislock.core.slot_context import slot_start_of
from dislock.core.timeouts import RELEASE_TIMEOUT

logger = logging.getLogger("dislock")


def _slot_end(context: LockContext, started_at: datetime, given: Given) -> SlotEnd | None:
    """The end of the slot a schedule lock started taking at ``started_at``, which
    its patience never outlasts (by the local clock, ``given.wall``; the database's
    is not known before connecting)."""
    ends_at, zone = context.next_run_time, context.cron_zone
    if ends_at is None and context.schedule is not None and zone is not None:
        ends_at = slot_end(context.schedule, started_at, zone.tz)
    return None if ends_at is None else SlotEnd(context.lock_key, ends_at, given.wall())


class ScheduleState:
    """A schedule lock's state between statements (see the flavour's ``ScheduleLock``)."""

    def __init__(self, context: LockContext, given: Given) -> None:
        if context.next_run_time is None and context.schedule is None:
            raise errors.ConfigurationError(
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
        self._taken_as: str | None = None  # with retries: the row's value, to reopen it
        self.slot_end: datetime | None = None
        """The end of the slot taken (the database clock picked it); None before."""
        self.last_success: datetime | None = None
        """With the history: the start of the key's last successful run before this
        one (``dislock.core.slot_context.last_success``); None when there is none."""

    @property
    def slot_start(self) -> datetime | None:
        """When the slot taken began (None before, or without a cron ``schedule``)."""
        return slot_start_of(self.context, self.slot_end)

    def _slot_of_now(self) -> Callable[[], SlotEnd | None]:
        """The end of the slot of this instant, for the claim's patience (computed
        only if the patience needs it)."""
        return partial(_slot_end, self.context, self.given.wall(), self.given)

    def _took(self, answer: Acquired, expires_at: datetime) -> None:
        """Note the slot just taken (until ``expires_at``), and say so."""
        context = self.context
        self.expires_at = self.slot_end = expires_at
        self.fence = answer.token
        note("acquired", slot=expires_at.isoformat())
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
        the backoff, for the first wrapper on another machine to take (on this one,
        after a grace: ``dislock.core.retries.grace``).  Best effort: a
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
            return
        here = retry_at + timedelta(seconds=grace(delay, retry_at, self.expires_at))
        logger.warning(
            "%s; attempt %d may start on another machine from %s, on this one from %s",
            ended,
            self.attempt + 1,
            retry_at.isoformat(timespec="seconds"),
            here.isoformat(timespec="seconds"),
        )


def claiming_schedule_slot(
    context: LockContext,
    key: str,
    patience: ConnectPatience,
    *,
    given: Given,
    lease: str | None = None,
) -> Steps[tuple[Acquired, datetime]]:
    """``_claiming_schedule_slot``, ridden out (``riding_out``)."""
    return riding_out(
        lambda: _claiming_schedule_slot(context, key, patience, given, lease),
        patience,
        given.clock,
    )


Claim: TypeAlias = "partial[Steps[Acquired]]"


def _claiming_schedule_slot(
    context: LockContext, key: str, patience: ConnectPatience, given: Given, lease: str | None
) -> Steps[tuple[Acquired, datetime]]:
    """Claim the row ``key`` of the schedule slot ``context`` names (its
    ``next_run_time``, or the slot of ``schedule`` at the database's clock): the
    answer, and the slot's end.  The acquiring statement picks the slot by its
    ``NOW()`` among the ends around ``given.wall()``: only a database clock far from
    ours costs a read of it, and a second claim.  ``lease``: the lease row whose
    unreleased expiry proves a holder vanished (None: nothing proves it)."""
    statements = statements_for(context)
    timeout = context.connect_timeout_seconds
    claim = partial(
        claiming,
        timeout=timeout,
        context=context,
        key=key,
        what=f"schedule slot {key!r}",
        patience=patience,
        given=given,
    )
    expires_at = context.next_run_time
    if context.retries or context.start_deadline_seconds is not None or context.after:
        return (yield from _claiming_marked(context, key, patience, claim, lease))
    if expires_at is None:
        schedule, tz = _cron(context)
        candidates = SlotCandidates.around(schedule, given.wall(), tz)
        answer = yield from claim(
            statements.acquire_by_clock(key, context.owner, candidates),
            slot_ends=candidates.ends,
            look=statements.look(key, pick=candidates.pick),
        )
        if answer.slot_end is not None:
            return answer, answer.slot_end
        now: datetime = yield Ask(statements.now(), timeout, patience)
        expires_at = slot_end(schedule, now, tz)
    answer = yield from claim(
        statements.acquire_until(key, context.owner, expires_at),
        slot_ends=[expires_at],
        look=statements.look(key),
    )
    return answer, expires_at


def _claiming_marked(
    context: LockContext, key: str, patience: ConnectPatience, claim: Claim, lease: str | None
) -> Steps[tuple[Acquired, datetime]]:
    """``_claiming_schedule_slot`` for a job with retries, a start deadline or ``after``:
    the clock is read first (one round trip more, for these jobs only), for the slot's
    end names its mark and its start is measured against the deadline and the keys it
    comes after.  Past the deadline the claim marks the slot late (``began_at`` set)."""
    statements = statements_for(context)
    clock_read: datetime = yield Ask(statements.now(), context.connect_timeout_seconds, patience)
    expires_at, deadline = context.next_run_time, context.start_deadline_seconds
    if expires_at is None:
        schedule, tz = _cron(context)
        expires_at = slot_end(schedule, clock_read, tz)
    owner, began_at = context.owner, None
    if deadline is not None:
        schedule, tz = _cron(context)
        began_at = begun_too_long_ago(schedule, expires_at, tz, deadline, clock_read)
        if began_at is not None:
            # Too late to start: the claim marks the slot late instead, so that no
            # later acquisition starts it either.
            owner = context.owner + LATE_MARK
    if context.after and began_at is None:
        yield from _checking_after(context, expires_at, patience)
    if context.retries:
        exchange = statements.acquire_retrying(
            key,
            owner,
            expires_at,
            lease=lease,
            retries=context.retries,
            delay=context.retry_delay_seconds,
        )
    else:
        exchange = statements.acquire_until(key, owner, expires_at)
    # No look first: a vanished holder's row is live, and yet may be taken.
    answer = yield from claim(exchange, slot_ends=[expires_at])
    return answer._replace(began_at=began_at), expires_at


def _cron(context: LockContext) -> tuple[str, tzinfo]:
    """The schedule of a lock without ``next_run_time``, and its zone (resolved with it)."""
    schedule, zone = context.schedule, context.cron_zone
    assert schedule is not None
    assert zone is not None
    return schedule, zone.tz


def _checking_after(
    context: LockContext, expires_at: datetime, patience: ConnectPatience
) -> Steps[None]:
    """Raise ``DependencyPending`` unless each key of ``after`` succeeded in the slot
    ending at ``expires_at``: read before the claim, so that a slot held back stays
    open, with nothing written."""
    schedule, tz = _cron(context)
    began = slot_start(schedule, expires_at, tz)
    table = history_table(context.table_parts, context.history_table)
    exchange = after.pending(table, context.after, began)
    key: str | None = yield Ask(exchange, context.connect_timeout_seconds, patience)
    if key is not None:
        raise after.held_back(context.lock_key, key, began, expires_at)


def schedule_refusal(
    context: LockContext, answer: Acquired, expires_at: datetime
) -> Exception | None:
    """The error a schedule slot's answer means (paused, past its start deadline,
    delayed by a failover, reopened for a later attempt, already started), or None:
    taken."""
    if answer.paused_until is not None:
        return paused_error(context.lock_key, answer.paused_for, answer.paused_until)
    slot = f"schedule slot of {context.lock_key!r} ending {expires_at.isoformat()}"
    late = None
    if answer.began_at is not None:
        late = (
            f"{slot} began at {answer.began_at.isoformat(timespec='seconds')}, more than"
            f" {context.start_deadline_seconds:g} s ago (its start deadline)"
        )
        if answer.acquired:
            return errors.SlotLateError(f"{late}: not started; marked late")
    if answer.acquired:
        return None
    if answer.delayed_until is not None:
        return errors.LockDelayedError(delayed(slot, answer.delayed_until), answer.delayed_until)
    if late is not None:
        return errors.LockNotAcquiredError(f"{late}, and was started or marked late already")
    if answer.retry_at is not None and answer.attempt is not None:
        return errors.LockNotAcquiredError(
            f"{slot}: an attempt failed on this machine, which leaves attempt"
            f" {answer.attempt} to another until {answer.retry_at.isoformat(timespec='seconds')}"
        )
    if answer.retry_at is not None:
        return errors.LockNotAcquiredError(
            f"{slot}: an attempt failed; the next may start at"
            f" {answer.retry_at.isoformat(timespec='seconds')}"
        )
    if answer.attempt is not None and answer.attempt > context.retries + 1:
        return errors.LockNotAcquiredError(f"{slot} has used its {context.retries + 1} attempts")
    return errors.LockNotAcquiredError(
        f"{slot} was already started by another owner (or has already ended)"
    )

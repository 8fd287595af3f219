"""A schedule slot's claim in ``dislock.core.acquisition``'s steps, and the refusal
its answer means.
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from functools import partial
from typing import TypeAlias

from dislock.core import after
from dislock.core.acquisition import Ask, Given, Steps, claiming, riding_out
from dislock.core.answers import Acquired
from dislock.core.context import LockContext
from dislock.core.cron import SlotCandidates, begun_too_long_ago, slot_end, slot_start
from dislock.core.errors import LockDelayedError, LockNotAcquiredError, SlotLateError
from dislock.core.failover import delayed
from dislock.core.history import history_table
from dislock.core.lock_statements import statements_for
from dislock.core.patience import ConnectPatience
from dislock.core.pause import paused_error
from dislock.core.retries import LATE_MARK


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
        lambda: _claiming_schedule_slot(context, key, patience, given=given, lease=lease),
        patience,
        given.clock,
    )


Claim: TypeAlias = "partial[Steps[Acquired]]"


def _claiming_schedule_slot(
    context: LockContext,
    key: str,
    patience: ConnectPatience,
    *,
    given: Given,
    lease: str | None = None,
) -> Steps[tuple[Acquired, datetime]]:
    """Claim the row ``key`` of the schedule slot ``context`` names (its
    ``next_run_time``, or the slot of ``schedule`` at the database's clock): the
    answer, and the slot's end.  Without ``next_run_time`` there is no round trip
    for the database clock first: the acquiring statement picks the slot by its
    ``NOW()`` among the ends around ``given.wall()``; only a database clock far from
    ours costs a read of it, and a second claim.  ``lease`` is the lease row whose
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
        # The database clock is far from ours: read it, then claim.
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
    """``_claiming_schedule_slot`` for a job with retries, a start deadline or ``after``
    (``dislock.core.retries``): the slot's end names it in the row's mark, and its
    start is measured against the deadline and the keys it comes after, so the clock
    is read first (one round trip more, for these jobs only).  Past the deadline the
    claim marks the slot late (``Acquired.began_at`` set)."""
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
            return SlotLateError(f"{late}: not started; marked late")
    if answer.acquired:
        return None
    if answer.delayed_until is not None:
        return LockDelayedError(delayed(slot, answer.delayed_until), answer.delayed_until)
    if late is not None:
        return LockNotAcquiredError(f"{late}, and was started or marked late already")
    if answer.retry_at is not None:
        return LockNotAcquiredError(
            f"{slot}: an attempt failed; the next may start at"
            f" {answer.retry_at.isoformat(timespec='seconds')}"
        )
    if answer.attempt is not None and answer.attempt > context.retries + 1:
        return LockNotAcquiredError(f"{slot} has used its {context.retries + 1} attempts")
    return LockNotAcquiredError(
        f"{slot} was already started by another owner (or has already ended)"
    )

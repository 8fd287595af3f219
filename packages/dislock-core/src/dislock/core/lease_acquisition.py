"""A lease's acquisition in ``dislock.core.acquisition``'s steps: one try at its row
(or at a free slot of an N-slot lease), its release and the hand-over to a replacer;
and the replacer's side (``LockContext.replace``): marking the live holder's lease
row, waiting for it to be handed over (or to expire) and taking it, and withdrawing
when it gives up.  The marks and their statements are ``dislock.core.replace_marks``'s.
"""

from __future__ import annotations

import logging
import socket
from datetime import datetime
from typing import NamedTuple

import psycopg

from dislock.core import replace_marks
from dislock.core.acquisition import (
    Ask,
    Connect,
    Given,
    Pause,
    Steps,
    claiming,
    claiming_slot,
    riding_out,
)
from dislock.core.answers import Acquired, SlotAnswer
from dislock.core.context import LockContext
from dislock.core.dsn import scrub
from dislock.core.lease_clock import LeaseClock, LeaseSettings
from dislock.core.lock_statements import statements_for
from dislock.core.patience import ConnectPatience
from dislock.core.pause import paused_error
from dislock.core.refusal import refused
from dislock.core.rows import RELEASED_MARK, lease_key
from dislock.core.timeouts import RELEASE_TIMEOUT
from dislock.core.unknown_outcome import outcome_unknown
from dislock.core.waiting import slot_keys, slot_retry

logger = logging.getLogger("dislock")


class LeaseTry(NamedTuple):
    """One try at a lease (or at a free slot of it)."""

    key: str
    """The row taken; when none was, the lease's row."""
    clock: LeaseClock | None
    """The lease's clock, started as its statement was sent; None: not taken."""
    fence: int | None
    delayed_until: datetime | None
    """The end of a lock delay after a failover that refused the try."""


def trying_lease(
    context: LockContext,
    settings: LeaseSettings,
    patience: ConnectPatience,
    *,
    given: Given,
) -> Steps[LeaseTry]:
    """``_trying_lease``, ridden out (``riding_out``): the lease's clock restarts each try."""
    return riding_out(
        lambda: _trying_lease(context, settings, patience, given), patience, given.clock
    )


def _trying_lease(
    context: LockContext, settings: LeaseSettings, patience: ConnectPatience, given: Given
) -> Steps[LeaseTry]:
    """One try at ``context``'s lease: its row, or with ``slots`` a free slot row (tried
    again at once while the race for one was lost and others looked free)."""
    statements = statements_for(context)
    keys = slot_keys(context.lock_key, context.slots, context.lease_mode)
    attempts = 0
    while True:
        attempts += 1
        lease_clock, timeout = yield from starting(settings, patience, given)
        answer: Acquired | SlotAnswer
        if context.slots == 1:
            key = keys[0]
            answer = yield from claiming(
                statements.acquire_for(key, context.owner, settings.ttl),
                timeout,
                context=context,
                key=key,
                what=f"lease {key!r}",
                patience=patience,
                look=statements.look(key, ttl=settings.ttl),
                given=given,
            )
            taken, free = answer.acquired, 0
        else:
            answer = yield from claiming_slot(
                statements.acquire_slot(keys, context.owner, settings.ttl),
                timeout,
                context=context,
                keys=keys,
                what=f"a slot of lease {keys[0]!r}",
                patience=patience,
                given=given,
            )
            key = answer.key or keys[0]
            taken, free = answer.key is not None, answer.free
        if (yield from kept(context, settings, key, answer, taken, lease_clock, given)):
            return LeaseTry(key, lease_clock, answer.token, answer.delayed_until)
        if not slot_retry(free=free, attempts=attempts, slots=context.slots):
            return LeaseTry(key, None, None, answer.delayed_until)


def starting(
    settings: LeaseSettings, patience: ConnectPatience, given: Given
) -> Steps[tuple[LeaseClock, float]]:
    """Connect, then start a try's lease clock: its clock, and the statement's timeout.
    Connected first, so that waiting for a connection does not eat into the lease's time."""
    yield Connect(patience)
    sent_at = given.clock()
    lease_clock = LeaseClock(settings, acquired_at=sent_at)
    return lease_clock, lease_clock.attempt_timeout(sent_at)


def kept(
    context: LockContext,
    settings: LeaseSettings,
    key: str,
    answer: Acquired | SlotAnswer,
    taken: bool,
    lease_clock: LeaseClock,
    given: Given,
) -> Steps[bool]:
    """Whether the row ``key`` a try ``taken`` is kept: a pause raises
    ``LockPausedError`` (fleet-wide: not worth waiting for, not a held lease); an
    answer that came so late that the row may be free again is handed back."""
    if answer.paused_until is not None:
        raise paused_error(context.lock_key, answer.paused_for, answer.paused_until)
    if taken and lease_clock.check_deadline(given.clock()):
        released = yield from releasing(context, key, settings.ttl)
        let_go(context, key, settings.ttl, released=released, given=given)
        return False
    return taken


def releasing(context: LockContext, key: str, ttl: float) -> Steps[bool]:
    """Expire the lease row ``key`` now (owner-guarded), waking the lease's waiters:
    whether the release was confirmed (else the row expires within ``ttl``).  A row no
    longer ours may have been marked by a replacer since: it is handed over."""
    statements = statements_for(context)
    release = statements.release(key, context.owner, context.lock_key, context.lease_mode)
    try:
        ended: bool = yield Ask(release, RELEASE_TIMEOUT)
        if not ended:
            yield from handing_over(context, key)
    except Exception as exc:
        logger.warning(
            "could not release lease %s (it expires by itself within %g s): %s",
            key,
            ttl,
            scrub(str(exc), context.url),
        )
        return False
    logger.info("released lease %s", key)
    return True


def let_go(context: LockContext, key: str, ttl: float, *, released: bool, given: Given) -> None:
    """Tell ``given.held`` that the row ``key`` is no longer held: ``released`` (the
    release was confirmed just now), or left to expire by itself within the TTL, or
    later if a renewal stuck on a retired connection still goes through."""
    now = given.clock()
    given.held.let_go(
        tuple(context.table_parts),
        key,
        context.owner,
        visible_until=now if released else now + 2 * ttl,
        forget_at=now + 3 * ttl,
    )


def handing_over(context: LockContext, key: str) -> Steps[str | None]:
    """Hand ``context``'s marked lease row ``key`` to the replacer that marked it,
    once the holder's work is over: who took it (None: the row was not marked, or
    has expired already), best effort."""
    exchange = replace_marks.hand_over(tuple(context.table_parts), key, context.owner)
    try:
        taker: str | None = yield Ask(exchange, RELEASE_TIMEOUT)
    except Exception as exc:
        logger.warning(
            "could not hand lease %s over (its replacer takes it as it expires): %s",
            key,
            scrub(str(exc), context.url),
        )
        return None
    if taker is not None:
        logger.info("handed lease %s over to %s", key, taker)
    return taker


def marking(
    context: LockContext, key: str, timeout: float, patience: ConnectPatience
) -> Steps[tuple[str, replace_marks.Marked | None]]:
    """Mark the live lease row ``key`` for ``context``'s owner: the successor text
    written, and whose row it was (None: it was free, or being replaced already).
    A role without the right to run the key is refused as its acquisition is."""
    text = replace_marks.successor(context.owner, socket.gethostname())
    exchange = replace_marks.mark(tuple(context.table_parts), key, text)
    try:
        marked: replace_marks.Marked | None = yield Ask(exchange, timeout, patience)
    except psycopg.Error as exc:
        denied = refused(exc, url=context.url, key=key, table_parts=context.table_parts)
        if denied is not None:
            raise denied from None
        if outcome_unknown(exc):  # it may have marked the row: take that back
            yield from withdrawing(context, key, text)
        raise
    return text, marked


def taking_over(
    context: LockContext,
    settings: LeaseSettings,
    patience: ConnectPatience,
    text: str,
    *,
    given: Given,
) -> Steps[LeaseTry | None]:
    """One try at the lease row handed over to ``text``: taken (with its clock, as
    ``trying_lease`` takes a row), or None while it has not been."""
    key = lease_key(context.lock_key)
    lease_clock, timeout = yield from starting(settings, patience, given)
    answer = yield from claiming(
        statements_for(context).take_over(key, context.owner, text, settings.ttl),
        timeout,
        context=context,
        key=key,
        what=f"lease {key!r}",
        patience=patience,
        given=given,
    )
    if (yield from kept(context, settings, key, answer, answer.acquired, lease_clock, given)):
        return LeaseTry(key, lease_clock, answer.token, None)
    return None


def replacing(
    context: LockContext,
    settings: LeaseSettings,
    patience: ConnectPatience,
    text: str,
    marked: replace_marks.Marked,
    *,
    given: Given,
) -> Steps[LeaseTry]:
    """Once the live holder's row is ``marked`` for ``text``: the try that took the
    lease as the holder handed it over, or as it expired (a dead or frozen holder);
    else the last one, untaken, and the mark withdrawn."""
    logger.info(
        "lease %r is held by %s: asked it to stop and hand the lease over (replace)",
        context.lock_key,
        marked.holder,
    )
    clock = given.clock
    until = clock() + marked.remaining + replace_marks.SLACK_SECONDS
    while True:
        handed = yield from taking_over(context, settings, patience, text, given=given)
        if handed is not None:
            return handed
        # Expired unhanded (a dead or frozen holder), or released.
        tried = yield from trying_lease(context, settings, patience, given=given)
        if tried.clock is not None:
            return tried
        if clock() >= until:
            break
        yield Pause(min(replace_marks.POLL_SECONDS, max(0.0, until - clock())))
    yield from withdrawing(context, lease_key(context.lock_key), text)
    return tried


def withdrawing(context: LockContext, key: str, text: str) -> Steps[None]:
    """Give up replacing the holder of the lease row ``key``, best effort: take back
    the mark for ``text`` (its renewals succeed again, unless it noticed already), or
    free the row handed over, lest the key sit idle until the row expires."""
    exchange = replace_marks.withdraw(tuple(context.table_parts), key, text, RELEASED_MARK)
    try:
        yield Ask(exchange, RELEASE_TIMEOUT)
    except Exception as exc:
        logger.warning(
            "could not take back the request to replace the holder of lease %r (it expires"
            " by itself): %s",
            context.lock_key,
            scrub(str(exc), context.url),
        )

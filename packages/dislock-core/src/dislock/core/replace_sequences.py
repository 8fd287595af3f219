"""A replacer's sequences (``LockContext.replace``), in ``dislock.core.acquisition``'s
steps: marking the live holder's lease row, waiting for it to be handed over (or to
expire) and taking it, and withdrawing when it gives up.  The marks and statements
are ``dislock.core.replace_marks``'s, the holder's hand-over part of its release
(``dislock.core.lease_acquisition.releasing``).
"""

from __future__ import annotations

import logging
import socket

import psycopg

from dislock.core.acquisition import Ask, Given, Pause, Steps, claiming
from dislock.core.context import LockContext
from dislock.core.dsn import scrub
from dislock.core.lease_acquisition import LeaseTry, kept, starting, trying_lease
from dislock.core.lease_clock import LeaseSettings
from dislock.core.lock_statements import statements_for
from dislock.core.patience import ConnectPatience
from dislock.core.refusal import refused
from dislock.core.replace_marks import (
    POLL_SECONDS,
    SLACK_SECONDS,
    Marked,
    mark,
    successor,
    withdraw,
)
from dislock.core.rows import RELEASED_MARK, lease_key
from dislock.core.timeouts import RELEASE_TIMEOUT
from dislock.core.unknown_outcome import outcome_unknown

logger = logging.getLogger("dislock")


def marking(
    context: LockContext, key: str, timeout: float, patience: ConnectPatience
) -> Steps[tuple[str, Marked | None]]:
    """Mark the live lease row ``key`` for ``context``'s owner: the successor text
    written, and whose row it was (None: it was free, or being replaced already).
    A role without the right to run the key is refused as its acquisition is."""
    text = successor(context.owner, socket.gethostname())
    table_parts = tuple(context.table_parts)
    try:
        marked: Marked | None = yield Ask(mark(table_parts, key, text), timeout, patience)
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
    marked: Marked,
    *,
    given: Given,
) -> Steps[LeaseTry]:
    """Once the live holder's row is ``marked`` for ``text``: take the lease as soon as
    the holder's work is gone and it handed the row over, else once the row expires
    (a dead or frozen holder).  The try that took it, or the last one, untaken, when
    neither happened by then (the mark is then withdrawn)."""
    logger.info(
        "lease %r is held by %s: asked it to stop and hand the lease over (replace)",
        context.lock_key,
        marked.holder,
    )
    clock = given.clock
    until = clock() + marked.remaining + SLACK_SECONDS
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
        yield Pause(min(POLL_SECONDS, max(0.0, until - clock())))
    yield from withdrawing(context, lease_key(context.lock_key), text)
    return tried


def withdrawing(context: LockContext, key: str, text: str) -> Steps[None]:
    """Give up replacing the holder of the lease row ``key``, best effort: take the
    mark for ``text`` back (its renewals succeed again, unless it noticed already),
    or free the row it handed over, so that the key does not sit idle until the
    row expires."""
    exchange = withdraw(tuple(context.table_parts), key, text, RELEASED_MARK)
    try:
        yield Ask(exchange, RELEASE_TIMEOUT)
    except Exception as exc:
        logger.warning(
            "could not take back the request to replace the holder of lease %r (it expires"
            " by itself): %s",
            context.lock_key,
            scrub(str(exc), context.url),
        )

"""Sending an acquiring statement: its answer row, its refusals in the operator's
words, and finding out what it did when the connection lost its answer.

Hand-written in ``dislock/aio/_acquiring.py``; ``dislock/_sync/_acquiring.py`` is
generated from it by ``tools/async_to_sync.py``.  The decisions (which failures
leave the outcome unknown, which rows prove it, how long to keep trying) are
``dislock.core.unknown_outcome``'s and ``dislock.core.patience``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from time import monotonic

import psycopg

from dislock.core.answers import Acquired, SlotAnswer
from dislock.core.context import LockContext
from dislock.core.dsn import error_line, scrub
from dislock.core.errors import DatabaseUnreachableError, NotReplicatedError
from dislock.core.exchange import Answer, Exchange
from dislock.core.lock_statements import statements_for
from dislock.core.patience import ConnectPatience
from dislock.core.refusal import refused
from dislock.core.rows import lease_key
from dislock.core.timeouts import RELEASE_TIMEOUT
from dislock.core.unknown_outcome import Mine, Verdict, judge, outcome_unknown

from ._compat import sleep
from ._hub import Hub

logger = logging.getLogger("dislock")


async def send_acquiring(
    hub: Hub,
    exchange: Exchange[Answer],
    timeout: float,
    *,
    context: LockContext,
    keys: list[str],
    what: str,
    patience: ConnectPatience | None,
    slot_ends: Sequence[datetime] | None = None,
) -> Answer | Mine | None:
    """Send an acquiring statement that takes one of ``keys`` (``what``, in words, for
    the messages) and return its answer.

    A row that synchronous replication did not confirm is handed back before
    ``NotReplicatedError`` (a failover could lose it while the work runs); a
    refusal by the role's grant is ``KeyNotGrantedError``.  When the connection
    loses the answer (``dislock.core.unknown_outcome``), the lock reconnects within
    ``patience`` and reads what the statement did: the row it took (a ``Mine``),
    None when an owner's row found there cannot be trusted to be this
    acquisition's (not acquired), and when it took nothing the statement is sent
    again.  ``slot_ends``: the ends a schedule slot's statement may give its row.
    """
    while True:
        sent_at = monotonic()
        try:
            return await hub.ask(exchange, timeout, patience)
        except NotReplicatedError as exc:
            await hand_back_rows(hub, context, keys)
            raise NotReplicatedError(f"{what} was not acquired (handed back): {exc}") from None
        except psycopg.Error as exc:
            denied = refused(exc, url=context.url, key=keys[0], table_parts=context.table_parts)
            if denied is not None:
                raise denied from None
            if patience is None or not outcome_unknown(exc):
                raise
            verdict = await _find_out(hub, context, keys, what, patience, exc, sent_at, slot_ends)
            if not verdict.send_again:
                return verdict.taken
            logger.info("the acquisition of %s had taken nothing; sending it again", what)


async def _find_out(
    hub: Hub,
    context: LockContext,
    keys: list[str],
    what: str,
    patience: ConnectPatience,
    error: Exception,
    sent_at: float,
    slot_ends: Sequence[datetime] | None,
) -> Verdict:
    """Reconnect within ``patience`` and read whether the statement that lost its
    answer to ``error`` took one of ``keys``."""
    read = statements_for(context).mine(keys, context.owner)
    while True:
        detail = error_line(error, context.url)
        now = monotonic()
        delay = patience.answer_lost(what, now, attempt_started=sent_at)
        if delay is None:
            raise patience.lost_answer_error(detail, now) from error
        logger.info(
            "lost the connection during the acquisition of %s (%s); reading whether it took"
            " its row",
            what,
            detail,
        )
        if delay > 0:
            await sleep(delay)
        sent_at = monotonic()
        try:
            # (A connection it opens waits out refusals within the patience.)
            found = await hub.ask(read, context.connect_timeout_seconds, patience)
        except DatabaseUnreachableError:
            raise
        except psycopg.OperationalError as exc:
            if not outcome_unknown(exc):
                raise
            error = exc  # a read is safe to send again
            continue
        patience.answer_found()
        verdict = judge(
            found,
            table_parts=tuple(context.table_parts),
            owner=context.owner,
            read_sent_at=sent_at,
            slot_ends=slot_ends,
        )
        if verdict.taken is not None:
            hub.note_timeline(verdict.taken.timeline)
            logger.info("the acquisition of %s had taken %s", what, verdict.taken.key)
        elif not verdict.send_again:
            logger.info(
                "a live row of owner %r among %s was not this acquisition's to claim",
                context.owner,
                ", ".join(keys),
            )
        return verdict


async def acquire(
    hub: Hub,
    exchange: Exchange[Acquired],
    timeout: float,
    *,
    context: LockContext,
    key: str,
    what: str,
    patience: ConnectPatience | None = None,
    slot_ends: Sequence[datetime] | None = None,
    look: Exchange[Acquired | None] | None = None,
) -> Acquired:
    """Send an acquiring upsert of the row ``key`` (``send_acquiring``): whether it
    took the row, the fencing token, and the pause that refused it, if one did.

    Bounded by ``timeout``, so that a row locked by a stuck transaction cannot hold
    a start (and the cron runs queueing behind it) indefinitely.  ``slot_ends``:
    those a schedule slot's statement may give its row.  ``look``: the read that
    gives the same refusal when the row is live, sent first on a new connection
    (``Hub.cold``): there, planning the acquiring statement costs the server several
    times what the read does, and when every machine's crontab fires at once all
    but one of them are refused.
    """
    if look is not None and hub.cold:
        refusal = await _look(hub, look, timeout, context, patience)
        if refusal is not None:
            return refusal
    answer = await send_acquiring(
        hub,
        exchange,
        timeout,
        context=context,
        keys=[key],
        what=what,
        patience=patience,
        slot_ends=slot_ends,
    )
    if answer is None:
        return Acquired.nothing()
    if isinstance(answer, Mine):
        return Acquired.from_mine(answer)
    hub.note_timeline(answer.timeline)
    return answer


async def _look(
    hub: Hub,
    look: Exchange[Acquired | None],
    timeout: float,
    context: LockContext,
    patience: ConnectPatience | None,
) -> Acquired | None:
    """The refusal ``look`` reads, or None to send the acquiring statement, which
    also answers for a look that failed (a read: nothing to find out)."""
    try:
        return await hub.ask(look, timeout, patience)
    except DatabaseUnreachableError:
        raise
    except psycopg.Error as exc:
        logger.debug("a look at the lock row failed: %s", error_line(exc, context.url))
        return None


async def acquire_slot(
    hub: Hub,
    exchange: Exchange[SlotAnswer],
    timeout: float,
    *,
    context: LockContext,
    keys: list[str],
    patience: ConnectPatience,
) -> SlotAnswer:
    """Send ``acquire_slot`` over the slot rows ``keys`` (``send_acquiring``): the slot
    taken, if any, and what refused it otherwise."""
    answer = await send_acquiring(
        hub,
        exchange,
        timeout,
        context=context,
        keys=keys,
        what=f"a slot of lease {lease_key(context.lock_key)!r}",
        patience=patience,
    )
    if answer is None:
        return SlotAnswer.nothing()
    if isinstance(answer, Mine):
        return SlotAnswer.from_mine(answer)
    return answer


async def hand_back_rows(hub: Hub, context: LockContext, keys: list[str]) -> None:
    """Expire ``context``'s rows among ``keys`` (owner-guarded, one statement, waking
    the lease's waiters), best effort: an acquisition that synchronous replication
    did not confirm, or that was interrupted after it may have taken a row."""
    try:
        await hub.ask(
            statements_for(context).hand_back(keys, context.owner, context.lock_key),
            RELEASE_TIMEOUT,
        )
    except Exception as error:  # unconfirmed too, most likely: it still expired here
        logger.debug("handing back %s: %s", ", ".join(keys), scrub(str(error), context.url))

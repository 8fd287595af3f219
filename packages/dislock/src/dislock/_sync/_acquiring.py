# GENERATED from dislock-aio's dislock/aio/_acquiring.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""Sending an acquiring statement: its answer row, its refusals in the operator's
words, and finding out what it did when the connection lost its answer.

Hand-written in ``dislock/aio/_acquiring.py``; ``dislock/_sync/_acquiring.py`` is
generated from it by ``tools/async_to_sync.py``.  The decisions (which failures
leave the outcome unknown, which rows prove it, how long to keep trying) are
``dislock.core.unknown_outcome``'s and ``dislock.core.patience``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from time import monotonic
from typing import Any

import psycopg
from psycopg.sql import Composed

from dislock.core import sql
from dislock.core.context import LockContext
from dislock.core.dsn import error_line, scrub
from dislock.core.errors import (
    ConfigurationError,
    DatabaseUnreachableError,
    NotReplicatedError,
)
from dislock.core.grants import refused
from dislock.core.limits import too_long
from dislock.core.patience import ConnectPatience
from dislock.core.timeouts import RELEASE_TIMEOUT
from dislock.core.unknown_outcome import Mine, Verdict, judge, outcome_unknown, parse_mine

from ._compat import sleep
from ._hub import Hub

logger = logging.getLogger("dislock")


def send_acquiring(
    hub: Hub,
    statement: Composed,
    params: dict[str, Any],
    timeout: float,
    *,
    context: LockContext,
    keys: list[str],
    what: str,
    patience: ConnectPatience | None,
    slot_ends: Sequence[datetime] | None = None,
) -> Sequence[Any] | Mine | None:
    """Send an acquiring statement that takes one of ``keys`` (``what``, in words, for
    the messages) and return its answer row.

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
            cursor = hub.execute(statement, params, timeout, patience)
            row = cursor.fetchone()
        except NotReplicatedError as exc:
            hand_back_rows(hub, context, keys)
            raise NotReplicatedError(f"{what} was not acquired (handed back): {exc}") from None
        except psycopg.Error as exc:
            denied = refused(exc, url=context.url, key=keys[0], table_parts=context.table_parts)
            if denied is not None:
                raise denied from None
            if patience is None or not outcome_unknown(exc):
                raise
            verdict = _find_out(hub, context, keys, what, patience, exc, sent_at, slot_ends)
            if not verdict.send_again:
                return verdict.taken
            logger.info("the acquisition of %s had taken nothing; sending it again", what)
            continue
        assert row is not None, "an acquiring statement answers one row"
        return row


def _find_out(
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
    statement = sql.statements_for(context).mine
    params = sql.mine_params(keys, context.owner)
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
            sleep(delay)
        sent_at = monotonic()
        try:
            # (A connection it opens waits out refusals within the patience.)
            cursor = hub.execute(statement, params, context.connect_timeout_seconds, patience)
            found = parse_mine(cursor.fetchall())
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


def acquire(
    hub: Hub,
    statement: Composed,
    params: dict[str, Any],
    timeout: float,
    *,
    context: LockContext,
    what: str,
    parse: Callable[[Sequence[Any]], sql.Acquired] = sql.parse_acquired,
    patience: ConnectPatience | None = None,
    slot_ends: Sequence[datetime] | None = None,
) -> sql.Acquired:
    """Run an acquiring upsert of the row ``params["key"]`` (``send_acquiring``):
    whether it took the row, the fencing token, and the pause that refused it, if
    one did (read by ``parse``).

    Bounded by ``timeout``, so that a row locked by a stuck transaction cannot hold
    a start (and the cron runs queueing behind it) indefinitely.  ``slot_ends``:
    those a schedule slot's statement may give its row.
    """
    answer = send_acquiring(
        hub,
        statement,
        params,
        timeout,
        context=context,
        keys=[params["key"]],
        what=what,
        patience=patience,
        slot_ends=slot_ends,
    )
    if answer is None:
        return sql.Acquired(False, None, None, None)
    if isinstance(answer, Mine):
        return sql.Acquired(
            True, answer.token, None, None, slot_end=answer.expire_at, timeline=answer.timeline
        )
    acquired = parse(answer)
    hub.note_timeline(acquired.timeline)
    if acquired.ttl_cap is not None:
        raise ConfigurationError(too_long(params["ttl"], acquired.ttl_cap))
    return acquired


def acquire_slot(
    hub: Hub,
    statement: Composed,
    params: dict[str, Any],
    timeout: float,
    *,
    context: LockContext,
    keys: list[str],
    patience: ConnectPatience,
) -> sql.SlotAnswer:
    """Run ``acquire_slot`` over the slot rows ``keys`` (``send_acquiring``): the slot
    taken, if any, and what refused it otherwise."""
    lease = sql.lease_key(context.lock_key)
    answer = send_acquiring(
        hub,
        statement,
        params,
        timeout,
        context=context,
        keys=keys,
        what=f"a slot of lease {lease!r}",
        patience=patience,
    )
    if answer is None:
        return sql.SlotAnswer(None, None, 0, None, None, None, None)
    if isinstance(answer, Mine):
        return sql.SlotAnswer(answer.key, answer.token, 1, None, None, None, None)
    slot = sql.parse_slot(answer)
    if slot.ttl_cap is not None:
        raise ConfigurationError(too_long(params["ttl"], slot.ttl_cap))
    return slot


def hand_back_rows(hub: Hub, context: LockContext, keys: list[str]) -> None:
    """Expire ``context``'s rows among ``keys`` (owner-guarded, one statement, waking
    the lease's waiters), best effort: an acquisition that synchronous replication
    did not confirm, or that was interrupted after it may have taken a row."""
    statement = sql.statements_for(context).hand_back
    params = sql.hand_back_params(keys, context.owner, context.lock_key)
    try:
        hub.execute(statement, params, RELEASE_TIMEOUT)
    except Exception as error:  # unconfirmed too, most likely: it still expired here
        logger.debug("handing back %s: %s", ", ".join(keys), scrub(str(error), context.url))

"""The acquisition as one I/O-free sequence: which statements a lock sends, in which
order, and what each answer decides.

A sequence is a generator, in the manner of psycopg's ``generators``: it yields
``Step``s and is fed their answers, and returns the outcome or raises the documented
error.  ``dislock.aio._hub.Hub.drive`` (and its generated sync twin) carries the
steps out; nothing here touches a socket, so every path of an acquisition can be
followed without a database (``tests/unit/test_acquisition.py``).  The schedule
slot's claim is ``dislock.core.schedule_state``'s, the lease's tries
``dislock.core.lease_acquisition``'s.  What every acquiring statement shares (a look
first in a herd, an unconfirmed answer handed back, a grant's refusal, a lost answer
found out, a failover's passing answer ridden out) is ``sending``, ``claiming`` and
``riding_out``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeAlias, TypeVar

import psycopg

from dislock.core.answers import Acquired, SlotAnswer
from dislock.core.context import LockContext
from dislock.core.dsn import error_line, one_line, scrub
from dislock.core.errors import DatabaseUnreachableError, NotReplicatedError, StatementTimeout
from dislock.core.exchange import Exchange
from dislock.core.lock_statements import statements_for
from dislock.core.patience import ConnectPatience, passing_answer
from dislock.core.refusal import refused
from dislock.core.timeouts import RELEASE_TIMEOUT
from dislock.core.unknown_outcome import HeldRows, Mine, Verdict, judge, outcome_unknown

logger = logging.getLogger("dislock")

Answer = TypeVar("Answer")
Outcome = TypeVar("Outcome")


class Ask(NamedTuple, Generic[Answer]):
    """Send ``exchange`` within ``timeout`` seconds (opening a connection within
    ``patience`` if one is needed); answered with the exchange's answer."""

    exchange: Exchange[Answer]
    timeout: float
    patience: ConnectPatience | None = None


class Pause(NamedTuple):
    """Wait ``seconds``; answered with None."""

    seconds: float


class Connect(NamedTuple):
    """Open the connection if it is not open, within ``patience``; answered with None."""

    patience: ConnectPatience


class Crowded(NamedTuple):
    """Whether the next statement is the first on a connection opened only after refused
    or failed tries (``HubState.crowded``): a herd at the server's door, seen from here."""


class Noted(NamedTuple):
    """The server timeline an answer carried, for the hub to compare after a
    reconnection; answered with None."""

    timeline: object


Step: TypeAlias = "Ask[Any] | Pause | Connect | Crowded | Noted"
Steps: TypeAlias = Generator[Step, Any, Outcome]
"""A sequence: the steps it yields, what it returns."""

Clock = Callable[[], float]


class Given(NamedTuple):
    """What a sequence reads of the process, not of the database, handed in by its
    driver (``dislock.aio._hub.GIVEN``) so that a test gives its own: the
    monotonic clock, the local wall clock (aware), and the process's rows (``HELD``)."""

    clock: Clock
    wall: Callable[[], datetime]
    held: HeldRows


def sending(
    exchange: Exchange[Answer],
    timeout: float,
    *,
    context: LockContext,
    keys: list[str],
    what: str,
    patience: ConnectPatience | None,
    slot_ends: Sequence[datetime] | None = None,
    given: Given,
) -> Steps[Answer | Mine | None]:
    """Send an acquiring statement that takes one of ``keys`` (``what``, in words, for
    the messages): its answer; or, when the connection lost it, the row it took (a
    ``Mine``), or None for an owner's row not to be trusted as its own (not acquired).
    ``slot_ends``: the ends a schedule slot's statement may give its row."""
    while True:
        sent_at = given.clock()
        try:
            answer: Answer = yield Ask(exchange, timeout, patience)
            return answer
        except NotReplicatedError as exc:
            yield from handing_back(context, keys)
            raise NotReplicatedError(f"{what} was not acquired (handed back): {exc}") from None
        except StatementTimeout:
            # Stuck behind a row lock (a commit waiting for its synchronous standby,
            # a fenced writer's commit): cancelled before it took anything, unless the
            # cancel crossed its commit, so what it may have taken is handed back and
            # the try is ridden out (``riding_out``).
            yield from handing_back(context, keys)
            raise
        except psycopg.Error as exc:
            denied = refused(exc, url=context.url, key=keys[0], table_parts=context.table_parts)
            if denied is not None:
                raise denied from None
            if patience is None or not outcome_unknown(exc):
                raise
            verdict = yield from _finding_out(
                context, keys, what, patience, exc, sent_at, slot_ends, given
            )
            if not verdict.send_again:
                return verdict.taken
            logger.info("the acquisition of %s had taken nothing; sending it again", what)


def _finding_out(
    context: LockContext,
    keys: list[str],
    what: str,
    patience: ConnectPatience,
    error: Exception,
    sent_at: float,
    slot_ends: Sequence[datetime] | None,
    given: Given,
) -> Steps[Verdict]:
    """Reconnect within ``patience`` and read whether the statement that lost its
    answer to ``error`` took one of ``keys``."""
    read = statements_for(context).mine(keys, context.owner)
    while True:
        detail = error_line(error, context.url)
        now = given.clock()
        delay = patience.answer_lost(what, now, attempt_started=sent_at)
        if delay is None:
            raise patience.gave_up(detail, now) from error
        logger.info(
            "lost the connection during the acquisition of %s (%s); reading whether it took"
            " its row",
            what,
            detail,
        )
        if delay > 0:
            yield Pause(delay)
        sent_at = given.clock()
        try:
            # (A connection it opens waits out refusals within the patience.)
            found: list[Mine] = yield Ask(read, context.connect_timeout_seconds, patience)
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
            held=given.held,
        )
        if verdict.taken is not None:
            yield Noted(verdict.taken.timeline)
            logger.info("the acquisition of %s had taken %s", what, verdict.taken.key)
        elif not verdict.send_again:
            logger.info(
                "a live row of owner %r among %s was not this acquisition's to claim",
                context.owner,
                ", ".join(keys),
            )
        return verdict


def claiming(
    exchange: Exchange[Acquired],
    timeout: float,
    *,
    context: LockContext,
    key: str,
    what: str,
    patience: ConnectPatience | None = None,
    slot_ends: Sequence[datetime] | None = None,
    look: Exchange[Acquired | None] | None = None,
    given: Given,
) -> Steps[Acquired]:
    """An acquiring upsert of the row ``key`` (``sending``): whether it took the row,
    the fencing token, and the pause that refused it, if one did.

    ``look``: the read that gives the same refusal when the row is live, sent first
    only on a connection opened through a crowded door (``Crowded``), where all but
    one machine are refused and planning the acquiring statement costs the server
    several times the read.  A look that fails leaves the answer to the statement.
    """
    if look is not None and (yield Crowded()):
        try:
            refusal: Acquired | None = yield Ask(look, timeout, patience)
        except DatabaseUnreachableError:
            raise
        except psycopg.Error as exc:
            logger.debug("a look at the lock row failed: %s", error_line(exc, context.url))
        else:
            if refusal is not None:
                return refusal
    answer = yield from sending(
        exchange,
        timeout,
        context=context,
        keys=[key],
        what=what,
        patience=patience,
        slot_ends=slot_ends,
        given=given,
    )
    if answer is None:
        return Acquired.nothing()
    if isinstance(answer, Mine):
        return Acquired.from_mine(answer)
    yield Noted(answer.timeline)
    return answer


def claiming_slot(
    exchange: Exchange[SlotAnswer],
    timeout: float,
    *,
    context: LockContext,
    keys: list[str],
    what: str,
    patience: ConnectPatience,
    given: Given,
) -> Steps[SlotAnswer]:
    """``acquire_slot`` over the slot rows ``keys`` (``sending``): the slot taken, if
    any, and what refused it otherwise."""
    answer = yield from sending(
        exchange, timeout, context=context, keys=keys, what=what, patience=patience, given=given
    )
    if answer is None:
        return SlotAnswer.nothing()
    if isinstance(answer, Mine):
        return SlotAnswer.from_mine(answer)
    return answer


def handing_back(context: LockContext, keys: list[str]) -> Steps[None]:
    """Expire ``context``'s rows among ``keys`` (owner-guarded, one statement, waking
    the lease's waiters), best effort: an acquisition that synchronous replication
    did not confirm, or that was interrupted after it may have taken a row."""
    statements = statements_for(context)
    exchange = statements.hand_back(keys, context.owner, context.lock_key, context.lease_mode)
    try:
        yield Ask(exchange, RELEASE_TIMEOUT)
    except Exception as error:  # unconfirmed too, most likely: it still expired here
        logger.debug("handing back %s: %s", ", ".join(keys), scrub(str(error), context.url))


def riding_out(
    attempt: Callable[[], Steps[Outcome]], patience: ConnectPatience, clock: Clock
) -> Steps[Outcome]:
    """``attempt()``'s outcome, the whole attempt made again (on a fresh connection)
    after a failover's passing answer (``dislock.core.patience.passing_answer``) with
    the connections' backoff until ``patience``'s deadline, then raised, saying how long."""
    while True:
        started = clock()
        try:
            return (yield from attempt())
        except (NotReplicatedError, StatementTimeout, psycopg.Error) as exc:
            if not passing_answer(exc):
                raise
            now = clock()
            delay = patience.next_delay(exc, now, attempt_started=started)
            if delay is None:
                raise patience.still_answered(exc, now) from None
            logger.info("%s; trying again in %.2f s", one_line(str(exc)), delay)
        yield Pause(delay)

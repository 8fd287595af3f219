"""The acquisition as one I/O-free sequence: which statements a lock sends, in which
order, and what each answer decides.

A sequence is a generator, in the manner of psycopg's ``generators``: it yields
``Step``s and is fed their answers.  ``Ask`` is a statement to send (the driver
feeds back the exchange's answer, or throws in the error it raised), ``Pause`` a
wait, ``Connect`` a connection to open, ``Crowded`` the question whether the
connection is new and was opened only after refused tries, and ``Noted`` the
server timeline an answer carried.  It returns the outcome, or
raises the documented error.  ``dislock.aio._acquiring.drive`` (and its generated
sync twin) carries the steps out; nothing here touches a socket, so every path of
an acquisition can be followed without a database (``tests/unit/test_acquisition.py``).

The paths: on a connection opened through a crowded door (a herd), a look (one
primary-key read) refuses a live row for less than planning the acquiring
statement costs; an answer that synchronous
replication did not confirm is handed back; a refusal by the role's grant is
``KeyNotGrantedError``; an answer the connection lost is found out by reading the
owner's rows back within the connection patience, and the statement sent again
when it took nothing (``dislock.core.unknown_outcome``); a schedule slot is
claimed by the database clock, and when that clock is far from ours, by the slot
of the clock read first; a lease's slot lost in a race is tried again while others
looked free, and a lease whose answer came too late to work on is released.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from datetime import datetime, tzinfo
from functools import partial
from typing import Any, Generic, NamedTuple, TypeAlias, TypeVar

import psycopg

from dislock.core import after
from dislock.core.answers import Acquired, SlotAnswer
from dislock.core.context import LockContext
from dislock.core.cron import SlotCandidates, begun_too_long_ago, slot_end, slot_start
from dislock.core.dsn import error_line, one_line, scrub
from dislock.core.errors import (
    DatabaseUnreachableError,
    LockDelayedError,
    LockNotAcquiredError,
    NotReplicatedError,
    SlotLateError,
    StatementTimeout,
)
from dislock.core.exchange import Exchange
from dislock.core.failover import delayed
from dislock.core.history import history_table
from dislock.core.lease_clock import LeaseClock, LeaseSettings
from dislock.core.lock_statements import statements_for
from dislock.core.patience import ConnectPatience, passing_answer
from dislock.core.pause import paused_error
from dislock.core.refusal import refused
from dislock.core.replace_marks import hand_over
from dislock.core.retries import LATE_MARK
from dislock.core.timeouts import RELEASE_TIMEOUT
from dislock.core.unknown_outcome import HeldRows, Mine, Verdict, judge, outcome_unknown
from dislock.core.waiting import slot_keys, slot_retry

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
    """Whether the next statement is the first on a connection that was opened only
    after the server refused or failed earlier tries (``Hub.crowded``): the sign,
    seen from one machine, that many others are at the server's door at once."""


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
    driver (``dislock.aio._acquiring.GIVEN``) so that a test gives its own: the
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
    the messages): its answer; or, when the connection lost the answer, the row it
    took (a ``Mine``), or None when an owner's row found there cannot be trusted to
    be this acquisition's (not acquired).  ``slot_ends``: the ends a schedule
    slot's statement may give its row."""
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
            raise patience.lost_answer_error(detail, now) from error
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
    on a connection opened through a crowded door (``Crowded``): in a herd,
    planning the acquiring statement costs the server several times what the read
    does, and all but one machine are refused.  Anywhere else it would be a second
    round trip for nothing: a lone cron run finds the row free, and a warm process
    has paid for its connection already.  A look that fails leaves the answer to
    the acquiring statement (a read: nothing to find out).
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
    try:
        yield Ask(
            statements_for(context).hand_back(
                keys, context.owner, context.lock_key, context.lease_mode
            ),
            RELEASE_TIMEOUT,
        )
    except Exception as error:  # unconfirmed too, most likely: it still expired here
        logger.debug("handing back %s: %s", ", ".join(keys), scrub(str(error), context.url))


def riding_out(
    attempt: Callable[[], Steps[Outcome]], patience: ConnectPatience, clock: Clock
) -> Steps[Outcome]:
    """``attempt()``'s outcome, the whole attempt made again after a failover's passing
    answer (``dislock.core.patience.passing_answer``; the hub retired the connection
    that gave it, so the next try opens a fresh one) with the connections' backoff,
    until ``patience``'s deadline; then the answer is raised, saying how long."""
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
            look=statements.look_by_clock(key, candidates),
        )
        if answer.slot_end is not None:
            return answer, answer.slot_end
        # The database clock is far from ours: read it, then claim.
        now: datetime = yield Ask(statements.now(), timeout, patience)
        expires_at = slot_end(schedule, now, tz)
    answer = yield from claim(
        statements.acquire_until(key, context.owner, expires_at),
        slot_ends=[expires_at],
        look=statements.look_until(key),
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
    """``_trying_lease``, ridden out (``riding_out``): the lease's clock starts again
    with each try."""
    return riding_out(
        lambda: _trying_lease(context, settings, patience, given), patience, given.clock
    )


def _trying_lease(
    context: LockContext, settings: LeaseSettings, patience: ConnectPatience, given: Given
) -> Steps[LeaseTry]:
    """One try at ``context``'s lease: its row, or with ``slots`` a free slot row (tried
    again at once while the race for one was lost and others looked free).  A pause
    raises ``LockPausedError``; an answer that came after the lease's deadline is
    released rather than worked on."""
    statements = statements_for(context)
    keys = slot_keys(context.lock_key, context.slots, context.lease_mode)
    attempts = 0
    while True:
        attempts += 1
        # Connected before the lease's clock starts: waiting for a connection must
        # not eat into the lease's time.
        yield Connect(patience)
        sent_at = given.clock()
        lease_clock = LeaseClock(settings, acquired_at=sent_at)
        timeout = lease_clock.attempt_timeout(sent_at)
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
                look=statements.look_for(key, settings.ttl),
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
        fence, paused_until, delayed_until = answer.token, answer.paused_until, answer.delayed_until
        if paused_until is not None:
            # Paused fleet-wide: not worth waiting for, not a held lease.
            raise paused_error(context.lock_key, answer.paused_for, paused_until)
        if taken and lease_clock.check_deadline(given.clock()):
            # Taken, but the answer came so late that the row may be free again
            # already: hand it back rather than work on it.
            released = yield from releasing(context, key, settings.ttl)
            let_go(context, key, settings.ttl, released=released, given=given)
            taken = False
        if taken:
            return LeaseTry(key, lease_clock, fence, delayed_until)
        if not slot_retry(free=free, attempts=attempts, slots=context.slots):
            return LeaseTry(key, None, None, delayed_until)


def releasing(context: LockContext, key: str, ttl: float) -> Steps[bool]:
    """Expire the lease row ``key`` now (owner-guarded), waking the lease's waiters:
    whether the release was confirmed (if not, the row expires within ``ttl``).  A
    row that was no longer ours to release may have been marked by a replacer
    since the last renewal: it is handed over (``handing_over``)."""
    release = statements_for(context).release(
        key, context.owner, context.lock_key, context.lease_mode
    )
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
    exchange = hand_over(tuple(context.table_parts), key, context.owner)
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

# GENERATED from dislock-aio's dislock/aio/_locks.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""Schedule and lease locks as context managers, and ``acquire_locks``.

Hand-written in ``dislock/aio/_locks.py``; ``dislock/_sync/_locks.py`` is
generated from it by ``tools/async_to_sync.py``.  The source is written so
that the tool's rewriting gives correct blocking code: concurrency goes through
``._compat``, decisions through ``dislock.core``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial, wraps
from time import monotonic
from types import TracebackType
from typing import Any, Literal, ParamSpec, Protocol, TypeAlias, TypeVar, overload

from dislock.core import history, kinds, sql
from dislock.core.config import SCHEDULE, normalize_strategies
from dislock.core.context import (
    LEASE_LOST_EXIT_CODE,
    LeaseLossPolicy,
    LockContext,
    default_owner,
    strategies_for,
)
from dislock.core.cron import SlotCandidates, slot_end
from dislock.core.dsn import connection_kwargs, scrub
from dislock.core.errors import (
    ConfigurationError,
    LeaseLostError,
    LockDelayedError,
    LockNotAcquiredError,
)
from dislock.core.failover import delayed
from dislock.core.lease import LeaseClock, LeaseSettings, raises_on_exit
from dislock.core.patience import ConnectPatience, SlotEnd
from dislock.core.pause import paused_error
from dislock.core.renewal import Renewal
from dislock.core.supervision import LOSS_LOGGER
from dislock.core.timeouts import RELEASE_TIMEOUT
from dislock.core.unknown_outcome import HELD
from dislock.core.waiting import (
    WAKE_CHANNEL,
    WaitPlan,
    check_waiting,
    jitter_delay,
    listen_query,
    slot_keys,
    slot_retry,
    wake_key,
)

from ._acquiring import acquire, acquire_slot, hand_back_rows
from ._compat import Event, LossGuard, sleep
from ._hub import Hub, enter_hub, leave_hub
from ._listen import Listener

# isort: split

logger = logging.getLogger("dislock")

# How a `with` block ended, as its exit method is told (all None when it ended normally).
_ExcType: TypeAlias = type[BaseException] | None
_Exc: TypeAlias = BaseException | None
_Tb: TypeAlias = TracebackType | None
_Entered = TypeVar("_Entered", covariant=True)
P = ParamSpec("P")
R = TypeVar("R")


def _enter_hub(context: LockContext) -> Hub:
    return enter_hub(context.url, context.connect_timeout_seconds)


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
        self.key = sql.schedule_key(context.lock_key)
        self.expires_at = context.next_run_time
        self.fence: int | None = None
        """The fencing token of this acquisition (with ``LockContext.fencing``)."""
        self.records_history = context.history
        """Whether entering and leaving record the run (``LockContext.history``);
        ``acquire_locks`` turns it off for its locks and records the run itself."""
        self._recording: _Recording | None = None

    def __enter__(self) -> ScheduleLock:
        context = self.context
        statements = sql.statements_for(context)
        timeout = context.connect_timeout_seconds
        # The connection is given back at once: a slot needs nothing while the job runs.
        hub = _enter_hub(context)
        # One patience for every connection on the way to the decision, until the slot ends.
        # (The slot is that of the instant the lock started, computed only if needed.)
        patience = ConnectPatience(
            context.connect_patience_seconds,
            monotonic(),
            slot=partial(_slot_end, context, datetime.now(timezone.utc)),
        )
        claim = partial(
            acquire,
            hub,
            timeout=timeout,
            context=context,
            what=f"schedule slot {self.key!r}",
            patience=patience,
        )
        try:
            hub.connect_patiently(patience)
            expires_at = context.next_run_time
            answer: sql.Acquired | None = None
            if expires_at is None:
                zone = context.cron_zone  # resolved with the schedule
                assert context.schedule is not None and zone is not None
                # No round trip for the database clock first: the acquiring
                # statement picks the slot by its NOW() among the ends around the
                # local clock.
                candidates = SlotCandidates.around(
                    context.schedule, datetime.now(timezone.utc), zone.tz
                )
                answer = claim(
                    statements.acquire_by_clock,
                    sql.acquire_by_clock_params(self.key, context.owner, candidates),
                    parse=sql.parse_by_clock,
                )
                expires_at = answer.slot_end
                if expires_at is None:
                    # The database clock is far from ours: read it, then claim.
                    cursor = hub.execute(statements.now, {}, timeout, patience)
                    row = cursor.fetchone()
                    assert row is not None
                    expires_at = slot_end(context.schedule, row[0], zone.tz)
                    answer = None
            if answer is None:
                answer = claim(
                    statements.acquire_until,
                    sql.acquire_until_params(self.key, context.owner, expires_at),
                )
        finally:
            leave_hub(hub)
        if answer.paused_until is not None:
            raise paused_error(context.lock_key, answer.paused_for, answer.paused_until)
        if not answer.acquired:
            slot = f"schedule slot of {context.lock_key!r} ending {expires_at.isoformat()}"
            if answer.delayed_until is not None:
                until = answer.delayed_until
                raise LockDelayedError(delayed(slot, until), until)
            raise LockNotAcquiredError(
                f"{slot} was already started by another owner (or has already ended)"
            )
        self.expires_at = expires_at
        self.fence = answer.token
        HELD.add(tuple(context.table_parts), self.key, context.owner, until=expires_at)
        logger.info("acquired schedule slot %s until %s", self.key, expires_at.isoformat())
        if self.records_history:
            self._recording = _record_start(self)
        return self

    @property
    def holding(self) -> bool:
        """Whether the exit has anything to do: only a run to record (the slot
        stays taken until it ends)."""
        return self._recording is not None

    def __exit__(self, exc_type: _ExcType, exc: _Exc, tb: _Tb) -> None:
        recording, self._recording = self._recording, None
        if recording is not None:
            recording.__exit__(exc_type, exc, tb)


class _Held:
    """One acquisition of a lease: its bookkeeping, and the hub renewing it."""

    __slots__ = ("hub", "renewal")

    def __init__(self, hub: Hub, renewal: Renewal) -> None:
        self.hub = hub
        self.renewal = renewal

    @property
    def clock(self) -> LeaseClock:
        return self.renewal.clock


class LeaseLock:
    """One holder at a time, for as long as the block runs.

    Entering inserts a row that expires ``run_ttl_seconds`` from now (or takes
    over an expired one) and hands the lease to the process's renewer, which
    extends it every ``lease_interval_seconds`` (guarded by the owner token)
    together with every other lease the process holds on that database, over
    one shared connection.  ``lease_lost`` is set as soon as the lease can no
    longer be vouched for: a renewal found the row gone, or the lease's local
    deadline passed without one succeeding.  Leaving expires the row, unless the
    lease was lost (the row may belong to someone else by then), and wakes the
    lease's waiters.

    A lock may be entered again once it has been left (never twice at once):
    ``lease_lost`` stays the same event, cleared as each acquisition starts, and
    ``fence``, ``lost_reason`` and ``renewals`` describe the latest acquisition.

    With ``LockContext.wait_seconds``, a lease held elsewhere is waited for (woken by
    its release, or by polling) before ``LockNotAcquiredError``; with
    ``LockContext.slots``, up to that many holders share it, each on a slot row of
    its own (``key`` names it).
    """

    def __init__(self, context: LockContext) -> None:
        self.settings = LeaseSettings.from_context(context)
        self.context = context
        self.key = sql.lease_key(context.lock_key)
        """The row held: the lease's, or with ``LockContext.slots`` the slot's taken."""
        self._slot_keys = slot_keys(context.lock_key, context.slots)
        self.lease_lost = Event()
        """Set once the lease is lost.  One event for the lock's whole life
        (fetching it before entering is fine), cleared as each acquisition
        starts; after leaving, it still tells whether the lease was lost."""
        self.fence: int | None = None
        """The fencing token of the latest acquisition (with ``LockContext.fencing``)."""
        self._held: _Held | None = None
        self._clock: LeaseClock | None = None  # the latest acquisition's, kept after leaving
        self._delayed_until: datetime | None = None  # a lock delay that refused the last try
        self.records_history = context.history
        """Whether entering and leaving record the run (``LockContext.history``);
        ``acquire_locks`` turns it off for its locks and records the run itself."""
        self._recording: _Recording | None = None

    @property
    def deadline(self) -> float | None:
        """While held: the ``time.monotonic()`` instant at which the lease counts as
        lost unless a renewal succeeds first; None when not held."""
        held = self._held
        return None if held is None else held.clock.deadline

    def follow_deadline(self, follower: Callable[[float], None] | None) -> None:
        """While held, have the renewer call ``follower`` with the new deadline after
        each renewal that succeeds (from its own thread or task: it must be quick and
        never raise); None stops it.  The supervisor keeps the command's guard told."""
        held = self._held
        if held is not None:
            held.renewal.on_renewed = follower

    @property
    def lost_reason(self) -> str | None:
        """Why the latest acquisition was lost (None while it is not)."""
        return None if self._clock is None else self._clock.lost_reason

    @property
    def renewals(self) -> int:
        """How many renewals of the latest acquisition succeeded."""
        return 0 if self._clock is None else self._clock.renewals

    def is_lost(self) -> bool:
        """Whether the lease is lost: ``lease_lost`` is set, or (while held) its
        local deadline has passed, which the watchdog may not have declared yet.
        A pure query: it sets nothing and logs nothing."""
        if self.lease_lost.is_set():
            return True
        held = self._held
        return held is not None and held.clock.past_deadline(monotonic())

    def declare_if_lost(self) -> bool:
        """``is_lost()``, and if so make it known: set ``lease_lost`` and log the
        reason (once per acquisition).  For code that acts on the loss without
        waiting for the watchdog, such as the supervisor at the deadline."""
        held = self._held
        if held is not None and held.clock.expired(monotonic()):
            held.hub.declare_lost(held.renewal)
        return self.lease_lost.is_set()

    def __enter__(self) -> LeaseLock:
        if self._held is not None:
            raise RuntimeError("this LeaseLock is already held; create one per acquisition")
        context = self.context
        hub = _enter_hub(context)
        held: _Held | None = None
        # One patience for every connection on the way to the decision (``_attempt``
        # connects first); a wait for the holder does not spend it (``_wait``).
        patience = ConnectPatience(context.connect_patience_seconds, monotonic())
        try:
            taken = self._attempt(hub, patience)
            if taken is None and context.wait_seconds > 0:
                taken = self._wait(hub, patience)
            if taken is None:
                if self._delayed_until is not None:
                    raise LockDelayedError(self._held_elsewhere(), self._delayed_until)
                raise LockNotAcquiredError(self._held_elsewhere())
            clock, fence = taken
            self.fence = fence
            held = _Held(
                hub=hub,
                renewal=Renewal(
                    key=self.key,
                    owner=context.owner,
                    table_parts=tuple(context.table_parts),
                    clock=clock,
                ),
            )
            # The previous acquisition's renewal is unregistered, and the hub sets
            # the events of registered renewals only: nothing sets it for that one now.
            self.lease_lost.clear()
            self._clock = clock
            hub.register(held.renewal, self.lease_lost)
            HELD.add(held.renewal.table_parts, self.key, context.owner)
            # Inside the try: an interruption from here on is handled below, and
            # one after it finds the lock ``holding``, so its exit releases it.
            self._held = held
        except LockNotAcquiredError:
            leave_hub(hub)
            raise
        except BaseException:
            # Interrupted (a signal, a cancellation) or failed (no thread could be
            # started) after the acquiring statement may have taken a row: hand back
            # whatever is ours rather than leave it to expire by its TTL.
            self._held = None
            if held is not None:
                hub.unregister(held.renewal)
                HELD.discard(held.renewal.table_parts, held.renewal.key, context.owner)
            keys = [self.key] if context.slots == 1 else self._slot_keys
            hand_back_rows(hub, context, keys)
            leave_hub(hub)
            raise
        logger.info("acquired lease %s for %g s", self.key, self.settings.ttl)
        if self.records_history:
            try:
                self._recording = _record_start(self)
            except BaseException as error:  # interrupted: give the lease back too
                self.__exit__(type(error), error, error.__traceback__)
                raise
        return self

    def _held_elsewhere(self) -> str:
        context = self.context
        waited = f" (waited {context.wait_seconds:g} s)" if context.wait_seconds > 0 else ""
        if context.slots > 1:
            lease = sql.lease_key(context.lock_key)
            if self._delayed_until is not None:
                return delayed(f"no slot of lease {lease!r}", self._delayed_until) + waited
            return f"all {context.slots} slots of lease {lease!r} are held{waited}"
        if self._delayed_until is not None:
            return delayed(f"lease {self.key!r}", self._delayed_until) + waited
        return f"lease {self.key!r} is held by another owner{waited}"

    def _attempt(self, hub: Hub, patience: ConnectPatience) -> tuple[LeaseClock, int | None] | None:
        """One try at the lease (or at a free slot of it): its clock and fencing
        token when taken."""
        context = self.context
        statements = sql.statements_for(context)
        attempts = 0
        while True:
            attempts += 1
            # Connected before the lease's clock starts: waiting for a connection
            # must not eat into the lease's time.
            hub.connect_patiently(patience)
            sent_at = monotonic()
            clock = LeaseClock(self.settings, acquired_at=sent_at)
            if context.slots == 1:
                self.key = sql.lease_key(context.lock_key)
                answer = acquire(
                    hub,
                    statements.acquire_for,
                    sql.lease_params(self.key, context.owner, self.settings.ttl),
                    clock.attempt_timeout(sent_at),
                    context=context,
                    what=f"lease {self.key!r}",
                    patience=patience,
                )
                acquired, fence, free = answer.acquired, answer.token, 0
                reason, paused_until = answer.paused_for, answer.paused_until
                self._delayed_until = answer.delayed_until
            else:
                slot = acquire_slot(
                    hub,
                    statements.acquire_slot,
                    sql.slot_params(self._slot_keys, context.owner, self.settings.ttl),
                    clock.attempt_timeout(sent_at),
                    context=context,
                    keys=self._slot_keys,
                    patience=patience,
                )
                fence, free, reason, paused_until = (
                    slot.token,
                    slot.free,
                    slot.paused_for,
                    slot.paused_until,
                )
                self._delayed_until = slot.delayed_until
                acquired = slot.key is not None
                if slot.key is not None:
                    self.key = slot.key
            if paused_until is not None:
                # Paused fleet-wide: not worth waiting for, not a held lease.
                raise paused_error(context.lock_key, reason, paused_until)
            if acquired and clock.expired(monotonic()):
                # Taken, but the answer came so late that the row may be free
                # again already: hand it back rather than work on it.
                self._expire_row(hub)
                acquired = False
            if acquired:
                return clock, fence
            if not slot_retry(free=free, attempts=attempts, slots=context.slots):
                return None

    def _wait(self, hub: Hub, patience: ConnectPatience) -> tuple[LeaseClock, int | None] | None:
        """Try again whenever the lease may have been released, until the wait is over."""
        context = self.context
        plan = WaitPlan(
            context.wait_seconds, started_at=monotonic(), poll_seconds=context.wait_poll_seconds
        )
        listener = self._listen()
        logger.info(
            "lease %s is held; waiting up to %g s (%s)",
            sql.lease_key(context.lock_key),
            context.wait_seconds,
            "woken by releases" if listener is not None else "polling",
        )
        waited_from: float | None = None
        try:
            while True:
                if waited_from is not None:
                    # Waiting for the holder does not spend the patience with the database.
                    patience.postpone(monotonic() - waited_from)
                # A release between the last try and the LISTEN would be missed:
                # so the LISTEN comes first, then the try.
                taken = self._attempt(hub, patience)
                if taken is not None:
                    return taken
                delay = plan.next_delay(monotonic(), listening=listener is not None)
                if delay is None:
                    return None
                waited_from = monotonic()
                if listener is None:
                    sleep(delay)
                    continue
                try:
                    listener.wait(delay)
                except Exception as exc:
                    logger.warning(
                        "stopped listening for releases, polling instead: %s",
                        scrub(str(exc), context.url),
                    )
                    listener.close()
                    listener = None
        finally:
            if listener is not None:
                listener.close()

    def _listen(self) -> Listener | None:
        """A connection woken by releases of this lease, unless only polling can work."""
        context = self.context
        if context.wait_listen is False:
            return None
        try:
            return Listener.open(
                context.url,
                connection_kwargs(context.url, context.connect_timeout_seconds),
                WAKE_CHANNEL,
                (listen_query(context.table_parts), {"wake_key": wake_key(context.lock_key)}),
                detect=context.wait_listen is None,
            )
        except Exception as exc:
            logger.warning(
                "cannot listen for releases, polling instead: %s", scrub(str(exc), context.url)
            )
            return None

    def _expire_row(self, hub: Hub) -> None:
        """Expire our row now (owner-guarded), waking the lease's waiters."""
        context = self.context
        statement = sql.statements_for(context).release
        try:
            hub.execute(
                statement,
                sql.release_params(self.key, context.owner, context.lock_key),
                RELEASE_TIMEOUT,
            )
        except Exception as exc:
            logger.warning(
                "could not release lease %s (it expires by itself within %g s): %s",
                self.key,
                self.settings.ttl,
                scrub(str(exc), context.url),
            )
        else:
            logger.info("released lease %s", self.key)

    @property
    def holding(self) -> bool:
        """Whether the lease is held (taken, and not yet released)."""
        return self._held is not None

    def __exit__(self, exc_type: _ExcType, exc: _Exc, tb: _Tb) -> None:
        held = self._held
        assert held is not None, "LeaseLock exited without entering"
        # Judged as the block ends: a renewal finishing afterwards does not
        # turn finished work into failed work.
        lost = self.declare_if_lost()
        recording, self._recording = self._recording, None
        if recording is not None:  # while the lease is held, as acquire_locks records
            try:
                recording.__exit__(exc_type, exc, tb)
            except BaseException:
                self._leave(held, lost=lost, block_failed=True)
                raise
        self._leave(held, lost=lost, block_failed=exc_type is not None)

    def _leave(self, held: _Held, *, lost: bool, block_failed: bool) -> None:
        held.hub.unregister(held.renewal)
        renewal = held.renewal
        HELD.discard(renewal.table_parts, renewal.key, renewal.owner)
        self._held = None
        try:
            # A renewal of this lease still in flight runs before the release on
            # the shared connection, and one stuck on a retired connection finds
            # the row expired (renewals skip expired rows): the release stands.
            if not lost and not held.clock.expired(monotonic()):
                self._expire_row(held.hub)
        finally:
            leave_hub(held.hub)
        if lost and self.settings.policy is LeaseLossPolicy.CONTINUE:
            logging.getLogger(LOSS_LOGGER).warning(
                "lease %s was lost during the block (policy: continue)", self.key
            )
        if raises_on_exit(self.settings.policy, lost=lost, block_failed=block_failed):
            raise LeaseLostError(
                f"lease {self.key!r} was lost while the block ran: {held.clock.lost_reason}",
                reason=held.clock.lost_reason,
            )


Lock = ScheduleLock | LeaseLock


class LockSession:
    """What ``acquire_locks`` yields.

    ``lease_lost`` is always an event, for work that wants to stop at a safe
    point (``if session.lease_lost.is_set(): break``): the lease's
    ``LeaseLock.lease_lost``, set once the lease is lost, whatever the loss
    policy; without a lease lock, an event that is never set.
    """

    # A plain class rather than a dataclass: building one of those costs the
    # wrapper half a millisecond of start-up on every cron run.
    __slots__ = ("lease_lost", "locks", "run_end")

    def __init__(self, locks: tuple[Lock, ...], lease_lost: Event | None = None) -> None:
        self.locks = locks
        if lease_lost is None:
            lease = self.lease
            lease_lost = Event() if lease is None else lease.lease_lost
        self.lease_lost: Event = lease_lost
        self.run_end: history.RunEnd | None = None
        """How the run ended, for its history row (``LockContext.history``); set by
        ``run_with_locks``, judged from the block's exception when left None."""

    def __repr__(self) -> str:
        return f"LockSession(locks={self.locks!r}, lease_lost={self.lease_lost!r})"

    @property
    def lease(self) -> LeaseLock | None:
        return next((lock for lock in self.locks if isinstance(lock, LeaseLock)), None)

    @property
    def schedule(self) -> ScheduleLock | None:
        return next((lock for lock in self.locks if isinstance(lock, ScheduleLock)), None)

    @property
    def fencing_token(self) -> int | None:
        """The token to pass along with writes (``LockContext.fencing``): the lease's,
        or the schedule slot's when there is no lease; None without fencing."""
        held = self.lease or self.schedule
        return None if held is None else held.fence


class _Recording:
    """The run's row in the history table (``LockContext.history``): inserted once
    the locks are held, completed as the block ends, before they are released.

    It keeps the shared connection for the end statement, so that a schedule-only
    run does not connect again to record it.  A history statement that fails is
    logged and otherwise ignored: the run is not the history's hostage.
    """

    def __init__(self, context: LockContext, session: LockSession) -> None:
        self.context = context
        self.session = session
        self.table = history.history_table(context.table_parts, context.history_table)
        self.run_id: int | None = None
        self.hub: Hub | None = None

    def __enter__(self) -> _Recording:
        context = self.context
        self.hub = _enter_hub(context)
        slot = next(
            (lock.expires_at for lock in self.session.locks if isinstance(lock, ScheduleLock)),
            None,
        )
        params = history.start_params(
            lock_key=context.lock_key,
            modes=[
                "schedule" if isinstance(lock, ScheduleLock) else "lease"
                for lock in self.session.locks
            ],
            slot_end=slot,
            owner=context.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            cron=context.schedule,
            cron_tz=None if context.cron_zone is None else context.cron_zone.name,
        )
        try:
            cursor = self.hub.execute(
                history.start_statement(self.table), params, history.HISTORY_TIMEOUT
            )
            row = cursor.fetchone()
            assert row is not None
            self.run_id = int(row[0])
        except Exception as exc:
            logger.warning(
                "could not record the start of %s in history table %s: %s",
                context.lock_key,
                ".".join(self.table),
                scrub(str(exc), context.url),
            )
        except BaseException:  # interrupted: nothing left for the exit to do
            hub, self.hub = self.hub, None
            leave_hub(hub)
            raise
        return self

    @property
    def holding(self) -> bool:
        """Whether it uses the shared connection (from entering until its exit)."""
        return self.hub is not None

    def __exit__(self, exc_type: _ExcType, exc: _Exc, tb: _Tb) -> None:
        hub, self.hub = self.hub, None
        assert hub is not None
        try:
            if self.run_id is not None:
                self._record_end(hub, self.run_id, exc)
        finally:
            leave_hub(hub)

    def _record_end(self, hub: Hub, run_id: int, exc: BaseException | None) -> None:
        lease = self.session.lease
        lost = lease is not None and lease.is_lost()
        end = self.session.run_end
        if end is None:
            end = history.end_of_block(exc, lease_lost=lost)
        elif lost and end.outcome == "ok":
            terminate = self.context.lease_loss_policy is LeaseLossPolicy.TERMINATE
            if terminate:  # the lease went as the command ended: the wrapper returns 75
                end = history.RunEnd("lease_lost", LEASE_LOST_EXIT_CODE)
        statement, params = history.end_statement(self.table), end.params(run_id)
        try:
            hub.execute(statement, params, history.HISTORY_TIMEOUT)
        except Exception as error:
            if not (history.retry_end(error) and self.context.connect_patience_seconds > 0):
                self._not_recorded(error)
                return
            logger.warning(
                "could not record the end of %s yet (%s); retrying for up to %g s",
                self.context.lock_key,
                scrub(" ".join(str(error).split()), self.context.url),
                self.context.connect_patience_seconds,
            )
            try:
                patience = ConnectPatience(self.context.connect_patience_seconds, monotonic())
                hub.connect_patiently(patience)
                hub.execute(statement, params, history.HISTORY_TIMEOUT, patience)
            except Exception as again:
                self._not_recorded(again)
                return
            logger.warning("recorded the end of %s: %s", self.context.lock_key, end.outcome)

    def _not_recorded(self, error: BaseException) -> None:
        logger.warning(
            "could not record the end of %s in history table %s: %s",
            self.context.lock_key,
            ".".join(self.table),
            error,
        )


def _record_start(lock: Lock) -> _Recording:
    """The history row of a run guarded by ``lock`` alone (entered without
    ``acquire_locks``)."""
    recording = _Recording(lock.context, LockSession(locks=(lock,)))
    recording.__enter__()
    return recording


_LOCK_CLASSES: dict[str, type[ScheduleLock] | type[LeaseLock]] = {
    "ScheduleLock": ScheduleLock,
    "LeaseLock": LeaseLock,
}
"""The classes named by ``dislock.core.kinds.KINDS``."""


def build_locks(context: LockContext, strategies: str | Iterable[str]) -> list[Lock]:
    """The locks for ``strategies``, in acquisition order (schedule first)."""
    names = normalize_strategies(strategies)
    check_waiting(names, context.wait_seconds, context.slots)
    return [_LOCK_CLASSES[kinds.kind(name).lock_class](context) for name in names]


class _Entering(Protocol[_Entered]):
    """A context manager that says whether its exit has anything to undo
    (``holding``; see ``enter_exit_first``)."""

    @property
    def holding(self) -> bool: ...

    def __enter__(self) -> _Entered: ...

    def __exit__(self, exc_type: _ExcType, exc: _Exc, tb: _Tb) -> bool | None: ...


def enter_exit_first(stack: ExitStack, manager: _Entering[_Entered]) -> _Entered:
    """Enter ``manager`` with its exit already on ``stack``.

    ``stack.enter_context`` registers the exit only after entering, and an
    exception that a signal handler raises in between (the wrapper's
    ``Interrupted``, a ``KeyboardInterrupt``) would leave the lock held, with
    nothing to release it before its TTL.  Registered first, the exit runs
    whenever the manager says it holds something (``holding``)."""

    def exit_if_entered(exc_type: _ExcType, exc: _Exc, tb: _Tb) -> bool | None:
        if manager.holding:
            return manager.__exit__(exc_type, exc, tb)
        return None

    stack.push(exit_if_entered)
    return manager.__enter__()


class _Acquisition:
    """What ``acquire_locks`` returns: the locks entered in order (each with
    ``enter_exit_first``), released in reverse order on exit.  Called on a
    function, it decorates it: each call runs inside an acquisition of its own."""

    def __init__(
        self,
        context: LockContext,
        strategies: str | Iterable[str],
        *,
        cancel_on_loss: bool = True,
        fresh_owner: bool = False,
    ) -> None:
        self._context = context
        self._fresh_owner = fresh_owner
        self._strategies = strategies
        self._stack: ExitStack | None = None
        self._session: LockSession | None = None
        self._cancel_on_loss = cancel_on_loss
        self._guard: LossGuard | None = None

    @property
    def holding(self) -> bool:
        return self._stack is not None

    def __enter__(self) -> LockSession:
        if self._stack is not None:
            raise RuntimeError("these locks are already held; call acquire_locks once per use")
        context = self._context
        locks = build_locks(context, self._strategies)
        delay = jitter_delay(context.jitter_max_seconds)
        if delay:
            logger.debug("sleeping %.3f s of startup jitter", delay)
            sleep(delay)
        # Set before the first lock is entered: from here on, an exit (even one
        # registered before this method returns) releases what is held.
        self._stack = stack = ExitStack()
        try:
            # One connection for all the acquisitions, even if a lock in the
            # middle gives it back.
            hub = _enter_hub(context)
            try:
                for lock in locks:
                    lock.records_history = False  # the session records the run
                    enter_exit_first(stack, lock)
                session = LockSession(locks=tuple(locks))
                if context.history:
                    enter_exit_first(stack, _Recording(context, session))
            finally:
                leave_hub(hub)
        except BaseException as exc:
            self._stack = None
            stack.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._session = session
        lease = session.lease
        if (
            self._cancel_on_loss
            and lease is not None
            and context.lease_loss_policy is LeaseLossPolicy.TERMINATE
        ):
            # Nothing is waited for between here and the block: the guard watches it all.
            self._guard = LossGuard(lease.lease_lost)
        return session

    def __exit__(self, exc_type: _ExcType, exc: _Exc, tb: _Tb) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        guard, self._guard = self._guard, None
        if guard is None:
            return stack.__exit__(exc_type, exc, tb)
        # Stopped before anything else is awaited: no cancellation can come after it.
        cancelled = guard.stop(exc_type)
        try:
            if cancelled:
                error = self._cancelled_error()
                stack.__exit__(type(error), error, None)
                raise error from None
            return stack.__exit__(exc_type, exc, tb)
        finally:
            guard.finish()

    def _cancelled_error(self) -> LeaseLostError:
        assert self._session is not None and self._session.lease is not None
        lease = self._session.lease
        reason = lease.lost_reason
        return LeaseLostError(
            f"lease {lease.key!r} was lost while the block ran: {reason}; the block was cancelled",
            reason=reason,
        )

    def _for_one_call(self) -> _Acquisition:
        context = self._context
        if self._fresh_owner:
            # A token of its own for each run: one made at decoration time would be
            # shared by the processes forked afterwards, which could then renew
            # and release each other's rows.
            context = replace(context, owner=default_owner())
        return _Acquisition(context, self._strategies, cancel_on_loss=self._cancel_on_loss)

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        @wraps(func)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            with self._for_one_call():
                return func(*args, **kwargs)

        return guarded


def acquire_locks(
    context: LockContext, strategies: str | Iterable[str] = (SCHEDULE,)
) -> _Acquisition:
    """Enter every lock of ``strategies`` in order, after the startup jitter, and
    release them in reverse order on exit; entering gives the ``LockSession``.

    Also a decorator (``@acquire_locks(context, "lease")``): every call of the
    function runs inside an acquisition of its own, raising
    ``LockNotAcquiredError`` when another owner holds a lock.

    Under ``LeaseLossPolicy.TERMINATE`` (the default), a lease lost while the
    block runs ends it with ``LeaseLostError``: ``dislock.aio`` cancels the task
    running the block at once; the sync flavour cannot interrupt a thread and
    raises as the block ends.
    """
    return _Acquisition(context, strategies)


def acquire_unguarded(context: LockContext, strategies: str | Iterable[str]) -> _Acquisition:
    """``acquire_locks`` for a caller that acts on a lost lease itself (the
    supervisor stops its command): the task running the block is never cancelled."""
    return _Acquisition(context, strategies, cancel_on_loss=False)


class _SkipWhenHeld:
    """``with_locks(..., skip_held=True)``: a decorator whose calls, when another
    owner holds a lock, do nothing and return None instead of raising, as a
    scheduler's job on every replica but one should.  Only the acquisition's own
    refusal is swallowed, never an error of the function's."""

    def __init__(self, acquisition: _Acquisition) -> None:
        self._acquisition = acquisition

    def __call__(self, func: Callable[P, R]) -> Callable[P, R | None]:
        @wraps(func)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
            with ExitStack() as stack:
                try:
                    enter_exit_first(stack, self._acquisition._for_one_call())
                except LockNotAcquiredError as refused:
                    _skipped(func, refused)
                    return None
                return func(*args, **kwargs)

        return guarded


def _skipped(func: Callable[..., object], refused: LockNotAcquiredError) -> None:
    # A lock delay holds up every key of the table, not just this one: say it louder.
    level = logging.WARNING if isinstance(refused, LockDelayedError) else logging.INFO
    logger.log(level, "skipped %s: %s", getattr(func, "__qualname__", func), refused)


@overload
def with_locks(
    context: LockContext | str,
    strategies: str | Iterable[str] | None = None,
    *,
    skip_held: Literal[False] = False,
    **settings: Any,
) -> _Acquisition: ...


@overload
def with_locks(
    context: LockContext | str,
    strategies: str | Iterable[str] | None = None,
    *,
    skip_held: Literal[True],
    **settings: Any,
) -> _SkipWhenHeld: ...


def with_locks(
    context: LockContext | str,
    strategies: str | Iterable[str] | None = None,
    *,
    skip_held: bool = False,
    **settings: Any,
) -> _Acquisition | _SkipWhenHeld:
    """Decorate a function so that each call runs only while its locks are held.

    The 0.1.0 form, ``@with_locks(context, strategies)``, is
    ``@acquire_locks(context, strategies)``.  The short form names the key and
    the ``LockContext`` fields that differ from the defaults (url from
    ``$DATABASE_URL``, table ``key_value``):
    ``@with_locks("nightly-report", schedule="0 3 * * *")``.  Without
    ``strategies``, the locks follow the settings: a schedule slot with
    ``schedule`` (or ``next_run_time``), a lease with ``run_ttl_seconds``, both
    with both.  The short form makes a new owner token for each call (unless
    ``owner`` is given), so that processes forked after decorating never share
    one.  A call whose lock is held elsewhere raises ``LockNotAcquiredError``;
    with ``skip_held=True`` it returns None instead (logged at INFO, a lock delay
    at WARNING), which is what a job scheduled on every replica wants.
    """
    fresh_owner = isinstance(context, str) and "owner" not in settings
    if isinstance(context, str):
        # Built now, so that a mistake fails as the function is decorated.
        context = LockContext(lock_key=context, **settings)
    elif settings:
        raise ConfigurationError(
            f"with_locks(context, ...) takes no settings ({', '.join(sorted(settings))}): "
            "they belong in the LockContext"
        )
    chosen = strategies_for(context) if strategies is None else strategies
    acquisition = _Acquisition(context, chosen, fresh_owner=fresh_owner)
    return _SkipWhenHeld(acquisition) if skip_held else acquisition

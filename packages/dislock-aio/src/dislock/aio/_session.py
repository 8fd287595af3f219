"""``acquire_locks``: the locks of a run entered in order, and the ``LockSession``
it gives.

The locks themselves are ``._schedule``'s and ``._lease``'s, the run's history row
``._recording``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import datetime
from functools import wraps
from time import monotonic
from typing import ParamSpec, Protocol, TypeVar

from dislock.core import history, kinds
from dislock.core.acquisition import handing_back
from dislock.core.config import SCHEDULE, normalize_strategies
from dislock.core.context import LeaseLossPolicy, LockContext, check_strategies, default_owner
from dislock.core.errors import LeaseLostError, LockNotAcquiredError, MaxRuntimeExceeded
from dislock.core.exit_arguments import Exc, ExcType, Tb
from dislock.core.groups import group_context
from dislock.core.kinds import LEASE
from dislock.core.observing import note
from dislock.core.rows import lease_key
from dislock.core.waiting import jitter_delay

from ._compat import Event, Gives, LossGuard, Takes, sleep
from ._hub import drive_briefly, enter_hub
from ._lease import LeaseLock
from ._recording import RunRecording
from ._schedule import ScheduleLock

logger = logging.getLogger("dislock")

_Entered = TypeVar("_Entered", covariant=True)
P = ParamSpec("P")
R = TypeVar("R")

Lock = ScheduleLock | LeaseLock


class LockSession:
    """What ``acquire_locks`` yields.

    ``lease_lost`` is always an event, for work that wants to stop at a safe
    point (``if session.lease_lost.is_set(): break``): the lease's
    ``LeaseLock.lease_lost``, set once the lease is lost, whatever the loss
    policy; without a lease lock, an event that is never set.  ``time_left``
    is the same for ``LockContext.max_runtime_seconds``.
    """

    # A plain class rather than a dataclass: building one of those costs the
    # wrapper half a millisecond of start-up on every cron run.
    __slots__ = ("last_success", "lease_lost", "locks", "run_end", "stop_at")

    def __init__(self, locks: tuple[Lock, ...], lease_lost: Event | None = None) -> None:
        self.locks = locks
        if lease_lost is None:
            lease = self.lease
            lease_lost = Event() if lease is None else lease.lease_lost
        self.lease_lost: Event = lease_lost
        self.run_end: history.RunEnd | None = None
        """How the run ended, for its history row (``LockContext.history``); set by
        ``run_with_locks``, judged from the block's exception when left None."""
        self.stop_at: float | None = None
        """When (``time.monotonic()``) the block's maximum runtime is over; None:
        no bound."""
        self.last_success: datetime | None = None
        """With ``LockContext.history``: the start of the key's last successful run
        before this one (for a schedule, its slot's start); None when there is none."""

    def time_left(self) -> float | None:
        """Seconds left of the block's ``max_runtime_seconds`` (0 once it is over),
        for work that stops at a safe point; None without a bound."""
        return None if self.stop_at is None else max(0.0, self.stop_at - monotonic())

    def __repr__(self) -> str:
        return f"LockSession(locks={self.locks!r}, lease_lost={self.lease_lost!r})"

    @property
    def lease(self) -> LeaseLock | None:
        return next((lock for lock in self.locks if isinstance(lock, LeaseLock)), None)

    @property
    def schedule(self) -> ScheduleLock | None:
        return next((lock for lock in self.locks if isinstance(lock, ScheduleLock)), None)

    @property
    def attempt(self) -> int:
        """Which attempt of its schedule slot this run is (``LockContext.retries``):
        1 for the slot's first run, 2 for its first retry, …; 1 without a schedule."""
        schedule = self.schedule
        return 1 if schedule is None else schedule.attempt

    @property
    def slot_start(self) -> datetime | None:
        """The schedule slot's start (None without a schedule lock, or a cron)."""
        schedule = self.schedule
        return None if schedule is None else schedule.slot_start

    @property
    def slot_end(self) -> datetime | None:
        """The schedule slot's end, the database clock's pick; None without one."""
        schedule = self.schedule
        return None if schedule is None else schedule.slot_end

    @property
    def fencing_token(self) -> int | None:
        """The token to pass along with writes (``LockContext.fencing``): the lease's,
        or the schedule slot's when there is no lease; None without fencing."""
        lease = self.lease
        held = lease if lease is not None and not _is_group(lease) else self.schedule
        return None if held is None else held.fence


def _is_group(lock: Lock) -> bool:
    return isinstance(lock, LeaseLock) and lock.context.lease_mode == kinds.GROUP.name


def _modes(locks: Iterable[Lock]) -> list[str]:
    modes = [SCHEDULE if isinstance(lock, ScheduleLock) else LEASE for lock in locks]
    return [mode for mode, lock in zip(modes, locks, strict=True) if not _is_group(lock)]


_LOCK_CLASSES: dict[str, type[Lock]] = {"ScheduleLock": ScheduleLock, "LeaseLock": LeaseLock}
"""The classes named by ``dislock.core.kinds.KINDS``."""


def build_locks(
    context: LockContext, strategies: str | Iterable[str], *, supervised: bool = False
) -> list[Lock]:
    """The locks for ``strategies``, in acquisition order (schedule first).
    ``supervised``: for a command ``run_with_locks`` supervises, whose guard kills it
    by the lease's deadline whatever the process does."""
    names = normalize_strategies(strategies)
    check_strategies(context, names)
    locks = [_LOCK_CLASSES[kinds.kind(name).lock_class](context) for name in names]
    # An expired lease proves its holder's work is gone only when a guard killed it at
    # the lease's deadline: a supervised command under TERMINATE, with a one-row
    # lease.  A guarded block is not killed (a sync block runs on; a frozen process
    # cancels nothing), so its slot is not taken from a holder that seems gone.
    terminating = context.lease_loss_policy is LeaseLossPolicy.TERMINATE
    proven = supervised and terminating and context.slots == 1
    if context.retries and LEASE in names and proven:
        for lock in locks:
            if isinstance(lock, ScheduleLock):
                lock.lease_row = lease_key(context.lock_key)
    if context.group is not None:
        # Taken last, a slot of the group's own N-slot lease; lost with the run's lease
        # (one event: a loss of either stops the run, and neither row is released).
        group = LeaseLock(group_context(context))
        lease = next((lock for lock in locks if isinstance(lock, LeaseLock)), None)
        if lease is not None:
            group.lease_lost = lease.lease_lost
        locks.append(group)
    return locks


class _Entering(Protocol[_Entered]):
    """A context manager that says whether its exit has anything to undo
    (``holding``; see ``enter_exit_first``)."""

    @property
    def holding(self) -> bool: ...

    async def __aenter__(self) -> _Entered: ...

    async def __aexit__(self, exc_type: ExcType, exc: Exc, tb: Tb) -> bool | None: ...


async def enter_exit_first(stack: AsyncExitStack, manager: _Entering[_Entered]) -> _Entered:
    """Enter ``manager`` with its exit already on ``stack``, to run whenever the
    manager says it holds something (``holding``).  ``stack.enter_context`` registers
    the exit only after entering: an exception a signal handler raises in between (the
    wrapper's ``Interrupted``, a ``KeyboardInterrupt``) would leave the lock held, with
    nothing to release it before its TTL."""

    async def exit_if_entered(exc_type: ExcType, exc: Exc, tb: Tb) -> bool | None:
        if manager.holding:
            return await manager.__aexit__(exc_type, exc, tb)
        return None

    stack.push_async_exit(exit_if_entered)
    return await manager.__aenter__()


class Acquisition:
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
        self._stack: AsyncExitStack | None = None
        self._session: LockSession | None = None
        self._cancel_on_loss = cancel_on_loss
        self._guard: LossGuard | None = None

    @property
    def holding(self) -> bool:
        return self._stack is not None

    async def __aenter__(self) -> LockSession:
        if self._stack is not None:
            raise RuntimeError("these locks are already held; call acquire_locks once per use")
        context = self._context
        locks = build_locks(context, self._strategies, supervised=not self._cancel_on_loss)
        delay = jitter_delay(context.jitter_max_seconds)
        if delay:
            logger.debug("sleeping %.3f s of startup jitter", delay)
            note("wait", reason="startup jitter", seconds=delay)
            await sleep(delay)
        # Set before the first lock is entered: from here on, an exit (even one
        # registered before this method returns) releases what is held.
        self._stack = stack = AsyncExitStack()
        try:
            # One connection for all the acquisitions, even if a lock in the
            # middle gives it back.
            async with enter_hub(context.url, context.connect_timeout_seconds):
                for lock in locks:
                    lock.records_history = False  # the session records the run
                    if isinstance(lock, ScheduleLock):
                        lock.run = None  # until the run starts: a slot is not retried before
                    try:
                        await enter_exit_first(stack, lock)
                    except LockNotAcquiredError:
                        # The group is full: the slot this run took is handed back, for a
                        # later tick (owner-guarded; the lease is released as it unwinds).
                        slots = [one.key for one in locks if isinstance(one, ScheduleLock)]
                        if _is_group(lock) and slots:
                            await drive_briefly(context, handing_back(context, slots))
                        raise
                session = LockSession(locks=tuple(locks))
                schedule = session.schedule
                if schedule is not None:
                    schedule.run = session
                    if schedule.lease_row is not None:
                        # Left before the lease is released (the stack unwinds in reverse).
                        stack.push_async_exit(schedule.closing)
                if context.history:
                    slot = None if schedule is None else schedule.expires_at
                    recording = RunRecording(context, session, _modes(locks), slot)
                    await enter_exit_first(stack, recording)
                    session.last_success = recording.last_success
        except BaseException as exc:
            self._stack = None
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._session = session
        lease = session.lease
        bound = context.max_runtime_seconds
        if bound is not None:
            session.stop_at = monotonic() + bound
        if not self._cancel_on_loss:
            return session
        terminating = lease is not None and context.lease_loss_policy is LeaseLossPolicy.TERMINATE
        if terminating or bound is not None:
            # Nothing is waited for between here and the block: the guard watches it
            # all.  (A loss it is not to act on is an event never set.)
            lost = lease.lease_lost if lease is not None and terminating else Event()
            self._guard = LossGuard(lost, session.stop_at)
        return session

    async def __aexit__(self, exc_type: ExcType, exc: Exc, tb: Tb) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        guard, self._guard = self._guard, None
        if guard is None:
            return await stack.__aexit__(exc_type, exc, tb)
        # Stopped before anything else is awaited: no cancellation can come after it.
        cancelled = guard.stop(exc_type)
        try:
            error: Exception | None = None
            if guard.out_of_time and (cancelled or exc_type is None):
                what = "the block was cancelled" if cancelled else "it ended late"
                error = MaxRuntimeExceeded(
                    f"lock {self._context.lock_key!r}: the block ran past its maximum runtime"
                    f" of {self._context.max_runtime_seconds:g} s (max_runtime_seconds); {what}"
                )
            elif cancelled:
                assert self._session is not None and self._session.lease is not None
                lease = self._session.lease
                error = LeaseLostError(
                    f"lease {lease.key!r} was lost while the block ran: {lease.lost_reason};"
                    " the block was cancelled",
                    reason=lease.lost_reason,
                )
            if error is None:
                return await stack.__aexit__(exc_type, exc, tb)
            await stack.__aexit__(type(error), error, None)
            raise error from None
        finally:
            await guard.finish()

    def for_one_call(self) -> Acquisition:
        context = self._context
        if self._fresh_owner:
            # A token of its own for each run: one made at decoration time would be
            # shared by the processes forked afterwards, which could then renew
            # and release each other's rows.
            context = replace(context, owner=default_owner())
        return Acquisition(context, self._strategies, cancel_on_loss=self._cancel_on_loss)

    def __call__(self, func: Takes[P, R]) -> Gives[P, R]:
        @wraps(func)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            async with self.for_one_call():
                return await func(*args, **kwargs)

        return guarded


def acquire_locks(
    context: LockContext, strategies: str | Iterable[str] = (SCHEDULE,)
) -> Acquisition:
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
    return Acquisition(context, strategies)


def acquire_unguarded(context: LockContext, strategies: str | Iterable[str]) -> Acquisition:
    """``acquire_locks`` for a caller that acts on a lost lease itself (the
    supervisor stops its command): the task running the block is never cancelled."""
    return Acquisition(context, strategies, cancel_on_loss=False)

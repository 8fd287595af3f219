"""Schedule and lease locks as context managers, and ``acquire_locks``.

The asyncio module ``dislock/aio/_locks.py`` is the hand-written source; the sync
``dislock/_sync/_locks.py`` is generated from it by ``tools/async_to_sync.py``.
Write the source so that dropping ``async``/``await`` (and the renames that tool
lists) gives correct blocking code: concurrency goes through ``._compat``,
decisions through ``dislock.core``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from time import monotonic
from types import TracebackType
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.sql import Composed

from dislock.core import sql
from dislock.core.config import SCHEDULE, normalize_strategies
from dislock.core.context import LeaseLossPolicy, LockContext
from dislock.core.cron import slot_end
from dislock.core.dsn import connection_kwargs
from dislock.core.errors import (
    ConfigurationError,
    LeaseLostError,
    LockNotAcquiredError,
    StatementTimeout,
)
from dislock.core.lease import (
    RELEASE_TIMEOUT,
    RENEWER_STOP_TIMEOUT,
    LeaseClock,
    LeaseSettings,
    raises_on_exit,
)
from dislock.core.supervision import jitter_delay

from ._compat import Event, Worker, execute_within, sleep, spawn, stop_worker, wait_event

logger = logging.getLogger("dislock")


async def connect(context: LockContext) -> AsyncConnection[TupleRow]:
    """A connection for lock statements: autocommit, no prepared statements."""
    return await AsyncConnection.connect(
        context.url, **connection_kwargs(context.url, context.connect_timeout_seconds)
    )


async def acquire(
    conn: AsyncConnection[TupleRow], statement: Composed, params: dict[str, Any], timeout: float
) -> tuple[bool, int | None]:
    """Run an acquiring upsert: whether it took the row, and the fencing token.

    Bounded, so that a row locked by a stuck transaction cannot hold a start
    (and the cron runs queueing behind it) indefinitely.
    """
    cursor = await execute_within(conn, statement, params, timeout)
    row = await cursor.fetchone()
    return (False, None) if row is None else (True, row[0])


class ScheduleLock:
    """One start per schedule slot.

    Entering claims the slot's row until ``next_run_time`` (or, without it, until
    the next boundary of ``schedule`` on the database clock) and raises
    ``LockNotAcquiredError`` if another owner already started in this slot.
    Leaving does nothing: the slot stays taken until it ends.
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

    async def __aenter__(self) -> ScheduleLock:
        context = self.context
        statements = sql.statements_for(context)
        async with await connect(context) as conn:
            expires_at = context.next_run_time
            if expires_at is None:
                assert context.schedule is not None
                cursor = await conn.execute(statements.now)
                row = await cursor.fetchone()
                assert row is not None
                expires_at = slot_end(context.schedule, row[0])
            acquired, fence = await acquire(
                conn,
                statements.acquire_until,
                sql.acquire_until_params(self.key, context.owner, expires_at),
                context.connect_timeout_seconds,
            )
        if not acquired:
            raise LockNotAcquiredError(
                f"schedule slot of {context.lock_key!r} ending {expires_at.isoformat()} "
                "was already started by another owner (or has already ended)"
            )
        self.expires_at = expires_at
        self.fence = fence
        logger.info("acquired schedule slot %s until %s", self.key, expires_at.isoformat())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


@dataclass
class _Held:
    """One acquisition of a lease: what its workers share, and nothing older."""

    clock: LeaseClock
    stop: Event
    lost: Event
    workers: tuple[Worker, ...] = ()


class LeaseLock:
    """One holder at a time, for as long as the block runs.

    Entering inserts a row that expires ``run_ttl_seconds`` from now (or takes
    over an expired one) and starts a renewer that extends it every
    ``lease_interval_seconds``, guarded by the owner token, and a watchdog that
    declares the lease lost when its local deadline passes.  ``lease_lost`` is set
    as soon as the lease can no longer be vouched for.  Leaving stops both and
    expires the row through a second connection, unless the lease was lost (the
    row may belong to someone else by then).
    """

    def __init__(self, context: LockContext) -> None:
        self.settings = LeaseSettings.from_context(context)
        self.context = context
        self.key = sql.lease_key(context.lock_key)
        self.lease_lost = Event()
        """Set when the lease is lost; a fresh event for each acquisition."""
        self.fence: int | None = None
        """The fencing token of this acquisition (with ``LockContext.fencing``)."""
        self._held: _Held | None = None

    @property
    def clock(self) -> LeaseClock | None:
        """The lease's renewal bookkeeping while it is held."""
        return None if self._held is None else self._held.clock

    def is_lost(self) -> bool:
        """Whether the lease is lost, counting a local deadline that passed while
        a renewal was still waiting for the server."""
        held = self._held
        if held is not None and held.clock.expired(monotonic()):
            self._declare_lost(held)
        return self.lease_lost.is_set()

    async def __aenter__(self) -> LeaseLock:
        if self._held is not None:
            raise RuntimeError("this LeaseLock is already held; create one per acquisition")
        context = self.context
        conn = await connect(context)
        try:
            sent_at = monotonic()
            clock = LeaseClock(self.settings, acquired_at=sent_at)
            acquired, fence = await acquire(
                conn,
                sql.statements_for(context).acquire_for,
                sql.lease_params(self.key, context.owner, self.settings.ttl),
                clock.attempt_timeout(sent_at),
            )
            if acquired and clock.expired(monotonic()):
                # Taken, but the answer came so late that the row may be free
                # again already: hand it back rather than work on it.
                await self._expire_row(conn)
                acquired = False
        except BaseException:
            await conn.close()
            raise
        if not acquired:
            await conn.close()
            raise LockNotAcquiredError(f"lease {self.key!r} is held by another owner")
        self.fence = fence
        held = _Held(clock=clock, stop=Event(), lost=Event())
        self.lease_lost = held.lost
        held.workers = (
            spawn(partial(self._renew_until_stopped, held, conn), f"dislock-renewer:{self.key}"),
            spawn(partial(self._watch_deadline, held), f"dislock-deadline:{self.key}"),
        )
        self._held = held
        logger.info("acquired lease %s for %g s", self.key, self.settings.ttl)
        return self

    async def _renew_until_stopped(
        self, held: _Held, conn: AsyncConnection[TupleRow] | None
    ) -> None:
        clock = held.clock
        statement = sql.statements_for(self.context).renew
        params = sql.lease_params(self.key, self.context.owner, self.settings.ttl)
        try:
            while not await wait_event(held.stop, clock.delay_until_renewal(monotonic())):
                sent_at = monotonic()
                try:
                    if conn is None:
                        conn = await connect(self.context)
                    cursor = await execute_within(
                        conn, statement, params, clock.attempt_timeout(monotonic())
                    )
                    alive = clock.renewed(sent_at=sent_at, now=monotonic(), rows=cursor.rowcount)
                except Exception as exc:
                    alive = clock.failed(exc, now=monotonic())
                    if alive:
                        logger.warning(
                            "renewal of lease %s failed, retrying until its deadline: %s",
                            self.key,
                            clock.last_error,
                        )
                    if conn is not None and (
                        conn.broken or conn.closed or isinstance(exc, StatementTimeout)
                    ):
                        await conn.close()
                        conn = None  # reconnect on the next attempt
                if not alive:
                    self._declare_lost(held)
                    return
                logger.debug("renewed lease %s", self.key)
        finally:
            if conn is not None:
                await conn.close()

    async def _watch_deadline(self, held: _Held) -> None:
        """Declare the lease lost when its local deadline passes, whatever the renewer
        is doing: a renewal can hang on a dead network far longer than the TTL."""
        clock = held.clock
        while not await wait_event(held.stop, clock.until_deadline(monotonic())):
            if clock.expired(monotonic()):
                self._declare_lost(held)
                return

    def _declare_lost(self, held: _Held) -> None:
        if not held.lost.is_set():
            logger.warning("lease %s lost: %s", self.key, held.clock.lost_reason)
            held.lost.set()

    async def _expire_row(self, conn: AsyncConnection[TupleRow] | None = None) -> None:
        """Expire our row now (owner-guarded), on ``conn`` or a connection of its own."""
        statement = sql.statements_for(self.context).release
        params = sql.release_params(self.key, self.context.owner)
        try:
            if conn is not None:
                await execute_within(conn, statement, params, RELEASE_TIMEOUT)
            else:
                async with await connect(self.context) as own:
                    await execute_within(own, statement, params, RELEASE_TIMEOUT)
        except Exception as exc:
            logger.warning(
                "could not release lease %s (it expires by itself within %g s): %s",
                self.key,
                self.settings.ttl,
                exc,
            )
        else:
            logger.info("released lease %s", self.key)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held = self._held
        assert held is not None, "LeaseLock exited without entering"
        # Judged as the block ends: a renewer slow to stop afterwards does not
        # turn finished work into failed work.
        lost = self.is_lost()
        held.stop.set()
        renewer, watchdog = held.workers
        stopped = await stop_worker(renewer, RENEWER_STOP_TIMEOUT)
        await stop_worker(watchdog, RENEWER_STOP_TIMEOUT)
        self._held = None
        if not stopped:
            # Still inside a statement: what it last did to the row is unknown,
            # so the row is left to expire rather than released.
            logger.warning("lease %s: the renewer did not stop in time", self.key)
        elif not lost and not held.clock.expired(monotonic()):
            await self._expire_row()
        if lost and self.settings.policy is LeaseLossPolicy.CONTINUE:
            logger.warning("lease %s was lost during the block (policy: continue)", self.key)
        if raises_on_exit(self.settings.policy, lost=lost, block_failed=exc_type is not None):
            raise LeaseLostError(
                f"lease {self.key!r} was lost while the block ran: {held.clock.lost_reason}"
            )


Lock = ScheduleLock | LeaseLock


@dataclass(frozen=True)
class LockSession:
    """What ``acquire_locks`` yields.

    ``lease_lost`` is the lease's loss event, for work that wants to stop at a
    safe point; it is None without a lease lock or under ``CONTINUE``.
    """

    locks: tuple[Lock, ...]
    lease_lost: Event | None = None

    @property
    def lease(self) -> LeaseLock | None:
        return next((lock for lock in self.locks if isinstance(lock, LeaseLock)), None)

    @property
    def fencing_token(self) -> int | None:
        """The token to pass along with writes (``LockContext.fencing``): the lease's,
        or the schedule slot's when there is no lease; None without fencing."""
        return self.locks[-1].fence if self.locks else None


def build_locks(context: LockContext, strategies: str | Iterable[str]) -> list[Lock]:
    """The locks for ``strategies``, in acquisition order (schedule first)."""
    return [
        ScheduleLock(context) if name == SCHEDULE else LeaseLock(context)
        for name in normalize_strategies(strategies)
    ]


@asynccontextmanager
async def acquire_locks(
    context: LockContext, strategies: str | Iterable[str] = (SCHEDULE,)
) -> AsyncIterator[LockSession]:
    """Enter every lock of ``strategies`` in order, after the startup jitter, and
    release them in reverse order on exit."""
    locks = build_locks(context, strategies)
    delay = jitter_delay(context.jitter_max_seconds)
    if delay:
        logger.debug("sleeping %.3f s of startup jitter", delay)
        await sleep(delay)
    async with AsyncExitStack() as stack:
        for lock in locks:
            await stack.enter_async_context(lock)
        lease = next((lock for lock in locks if isinstance(lock, LeaseLock)), None)
        watch = lease is not None and context.lease_loss_policy is LeaseLossPolicy.TERMINATE
        yield LockSession(
            locks=tuple(locks), lease_lost=lease.lease_lost if watch and lease else None
        )

# GENERATED from dislock-aio's dislock/aio/_locks.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""Schedule and lease locks as context managers, and ``acquire_locks``.

The asyncio module ``dislock/aio/_locks.py`` is the hand-written source; the sync
``dislock/_sync/_locks.py`` is generated from it by ``tools/async_to_sync.py``.
Write the source so that dropping ``async``/``await`` (and the renames that tool
lists) gives correct blocking code: concurrency goes through ``._compat``,
decisions through ``dislock.core``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from time import monotonic
from types import TracebackType
from typing import Any

from psycopg import Connection
from psycopg.rows import TupleRow
from psycopg.sql import Composed

from dislock.core import sql
from dislock.core.config import SCHEDULE, normalize_strategies
from dislock.core.context import LeaseLossPolicy, LockContext
from dislock.core.cron import next_boundary
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


def connect(context: LockContext) -> Connection[TupleRow]:
    """A connection for lock statements: autocommit, no prepared statements."""
    return Connection.connect(
        context.url, **connection_kwargs(context.url, context.connect_timeout_seconds)
    )


def acquire(
    conn: Connection[TupleRow], statement: Composed, params: dict[str, Any]
) -> tuple[bool, int | None]:
    """Run an acquiring upsert: whether it took the row, and the fencing token."""
    cursor = conn.execute(statement, params)
    row = cursor.fetchone()
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

    def __enter__(self) -> ScheduleLock:
        context = self.context
        statements = sql.statements_for(context)
        with connect(context) as conn:
            expires_at = context.next_run_time
            if expires_at is None:
                assert context.schedule is not None
                cursor = conn.execute(statements.now)
                row = cursor.fetchone()
                assert row is not None
                expires_at = next_boundary(context.schedule, row[0])
            acquired, fence = acquire(
                conn,
                statements.acquire_until,
                sql.acquire_until_params(self.key, context.owner, expires_at),
            )
        if not acquired:
            raise LockNotAcquiredError(
                f"schedule slot of {context.lock_key!r} ending {expires_at.isoformat()} "
                "was already started by another owner"
            )
        self.expires_at = expires_at
        self.fence = fence
        logger.info("acquired schedule slot %s until %s", self.key, expires_at.isoformat())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class LeaseLock:
    """One holder at a time, for as long as the block runs.

    Entering inserts a row that expires ``run_ttl_seconds`` from now (or takes
    over an expired one) and starts a renewer that extends it every
    ``lease_interval_seconds``, guarded by the owner token.  ``lease_lost`` is set
    as soon as the renewer can no longer vouch for the lease.  Leaving stops the
    renewer and expires the row through a second connection, unless the lease was
    lost (the row may belong to someone else by then).
    """

    def __init__(self, context: LockContext) -> None:
        self.settings = LeaseSettings.from_context(context)
        self.context = context
        self.key = sql.lease_key(context.lock_key)
        self.lease_lost = Event()
        self.fence: int | None = None
        """The fencing token of this acquisition (with ``LockContext.fencing``)."""
        self._clock: LeaseClock | None = None
        self._conn: Connection[TupleRow] | None = None
        self._stop = Event()
        self._workers: tuple[Worker, ...] = ()

    @property
    def clock(self) -> LeaseClock | None:
        """The lease's renewal bookkeeping while it is held."""
        return self._clock

    def is_lost(self) -> bool:
        """Whether the lease is lost, counting a local deadline that passed while
        a renewal was still waiting for the server."""
        if self._clock is not None and self._clock.expired(monotonic()):
            self._declare_lost()
        return self.lease_lost.is_set()

    def __enter__(self) -> LeaseLock:
        if self._clock is not None:
            raise RuntimeError("this LeaseLock is already held; create one per acquisition")
        context = self.context
        conn = connect(context)
        try:
            sent_at = monotonic()
            acquired, fence = acquire(
                conn,
                sql.statements_for(context).acquire_for,
                sql.lease_params(self.key, context.owner, self.settings.ttl),
            )
        except BaseException:
            conn.close()
            raise
        if not acquired:
            conn.close()
            raise LockNotAcquiredError(f"lease {self.key!r} is held by another owner")
        self._conn = conn
        self.fence = fence
        self._clock = LeaseClock(self.settings, acquired_at=sent_at)
        self._stop.clear()
        self.lease_lost.clear()
        self._workers = (
            spawn(self._renew_until_stopped, f"dislock-renewer:{self.key}"),
            spawn(self._watch_deadline, f"dislock-deadline:{self.key}"),
        )
        logger.info("acquired lease %s for %g s", self.key, self.settings.ttl)
        return self

    def _renew_until_stopped(self) -> None:
        clock, conn = self._clock, self._conn
        assert clock is not None
        statement = sql.statements_for(self.context).renew
        params = sql.lease_params(self.key, self.context.owner, self.settings.ttl)
        try:
            while not wait_event(self._stop, clock.delay_until_renewal(monotonic())):
                sent_at = monotonic()
                try:
                    if conn is None:
                        conn = connect(self.context)
                    cursor = execute_within(
                        conn, statement, params, clock.attempt_timeout(monotonic())
                    )
                    held = clock.renewed(sent_at=sent_at, now=monotonic(), rows=cursor.rowcount)
                except Exception as exc:
                    held = clock.failed(exc, now=monotonic())
                    if held:
                        logger.warning(
                            "renewal of lease %s failed, retrying until its deadline: %s",
                            self.key,
                            clock.last_error,
                        )
                    if conn is not None and (
                        conn.broken or conn.closed or isinstance(exc, StatementTimeout)
                    ):
                        conn.close()
                        conn = None  # reconnect on the next attempt
                if not held:
                    self._declare_lost()
                    return
                logger.debug("renewed lease %s", self.key)
        finally:
            if conn is not None:
                conn.close()

    def _watch_deadline(self) -> None:
        """Declare the lease lost when its local deadline passes, whatever the renewer
        is doing: a renewal can hang on a dead network far longer than the TTL."""
        clock = self._clock
        assert clock is not None
        while not wait_event(self._stop, clock.until_deadline(monotonic())):
            if clock.expired(monotonic()):
                self._declare_lost()
                return

    def _declare_lost(self) -> None:
        if not self.lease_lost.is_set():
            assert self._clock is not None
            logger.warning("lease %s lost: %s", self.key, self._clock.lost_reason)
            self.lease_lost.set()

    def _expire_row(self) -> None:
        statement = sql.statements_for(self.context).release
        try:
            with connect(self.context) as conn:
                execute_within(
                    conn,
                    statement,
                    sql.release_params(self.key, self.context.owner),
                    RELEASE_TIMEOUT,
                )
        except Exception as exc:
            logger.warning(
                "could not release lease %s (it expires by itself within %g s): %s",
                self.key,
                self.settings.ttl,
                exc,
            )
        else:
            logger.info("released lease %s", self.key)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        workers, clock = self._workers, self._clock
        assert workers and clock is not None, "LeaseLock exited without entering"
        self._stop.set()
        renewer, watchdog = workers
        if not stop_worker(renewer, RENEWER_STOP_TIMEOUT):
            # Still inside a statement: what it last did to the row is unknown.
            clock.lose("the renewer did not stop in time")
        stop_worker(watchdog, RENEWER_STOP_TIMEOUT)
        lost = self.is_lost()
        if lost:
            self.lease_lost.set()
        else:
            self._expire_row()
        self._workers = ()
        self._clock = None
        self._conn = None
        if lost and self.settings.policy is LeaseLossPolicy.CONTINUE:
            logger.warning("lease %s was lost during the block (policy: continue)", self.key)
        if raises_on_exit(self.settings.policy, lost=lost, block_failed=exc_type is not None):
            raise LeaseLostError(
                f"lease {self.key!r} was lost while the block ran: {clock.lost_reason}"
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


@contextmanager
def acquire_locks(
    context: LockContext, strategies: str | Iterable[str] = (SCHEDULE,)
) -> Iterator[LockSession]:
    """Enter every lock of ``strategies`` in order, after the startup jitter, and
    release them in reverse order on exit."""
    locks = build_locks(context, strategies)
    delay = jitter_delay(context.jitter_max_seconds)
    if delay:
        logger.debug("sleeping %.3f s of startup jitter", delay)
        sleep(delay)
    with ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        lease = next((lock for lock in locks if isinstance(lock, LeaseLock)), None)
        watch = lease is not None and context.lease_loss_policy is LeaseLossPolicy.TERMINATE
        yield LockSession(
            locks=tuple(locks), lease_lost=lease.lease_lost if watch and lease else None
        )

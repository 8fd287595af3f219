"""The thread-based side of the concurrency primitives the lock code is written against.

Same names as ``dislock.aio._compat``, over threads and blocking calls, so that the
modules generated from the asyncio ones run unchanged here.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any, ParamSpec, TypeAlias, TypeVar

from psycopg import Connection, Cursor, errors
from psycopg.rows import TupleRow
from psycopg.sql import SQL, Composed

from dislock.core.errors import Interrupted, NotSent, StatementTimeout
from dislock.core.exchange import Rendered
from dislock.core.failover import unconfirmed, unreplicated_notice
from dislock.core.hub_state import Registry
from dislock.core.supervision import SignalRoute
from dislock.core.timeouts import CANCEL_GRACE, STATEMENT_FLOOR, STUCK_AFTER

LOCK_POLL = 0.05
"""How often a statement waiting for the shared connection checks that the one
ahead of it is not stuck."""


class Event(threading.Event):
    """A ``threading.Event`` that also sets the events linked to it, so that a
    thread can wait for the first of several things (a lease's loss or its
    command's exit) on one event."""

    def __init__(self) -> None:
        super().__init__()
        self._linked: list[threading.Event] = []

    def link(self, other: threading.Event) -> None:
        """Set ``other`` whenever this event is set (now, if it is already)."""
        if not any(linked is other for linked in self._linked):
            self._linked.append(other)
        if self.is_set():
            other.set()

    def set(self) -> None:
        super().set()
        for other in tuple(self._linked):
            other.set()


Lock = threading.Lock
Worker = threading.Thread
T = TypeVar("T")
P = ParamSpec("P")

Takes: TypeAlias = Callable[P, T]
"""A function the lock code calls (one decorated, a waiter's try): any function, here."""
Gives: TypeAlias = Callable[P, T]
"""A decorated function: the same kind, here."""

sleep = time.sleep


def to_thread(function: Callable[[], T]) -> T:
    """``function()`` (the asyncio twin runs it in a thread; here, blocking is fine)."""
    return function()


_registry = Registry()
_inherited: list[Registry] = []


def local_registry() -> Registry:
    """One registry for the whole process."""
    return _registry


def _forget_parent_connections() -> None:
    # A forked child must open connections of its own: sharing the parent's
    # socket would interleave two processes' statements.  The parent's objects
    # are set aside, never closed (closing would end the parent's session), and
    # the registry's lock, which another thread may have held at the fork, is
    # replaced with the registry.
    global _registry
    _inherited.append(_registry)
    _registry = Registry()


os.register_at_fork(after_in_child=_forget_parent_connections)


def spawn(target: Callable[[], None], name: str) -> Worker:
    """Run ``target`` concurrently (a daemon thread, so it never blocks exit)."""
    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    return worker


def wait_event(event: Event, timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds (None: for ever) for ``event``; whether it is set."""
    return event.wait(timeout)


class _Canceller:
    """Cancels the statement running on one connection once it overruns.

    One thread per connection, started on first use and asleep unless a
    statement runs long, rather than a timer thread per statement: starting a
    thread costs more than the round trip of a lock statement.
    """

    def __init__(self, conn: Connection[TupleRow]) -> None:
        self._conn = conn
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._wakes_at = math.inf  # when the thread looks at the deadline next
        self._closed = False
        self._started = False
        self.overdue_at = math.inf
        """When the statement being cancelled counts as stuck, if it has not ended."""

    def arm(self, timeout: float) -> None:
        with self._cond:
            self.overdue_at = math.inf
            self._deadline = time.monotonic() + timeout
            if not self._started:
                self._started = True
                threading.Thread(target=self._run, name="dislock-canceller", daemon=True).start()
            elif self._deadline < self._wakes_at:
                self._cond.notify()

    def disarm(self) -> None:
        # Waits for a cancel being sent, so that it cannot hit the next statement.
        with self._cond:
            self._deadline = None
            self.overdue_at = math.inf

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                deadline = self._deadline
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self._deadline = None
                    self.overdue_at = now + STUCK_AFTER
                    # A cancel request stuck on a dead network gives up after a
                    # while; the statement is then left to the hub (``overdue``).
                    with contextlib.suppress(Exception):
                        self._conn.cancel_safe(timeout=CANCEL_GRACE)
                    continue
                self._wakes_at = math.inf if deadline is None else deadline
                self._cond.wait(None if deadline is None else deadline - now)


class Link:
    """A connection shared by every lock of the process, one statement at a time.

    The lock matters for cancellation: a statement that runs too long is
    cancelled with ``cancel_safe``, which cancels whatever the connection is
    running, so nothing else may be running on it.  A retired connection is
    closed only once no statement is using it: closing it under a running
    statement would free libpq's connection while another thread reads from it.
    """

    def __init__(self, conn: Connection[TupleRow]) -> None:
        self.conn = conn
        self.retired = False
        self._lock = threading.Lock()
        self._canceller = _Canceller(conn)
        self._render = Rendered(conn)
        self._unreplicated: str | None = None
        conn.add_notice_handler(self._notice)

    def _notice(self, diag: Any) -> None:
        # Called in the thread running the statement, while it holds the lock.
        message = unreplicated_notice(diag)
        if message is not None:
            self._unreplicated = message

    @property
    def idle(self) -> bool:
        return not self._lock.locked()

    @property
    def overdue(self) -> bool:
        """Whether the statement running on it outlived its cancellation: the
        connection is presumed dead, and nothing more should queue behind it."""
        return time.monotonic() >= self._canceller.overdue_at

    def execute(
        self, query: Composed | SQL, params: dict[str, Any], timeout: float
    ) -> Cursor[TupleRow]:
        """Run one statement, cancelling it on the server after ``timeout`` seconds
        (counting the wait for the connection).  Raises ``NotSent`` if the
        statement ahead of it turns out stuck, so that it can go elsewhere."""
        started = time.monotonic()
        while not self._lock.acquire(timeout=min(LOCK_POLL, timeout)):
            if self.overdue:
                raise NotSent("the shared connection is stuck in a statement")
            if time.monotonic() - started >= timeout:
                raise StatementTimeout(f"the shared connection stayed busy for {timeout:.2f} s")
        try:
            self._unreplicated = None
            self._canceller.arm(max(STATEMENT_FLOOR, timeout - (time.monotonic() - started)))
            try:
                cursor = self.conn.execute(self._render(query), params)
            finally:
                self._canceller.disarm()
            if self._unreplicated is not None:
                # A cancel (ours or anyone's) ended its wait for the standbys.
                raise unconfirmed(self._unreplicated)
            return cursor
        except errors.QueryCanceled:
            raise StatementTimeout(f"no answer within {timeout:.2f} s; cancelled") from None
        finally:
            if self.retired:
                self._close()
            self._lock.release()

    def retire(self) -> None:
        self.retired = True
        if self._lock.acquire(blocking=False):
            try:
                self._close()
            finally:
                self._lock.release()

    def _close(self) -> None:
        self._canceller.close()
        self.conn.close()


def stop_worker(worker: Worker, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``worker`` to finish; returns whether it did.

    A thread cannot be cancelled: one still running is left to finish on its
    own (it is a daemon), and the caller must not trust what it last did.
    """
    worker.join(timeout)
    return not worker.is_alive()


class Child:
    """A command started as the leader of a session (and process group) of its own."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self.pid = process.pid
        self.group = process.pid
        """The process group to signal and watch: the command's and its children's."""
        self._wake: threading.Event | None = None

    @property
    def returncode(self) -> int | None:
        """The raw return code once it has exited (negative: killed by that signal)."""
        return self._process.returncode

    @classmethod
    def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        preexec_fn: Callable[[], None] | None,
        output: tuple[int, int] | None = None,
    ) -> Child:
        """``output``: the descriptors for its stdout and stderr (None: ours)."""
        out, err = output or (None, None)
        process = subprocess.Popen(
            argv, env=env, start_new_session=True, preexec_fn=preexec_fn, stdout=out, stderr=err
        )
        return cls(process)

    def wait(self, timeout: float | None) -> int | None:
        """The child's return code, or None if it is still running after ``timeout``."""
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def wait_or(self, event: Event, timeout: float | None) -> int | None:
        """The child's return code once it exits, or None as soon as ``event`` is
        set or ``timeout`` passes."""
        wake = self._wake
        if wake is None:
            # A thread waits for the child, so that this one can wait for the
            # child's exit and the event at once, on one event.
            wake = self._wake = threading.Event()
            threading.Thread(
                target=self._wait_then_set, args=(wake,), name="dislock-child", daemon=True
            ).start()
        event.link(wake)
        if not event.is_set():
            wake.wait(timeout)
        return self._process.poll()

    def _wait_then_set(self, wake: threading.Event) -> None:
        self._process.wait()
        wake.set()


@contextlib.contextmanager
def handling_signals(signals: Iterable[int], handler: Callable[[int], None]) -> Iterator[None]:
    """Call ``handler(signum)`` for each of ``signals`` while the block runs.

    Python runs signal handlers in the main thread only; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        handler(signum)

    previous: dict[int, Any] = {}
    try:
        for signum in signals:
            previous[signum] = signal.signal(signum, on_signal)
        yield
    finally:
        for signum, old in previous.items():
            # None: a handler installed outside Python, which cannot be put back.
            signal.signal(signum, signal.SIG_DFL if old is None else old)


def interrupter() -> Callable[[int], None]:
    """What a signal calls to end the wait for the locks: it raises
    ``Interrupted(signum)`` in the main thread, interrupting whatever blocks there
    (a sleep, a wait for a notification, a statement, which psycopg then cancels)."""

    def interrupt(signum: int) -> None:
        raise Interrupted(signum)

    return interrupt


@contextlib.contextmanager
def interrupting(route: SignalRoute) -> Iterator[None]:
    """The wait for the locks (which ``interrupter`` ends); once it is over,
    ``route`` keeps signals for the command."""
    try:
        yield
    finally:
        route.locks_held()


class LossGuard:
    """The asyncio flavour's guard cancels a block's task once its lease is lost
    or its maximum runtime is over; a thread cannot be interrupted safely, so this
    one never intervenes: the loss (``LeaseLostError``) or the bound
    (``MaxRuntimeExceeded``, ``out_of_time``) is reported as the block ends."""

    def __init__(self, lost: Event, stop_at: float | None = None) -> None:
        del lost
        self._stop_at = stop_at
        self.out_of_time = False

    def stop(self, exc_type: type[BaseException] | None) -> bool:
        del exc_type
        self.out_of_time = self._stop_at is not None and time.monotonic() >= self._stop_at
        return False

    def finish(self) -> None:
        return None

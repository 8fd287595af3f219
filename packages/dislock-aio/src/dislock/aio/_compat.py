"""The asyncio side of the concurrency primitives the lock code is written against.

``dislock._sync._compat`` offers the same names over threads and blocking calls, so
that ``tools/async_to_sync.py`` makes the sync modules by dropping ``async``/``await``;
mypy checks them against it (a name or a signature it lacks fails there).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, ParamSpec, TypeAlias, TypeVar

from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import TupleRow
from psycopg.sql import SQL, Composed

from dislock.core.errors import Interrupted, StatementTimeout
from dislock.core.exchange import Rendered
from dislock.core.failover import unconfirmed, unreplicated_notice
from dislock.core.hub_state import Registry
from dislock.core.supervision import SignalRoute
from dislock.core.timeouts import CANCEL_GRACE, STUCK_AFTER

T = TypeVar("T")
P = ParamSpec("P")

Takes: TypeAlias = Callable[P, Awaitable[T]]
"""A function the lock code awaits (one decorated, a waiter's try): a coroutine function, here."""
Gives: TypeAlias = Callable[P, Coroutine[Any, Any, T]]
"""A decorated function: a coroutine function, here."""

Event = asyncio.Event
Lock = asyncio.Lock
Worker = asyncio.Task[None]
sleep = asyncio.sleep
to_thread = asyncio.to_thread  # for a call that blocks: the loop goes on meanwhile


_registries = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Registry]()


def local_registry() -> Registry:
    """One registry per event loop, since an asyncio connection belongs to the
    loop that opened it."""
    loop = asyncio.get_running_loop()
    registry = _registries.get(loop)
    if registry is None:
        registry = _registries[loop] = Registry()
    return registry


def spawn(target: Callable[[], Coroutine[Any, Any, None]], name: str) -> Worker:
    """Run ``target`` concurrently (an asyncio task)."""
    return asyncio.get_running_loop().create_task(target(), name=name)


async def wait_event(event: Event, timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds (None: for ever) for ``event``; whether it is set."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


class Link:
    """A connection shared by every lock of the event loop.  psycopg already runs one
    statement at a time on it and cancels the one whose task is cancelled; what this
    adds is that a retired connection is closed only once no statement is using it
    (closing it under a waiting task would leave that task watching a file descriptor
    the next connection may reuse)."""

    def __init__(self, conn: AsyncConnection[TupleRow]) -> None:
        self.conn = conn
        self.retired = False
        self._deadlines: list[float] = []  # of the statements using it now
        self._render = Rendered(conn)
        # Notices arrive for the statement running, but psycopg's own queue would
        # let the next statement start before this one looks: one at a time here.
        self._serial = asyncio.Lock()
        self._unreplicated: list[str] = []  # what the running statement was told
        conn.add_notice_handler(self._notice)

    def _notice(self, diag: Any) -> None:
        message = unreplicated_notice(diag)
        if message is not None:
            self._unreplicated.append(message)

    @property
    def idle(self) -> bool:
        return not self._deadlines

    @property
    def overdue(self) -> bool:
        """Whether a statement on it outlived its cancellation: the connection is
        presumed dead, and nothing more should queue behind it."""
        return bool(self._deadlines) and time.monotonic() >= min(self._deadlines) + STUCK_AFTER

    async def execute(
        self, query: Composed | SQL, params: dict[str, Any], timeout: float
    ) -> AsyncCursor[TupleRow]:
        """Run one statement, cancelling it (on the server too) after ``timeout``
        seconds, counting the wait for the connection."""
        deadline = time.monotonic() + timeout
        self._deadlines.append(deadline)
        unreplicated: list[str] = []
        try:
            # asyncio.timeout runs the statement in this task: no task per statement.
            async with asyncio.timeout(timeout), self._serial:
                self._unreplicated.clear()
                try:
                    cursor = await self.conn.execute(self._render(query), params)
                finally:
                    # Also when cancelled: psycopg reads the statement's end first.
                    unreplicated.extend(self._unreplicated)
        except TimeoutError:
            if unreplicated:  # the cancel ended a wait for the standbys: it committed
                raise unconfirmed(unreplicated[0]) from None
            raise StatementTimeout(f"no answer within {timeout:.2f} s; cancelled") from None
        else:
            if unreplicated:
                raise unconfirmed(unreplicated[0])
            return cursor
        finally:
            self._deadlines.remove(deadline)
            if self.retired and not self._deadlines:
                await self.conn.close()

    async def retire(self) -> None:
        self.retired = True
        if not self._deadlines:
            await self.conn.close()


async def stop_worker(worker: Worker, timeout: float) -> bool:
    """Wait for ``worker`` to finish, cancelling it after ``timeout``; whether it
    finished on its own (if not, it may have been mid-statement: do not trust what
    it last did)."""
    try:
        await asyncio.wait_for(asyncio.shield(worker), timeout)
    except TimeoutError:
        worker.cancel()
        # Cancelling a query sends a cancel request, which a dead network can
        # hold up too: give it a moment, then leave the task to finish alone.
        await asyncio.wait({worker}, timeout=CANCEL_GRACE)
        return False
    except asyncio.CancelledError:
        # We are being cancelled ourselves: never leave the worker behind.
        worker.cancel()
        raise
    return True


class Child:
    """A command started as the leader of a session (and process group) of its own."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.pid = process.pid
        self.group = process.pid
        """The process group to signal and watch: the command's and its children's."""
        self._exit: asyncio.Task[int] | None = None

    @property
    def returncode(self) -> int | None:
        """The raw return code once it has exited (negative: killed by that signal)."""
        return self._process.returncode

    @classmethod
    async def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        preexec_fn: Callable[[], None] | None,
        output: tuple[int, int] | None = None,
    ) -> Child:
        """``output``: the descriptors for its stdout and stderr (None: ours)."""
        out, err = output or (None, None)
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, start_new_session=True, preexec_fn=preexec_fn, stdout=out, stderr=err
        )
        return cls(process)

    async def wait(self, timeout: float | None) -> int | None:
        """The child's return code, or None if it is still running after ``timeout``."""
        try:
            return await asyncio.wait_for(self._process.wait(), timeout)
        except TimeoutError:
            return None

    async def wait_or(self, event: Event, timeout: float | None) -> int | None:
        """The child's return code once it exits, or None as soon as ``event`` is
        set or ``timeout`` passes."""
        if self._exit is None:
            self._exit = asyncio.ensure_future(self._process.wait())
        if not event.is_set() and not self._exit.done():
            woken = asyncio.ensure_future(event.wait())
            try:
                await asyncio.wait(
                    {self._exit, woken}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                woken.cancel()
        return self._exit.result() if self._exit.done() else None


@contextlib.contextmanager
def handling_signals(signals: Iterable[int], handler: Callable[[int], None]) -> Iterator[None]:
    """Call ``handler(signum)`` for each of ``signals`` while the block runs (only a
    loop in the main thread can handle signals; elsewhere this does nothing)."""
    loop = asyncio.get_running_loop()
    previous: dict[int, Any] = {}
    try:
        for signum in signals:
            before = signal.getsignal(signum)
            try:
                loop.add_signal_handler(signum, handler, signum)
            except (RuntimeError, ValueError, NotImplementedError):
                continue
            previous[signum] = before
        yield
    finally:
        for signum, before in previous.items():
            loop.remove_signal_handler(signum)
            # remove_signal_handler resets to the default; give back what was there.
            if before is not None:
                signal.signal(signum, before)


def interrupter() -> Callable[[int], None]:
    """What a signal calls to end the wait for the locks: it cancels the current
    task (``interrupting`` turns the cancellation into ``Interrupted``)."""
    task = asyncio.current_task()

    def interrupt(signum: int) -> None:
        if task is not None:
            task.cancel()

    return interrupt


@contextlib.asynccontextmanager
async def interrupting(route: SignalRoute) -> AsyncIterator[None]:
    """The wait for the locks, ended with ``Interrupted(signum)`` as soon as a
    signal interrupts it (``route.fired``); once it is over, ``route`` keeps
    signals for the command."""
    task = asyncio.current_task()
    try:
        yield
        if route.fired is not None:
            # The signal came as the block ended: take the cancellation now,
            # rather than let it hit the next await of whoever runs after.
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        if route.fired is None:
            raise
        if task is not None:
            task.uncancel()
        raise Interrupted(route.fired) from None
    finally:
        route.locks_held()


class LossGuard:
    """Cancels the task running a guarded block once its lease is lost, or at
    ``stop_at`` (monotonic), the end of its maximum runtime; created as the block
    starts, in the task that runs it, and stopped (``stop``) as it ends.  (The sync
    flavour's guard only tells: a thread cannot be interrupted safely.)"""

    def __init__(self, lost: Event, stop_at: float | None = None) -> None:
        self._task = asyncio.current_task()
        self._fired = False
        self.out_of_time = False
        self._watcher: asyncio.Task[None] | None = None
        if self._task is not None:
            self._watcher = spawn(lambda: self._watch(lost, stop_at), "dislock-loss-guard")

    async def _watch(self, lost: Event, stop_at: float | None) -> None:
        timeout = None if stop_at is None else max(0.0, stop_at - time.monotonic())
        if not await wait_event(lost, timeout):
            self.out_of_time = True
        assert self._task is not None
        # False once the task is done: a block entered by a task that has finished
        # (the lock handed to another task) is not cancelled.
        self._fired = self._task.cancel()

    def stop(self, exc_type: type[BaseException] | None) -> bool:
        """Stop watching, as the block ends with ``exc_type``; whether the block was
        ended by the guard's cancellation alone (or swallowed it), so that the caller
        is to raise ``LeaseLostError`` or ``MaxRuntimeExceeded``.  Another
        cancellation of the task still stands, and another exception from the
        block is not masked: False."""
        if self._watcher is not None:
            self._watcher.cancel()
        if not self._fired or asyncio.current_task() is not self._task:
            return False
        self._fired = False
        assert self._task is not None
        if self._task.uncancel() > 0:
            return False
        return exc_type is None or issubclass(exc_type, asyncio.CancelledError)

    async def finish(self) -> None:
        """Wait until the watcher has stopped, so that no task outlives the block."""
        if self._watcher is not None:
            await asyncio.wait({self._watcher})

"""The asyncio side of the concurrency primitives the lock code is written against.

``dislock._sync._compat`` offers the same names over threads and blocking calls,
which is what lets ``tools/async_to_sync.py`` turn the asyncio modules of this
package into the sync ones by dropping ``async``/``await``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any

from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import TupleRow
from psycopg.sql import Composed

from dislock.core.errors import StatementTimeout

CANCEL_GRACE = 1.0
"""Seconds a cancelled worker gets to wind down before it is left behind."""

Event = asyncio.Event
Worker = asyncio.Task[None]
sleep = asyncio.sleep


def spawn(target: Callable[[], Coroutine[Any, Any, None]], name: str) -> Worker:
    """Run ``target`` concurrently (an asyncio task)."""
    return asyncio.get_running_loop().create_task(target(), name=name)


async def wait_event(event: Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; returns whether it is set."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return False
    return True


async def execute_within(
    conn: AsyncConnection[TupleRow], query: Composed, params: dict[str, Any], timeout: float
) -> AsyncCursor[TupleRow]:
    """Run one statement, cancelling it (on the server too) after ``timeout`` seconds."""
    try:
        return await asyncio.wait_for(conn.execute(query, params), timeout)
    except asyncio.TimeoutError:
        raise StatementTimeout(f"no answer within {timeout:.2f} s; cancelled") from None


async def stop_worker(worker: Worker, timeout: float) -> bool:
    """Wait for ``worker`` to finish; cancel it after ``timeout``.

    Returns whether it finished on its own.  A worker cancelled here may have
    been mid-statement, so the caller must not trust what it last did.
    """
    try:
        await asyncio.wait_for(asyncio.shield(worker), timeout)
    except asyncio.TimeoutError:
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
    """A command started in its own process group."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.pid = process.pid

    @classmethod
    async def start(
        cls, argv: list[str], env: dict[str, str], preexec_fn: Callable[[], None] | None
    ) -> Child:
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, start_new_session=True, preexec_fn=preexec_fn
        )
        return cls(process)

    async def wait(self, timeout: float | None) -> int | None:
        """The child's return code, or None if it is still running after ``timeout``."""
        try:
            return await asyncio.wait_for(self._process.wait(), timeout)
        except asyncio.TimeoutError:
            return None


@contextlib.contextmanager
def handling_signals(signals: Iterable[int], handler: Callable[[int], None]) -> Iterator[None]:
    """Call ``handler(signum)`` for each of ``signals`` while the block runs.

    Only a loop in the main thread can handle signals; elsewhere this does nothing.
    """
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

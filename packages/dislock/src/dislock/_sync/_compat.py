"""The thread-based side of the concurrency primitives the lock code is written against.

Same names as ``dislock.aio._compat``, over threads and blocking calls, so that the
modules generated from the asyncio ones run unchanged here.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

from psycopg import Connection, Cursor, errors
from psycopg.rows import TupleRow
from psycopg.sql import Composed

from dislock.core.errors import StatementTimeout

Event = threading.Event
Worker = threading.Thread
sleep = time.sleep


def spawn(target: Callable[[], None], name: str) -> Worker:
    """Run ``target`` concurrently (a daemon thread, so it never blocks exit)."""
    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    return worker


def wait_event(event: Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; returns whether it is set."""
    return event.wait(timeout)


def execute_within(
    conn: Connection[TupleRow], query: Composed, params: dict[str, Any], timeout: float
) -> Cursor[TupleRow]:
    """Run one statement, cancelling it on the server after ``timeout`` seconds."""
    timer = threading.Timer(timeout, conn.cancel_safe)
    timer.daemon = True  # a cancel request stuck on a dead network must not block exit
    timer.start()
    try:
        return conn.execute(query, params)
    except errors.QueryCanceled:
        raise StatementTimeout(f"no answer within {timeout:.2f} s; cancelled") from None
    finally:
        timer.cancel()


def stop_worker(worker: Worker, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``worker`` to finish; returns whether it did.

    A thread cannot be cancelled: one still running is left to finish on its
    own (it is a daemon), and the caller must not trust what it last did.
    """
    worker.join(timeout)
    return not worker.is_alive()


class Child:
    """A command started in its own process group."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self.pid = process.pid

    @classmethod
    def start(
        cls, argv: list[str], env: dict[str, str], preexec_fn: Callable[[], None] | None
    ) -> Child:
        return cls(subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=preexec_fn))

    def wait(self, timeout: float | None) -> int | None:
        """The child's return code, or None if it is still running after ``timeout``."""
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


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

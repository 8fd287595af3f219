"""Waiting for a condition to come true: ``eventually`` (and ``eventually_async``),
the suite's one polling loop, and ``wait_for``, a marker file's appearing.

The timeouts are generous because this machine and CI's are loaded (CI runs two
CPU burners beside the suite): a condition that is going to come true does so
long before the timeout, and one that is not fails with ``message`` instead of
hanging the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TIMEOUT = 30.0
INTERVAL = 0.02


def eventually(
    predicate: Callable[[], T | None],
    timeout: float = TIMEOUT,
    interval: float = INTERVAL,
    message: str | Callable[[], str] = "the condition did not come true",
) -> T:
    """``predicate()``'s first truthy answer, asking every ``interval`` seconds;
    AssertionError with ``message`` (called, if it is a function, for what it
    knows at the end) once ``timeout`` seconds have gone without one."""
    deadline = time.monotonic() + timeout
    while True:
        answer = predicate()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"{_text(message)} (within {timeout} s)")
        time.sleep(interval)


async def eventually_async(
    predicate: Callable[[], T | None],
    timeout: float = TIMEOUT,
    interval: float = INTERVAL,
    message: str | Callable[[], str] = "the condition did not come true",
) -> T:
    """``eventually`` for asyncio tests: the event loop goes on running (the lock's
    own tasks with it) between the questions."""
    deadline = time.monotonic() + timeout
    while True:
        answer = predicate()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"{_text(message)} (within {timeout} s)")
        await asyncio.sleep(interval)


def wait_for(path: Path, timeout: float = TIMEOUT) -> None:
    """Wait for the file ``path`` (a marker a child process writes) to exist."""
    eventually(path.exists, timeout=timeout, message=f"{path} did not appear")


def _text(message: str | Callable[[], str]) -> str:
    return message if isinstance(message, str) else message()

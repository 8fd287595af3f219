# GENERATED from dislock-aio's dislock/aio/_compat_api.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""What a flavour's ``_compat`` module must provide the lock code, as protocols.

The lock modules are written once and generated into the sync flavour, so both
``_compat`` modules offer the same names with the same shapes, differing only in
whether a call waits on a loop or blocks its thread.  ``Compat`` is that list;
each ``_compat`` checks itself against its flavour's copy in its last lines (a
module can implement a protocol), so a name one flavour lacks, or a signature
that drifts, fails mypy rather than a test.

Hand-written in ``dislock/aio/_compat_api.py``; ``dislock/_sync/_compat_api.py`` is
generated from it by ``tools/async_to_sync.py``.  A handle that the lock code only
passes back (a worker) is ``Any`` here: each flavour says what it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from psycopg import Connection, Cursor
from psycopg.rows import TupleRow
from psycopg.sql import SQL, Composed

from dislock.core.sharing import Registry
from dislock.core.supervision import SignalRoute


class Event(Protocol):
    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self) -> bool: ...


class Lock(Protocol):
    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> Any: ...


class Link(Protocol):
    """The shared connection: one statement at a time, each with its time limit."""

    conn: Connection[TupleRow]
    retired: bool

    @property
    def idle(self) -> bool: ...

    @property
    def overdue(self) -> bool: ...

    def execute(
        self, query: Composed | SQL, params: dict[str, Any], timeout: float
    ) -> Cursor[TupleRow]: ...

    def retire(self) -> None: ...


class LinkOpener(Protocol):
    def open(self, url: str, kwargs: dict[str, Any]) -> Link: ...


class Child(Protocol):
    """The wrapped command, leading a process group of its own."""

    pid: int
    group: int

    @property
    def returncode(self) -> int | None: ...

    def wait(self, timeout: float | None) -> int | None: ...

    def wait_or(self, event: Any, timeout: float | None) -> int | None: ...


class ChildStarter(Protocol):
    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        preexec_fn: Callable[[], None] | None,
        output: tuple[int, int] | None = None,
    ) -> Child: ...


class LossGuard(Protocol):
    @property
    def out_of_time(self) -> bool: ...

    def stop(self, exc_type: type[BaseException] | None) -> bool: ...

    def finish(self) -> None: ...


class Compat(Protocol):
    """The names every ``_compat`` module offers."""

    @property
    def Event(self) -> Callable[[], Event]: ...

    @property
    def Lock(self) -> Callable[[], Lock]: ...

    @property
    def Link(self) -> LinkOpener: ...

    @property
    def Child(self) -> ChildStarter: ...

    @property
    def LossGuard(self) -> Callable[[Any, float | None], LossGuard]: ...

    def sleep(self, delay: float, /) -> Any: ...

    def to_thread(self, function: Callable[[], Any], /) -> Any: ...

    def local_registry(self) -> Registry: ...

    def spawn(self, target: Callable[[], Any], name: str) -> Any: ...

    def wait_event(self, event: Any, timeout: float | None) -> bool: ...

    def stop_worker(self, worker: Any, timeout: float) -> bool: ...

    def handling_signals(
        self, signals: Iterable[int], handler: Callable[[int], None]
    ) -> contextlib.AbstractContextManager[None]: ...

    def interrupter(self) -> Callable[[int], None]: ...

    def interrupting(self, route: SignalRoute) -> AbstractContextManager[None]: ...

"""Drivers of the contract suite: one per implementation, one behaviour set for all.

A contract test receives a ``Driver`` and only talks to it, so the same test runs
against the sync API, the asyncio API and (for what it exposes) the CLI.  Each
driver turns "hold these locks", "release them (with this error from the block)"
and "run this command under locks" into its implementation's calls.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, TypeVar

import dislock
import dislock.aio
from dislock import LockContext

T = TypeVar("T")


class Holding(ABC):
    """Locks entered by a driver and not yet released."""

    @abstractmethod
    def lease_lost_event_set(self) -> bool | None:
        """The session's ``lease_lost`` event state; None when the session has none."""

    def wait_lease_lost(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.lease_lost_event_set():
                return True
            time.sleep(0.02)
        return bool(self.lease_lost_event_set())

    @abstractmethod
    def release(self, error: BaseException | None = None) -> None:
        """Leave the locks as a block would: normally, or with ``error`` raised in it.

        Raises whatever leaving raised; if the block's ``error`` was not
        suppressed, it is re-raised here as the block's caller would see it.
        """


class Driver(ABC):
    name: str

    @abstractmethod
    def hold(self, context: LockContext, strategies: Sequence[str]) -> Holding:
        """Enter ``acquire_locks(context, strategies)``."""

    @abstractmethod
    def hold_lock(self, kind: str, context: LockContext) -> Holding:
        """Enter a ``ScheduleLock`` or ``LeaseLock`` (``kind``) directly."""

    @abstractmethod
    def run_with_locks(
        self, argv: Sequence[str], context: LockContext, strategies: Sequence[str]
    ) -> int:
        """The exit status ``run_with_locks`` returns."""

    def close(self) -> None:
        return None


class _SyncHolding(Holding):
    def __init__(self, manager: AbstractContextManager[Any], event: Any) -> None:
        self._manager = manager
        self._event = event

    def lease_lost_event_set(self) -> bool | None:
        return None if self._event is None else bool(self._event.is_set())

    def release(self, error: BaseException | None = None) -> None:
        if error is None:
            self._manager.__exit__(None, None, None)
            return
        if not self._manager.__exit__(type(error), error, error.__traceback__):
            raise error


class SyncDriver(Driver):
    name = "sync"

    def hold(self, context: LockContext, strategies: Sequence[str]) -> Holding:
        manager = dislock.acquire_locks(context, strategies)
        session = manager.__enter__()
        return _SyncHolding(manager, session.lease_lost)

    def hold_lock(self, kind: str, context: LockContext) -> Holding:
        lock: dislock.ScheduleLock | dislock.LeaseLock
        lock = dislock.LeaseLock(context) if kind == "lease" else dislock.ScheduleLock(context)
        lock.__enter__()
        return _SyncHolding(lock, getattr(lock, "lease_lost", None))

    def run_with_locks(
        self, argv: Sequence[str], context: LockContext, strategies: Sequence[str]
    ) -> int:
        return dislock.run_with_locks(argv, context=context, strategies=strategies)


class _AioHolding(Holding):
    def __init__(
        self, driver: AioDriver, manager: AbstractAsyncContextManager[Any], event: Any
    ) -> None:
        self._driver = driver
        self._manager = manager
        self._event = event

    def lease_lost_event_set(self) -> bool | None:
        return None if self._event is None else bool(self._event.is_set())

    def release(self, error: BaseException | None = None) -> None:
        if error is None:
            self._driver.call(self._manager.__aexit__(None, None, None))
            return
        exit_ = self._manager.__aexit__(type(error), error, error.__traceback__)
        if not self._driver.call(exit_):
            raise error


class AioDriver(Driver):
    """Runs the asyncio API on an event loop in a background thread."""

    name = "aio"

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def hold(self, context: LockContext, strategies: Sequence[str]) -> Holding:
        manager = dislock.aio.acquire_locks(context, strategies)
        session = self.call(manager.__aenter__())
        return _AioHolding(self, manager, session.lease_lost)

    def hold_lock(self, kind: str, context: LockContext) -> Holding:
        lock: dislock.aio.ScheduleLock | dislock.aio.LeaseLock

        async def enter() -> None:
            await lock.__aenter__()

        # Built on the loop's thread, like an asyncio program would.
        async def build() -> dislock.aio.ScheduleLock | dislock.aio.LeaseLock:
            if kind == "lease":
                return dislock.aio.LeaseLock(context)
            return dislock.aio.ScheduleLock(context)

        lock = self.call(build())
        self.call(enter())
        return _AioHolding(self, lock, getattr(lock, "lease_lost", None))

    def run_with_locks(
        self, argv: Sequence[str], context: LockContext, strategies: Sequence[str]
    ) -> int:
        return self.call(dislock.aio.run_with_locks(argv, context=context, strategies=strategies))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

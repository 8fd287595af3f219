"""A wrapped run that signals itself in one of its windows:
``python -m tests.support.signal_window FLAVOUR WINDOW URL SCHEMA KEY``.

``starting``: SIGTERM arrives once the locks are held, before the command's
process group exists (sent as the command's environment is prepared); the
command, ``sleep 60``, must get it as soon as it starts.
``releasing``: SIGTERM arrives after the command (``true``) has ended, as the
locks are about to be released; the release must complete.
``lease taken``: SIGTERM arrives as the lease lock's entering returns (the row
taken); ``locks held``: as ``acquire_locks``'s entering returns.  The wait ends
(128 + 15, the command never runs) and the row must be released, not left to
its TTL by an exit that was never registered.

Prints the status ``run_with_locks`` returned.  A signal left to its default
action ends this process instead (exit -15), with the lock row still held.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from dislock import LockContext
from dislock.core.supervision import FORWARDED_SIGNALS


def _signalling_environment(real: Callable[..., dict[str, str]]) -> Callable[..., Any]:
    def environment(*args: Any, **kwargs: Any) -> dict[str, str]:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    return environment


class _SignallingRelease:
    """``acquire_locks(...)`` that sends SIGTERM to this process as its locks are
    about to be released (the command has ended)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def holding(self) -> bool:
        return bool(self._inner.holding)

    def __enter__(self) -> Any:
        return self._inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        return self._inner.__exit__(*exc)

    async def __aenter__(self) -> Any:
        return await self._inner.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.1)
        return await self._inner.__aexit__(*exc)


def _signalling_release(real: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *args: _SignallingRelease(real(*args))


class _SignallingEnter(_SignallingRelease):
    """``acquire_locks(...)`` that sends SIGTERM to this process as its entering
    returns (the locks held)."""

    def __enter__(self) -> Any:
        session = self._inner.__enter__()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs here
        return session

    def __exit__(self, *exc: Any) -> Any:
        return self._inner.__exit__(*exc)

    async def __aenter__(self) -> Any:
        session = await self._inner.__aenter__()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.1)  # the cancellation lands here
        return session

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


def _signalling_enter(real: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *args: _SignallingEnter(real(*args))


def _signal_as_the_lease_is_taken(module: ModuleType) -> None:
    lease = module.LeaseLock
    if hasattr(lease, "__aenter__"):
        real_aenter = lease.__aenter__

        async def aenter(self: Any) -> Any:
            taken = await real_aenter(self)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.1)
            return taken

        lease.__aenter__ = aenter
    else:
        real_enter = lease.__enter__

        def enter(self: Any) -> Any:
            taken = real_enter(self)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            return taken

        lease.__enter__ = enter


def _arrange(supervisor: ModuleType, lease: ModuleType, window: str) -> None:
    if window == "starting":
        _patch(supervisor, "child_environment", _signalling_environment)
    elif window == "releasing":
        _patch(supervisor, "acquire_unguarded", _signalling_release)
    elif window == "locks held":
        _patch(supervisor, "acquire_unguarded", _signalling_enter)
    else:
        _signal_as_the_lease_is_taken(lease)


def _patch(module: ModuleType, name: str, wrap: Callable[[Any], Any]) -> None:
    setattr(module, name, wrap(getattr(module, name)))


def main(flavour: str, window: str, url: str, schema: str, key: str) -> int:
    context = LockContext(
        url=url,
        table_parts=[schema, "key_value"],
        lock_key=key,
        owner=f"signal-window-{os.getpid()}",
        run_ttl_seconds=30,
        lease_interval_seconds=1,
    )
    command = ["sleep", "60"] if window == "starting" else ["true"]
    if flavour == "sync":
        from dislock._sync import _lease as sync_lease
        from dislock._sync import _supervisor as sync

        _arrange(sync, sync_lease, window)
        status = sync.run_with_locks(
            command, context=context, strategies="lease", forward_signals=FORWARDED_SIGNALS
        )
    else:
        from dislock.aio import _lease as aio_lease
        from dislock.aio import _supervisor as aio

        _arrange(aio, aio_lease, window)
        status = asyncio.run(
            aio.run_with_locks(
                command, context=context, strategies="lease", forward_signals=FORWARDED_SIGNALS
            )
        )
    print(status)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

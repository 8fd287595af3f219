"""A wrapped run that signals itself in one of its windows:
``python -m tests.support.signal_window FLAVOUR WINDOW URL SCHEMA KEY``.

``starting``: SIGTERM arrives once the locks are held, before the command's
process group exists (sent as the command's environment is prepared); the
command, ``sleep 60``, must get it as soon as it starts.
``releasing``: SIGTERM arrives after the command (``true``) has ended, as the
locks are about to be released; the release must complete.

Prints the status ``run_with_locks`` returned.  A signal left to its default
action ends this process instead (exit -15), with the lock row still held.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import ModuleType
from typing import Any

from dislock import LockContext
from dislock.core.supervision import FORWARDED_SIGNALS


def _signalling_environment(real: Callable[..., dict[str, str]]) -> Callable[..., Any]:
    def environment(*args: Any) -> dict[str, str]:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args)

    return environment


def _signalling_release(real: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.contextmanager
    def locks(*args: Any) -> Iterator[Any]:
        with real(*args) as session:
            yield session
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)

    return locks


def _signalling_release_aio(real: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def locks(*args: Any) -> AsyncIterator[Any]:
        async with real(*args) as session:
            yield session
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.1)

    return locks


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
        from dislock._sync import _supervisor as sync

        if window == "starting":
            _patch(sync, "child_environment", _signalling_environment)
        else:
            _patch(sync, "acquire_locks", _signalling_release)
        status = sync.run_with_locks(
            command, context=context, strategies="lease", forward_signals=FORWARDED_SIGNALS
        )
    else:
        from dislock.aio import _supervisor as aio

        if window == "starting":
            _patch(aio, "child_environment", _signalling_environment)
        else:
            _patch(aio, "acquire_locks", _signalling_release_aio)
        status = asyncio.run(
            aio.run_with_locks(
                command, context=context, strategies="lease", forward_signals=FORWARDED_SIGNALS
            )
        )
    print(status)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

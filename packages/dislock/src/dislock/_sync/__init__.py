"""dislock's sync API, re-exported by ``dislock`` itself.

``ScheduleLock``, ``LeaseLock``, ``acquire_locks``, ``build_locks`` and
``run_with_locks`` are blocking context managers and functions on
``psycopg.Connection``; the lease is renewed by a daemon thread.  The modules
here are generated from the asyncio ones in ``dislock.aio`` (see
``tools/async_to_sync.py``), apart from ``_compat``.
"""

from dislock._sync._locks import LeaseLock, LockSession, ScheduleLock, acquire_locks, build_locks
from dislock._sync._supervisor import run_with_locks

__all__ = [
    "LeaseLock",
    "LockSession",
    "ScheduleLock",
    "acquire_locks",
    "build_locks",
    "run_with_locks",
]

"""dislock's sync API, re-exported by ``dislock`` itself.

``ScheduleLock``, ``LeaseLock``, ``acquire_locks``, ``build_locks`` and
``run_with_locks`` are blocking context managers and functions on
``psycopg.Connection``.  The locks of a process share one connection per
database and one renewer thread; ``keep_connected`` keeps that connection open
between locks.  The modules
here are generated from the asyncio ones in ``dislock.aio`` (see
``tools/async_to_sync.py``), apart from ``_compat``.
"""

from dislock._sync._hub import keep_connected
from dislock._sync._locks import LeaseLock, LockSession, ScheduleLock, acquire_locks, build_locks
from dislock._sync._supervisor import run_with_locks

__all__ = [
    "LeaseLock",
    "LockSession",
    "ScheduleLock",
    "acquire_locks",
    "build_locks",
    "keep_connected",
    "run_with_locks",
]

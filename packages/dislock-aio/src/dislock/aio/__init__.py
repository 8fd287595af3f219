"""dislock's asyncio API: the same names as the sync API, as async context managers.

``ScheduleLock``, ``LeaseLock``, ``acquire_locks``, ``build_locks`` and
``run_with_locks`` behave like their ``dislock`` namesakes, on
``psycopg.AsyncConnection``; the lease is renewed by an asyncio task and
``LockSession.lease_lost`` is an ``asyncio.Event``.  The locks of one event loop
share a connection per database; ``keep_connected`` keeps it open between locks.
"""

from dislock.aio._hub import keep_connected
from dislock.aio._locks import LeaseLock, LockSession, ScheduleLock, acquire_locks, build_locks
from dislock.aio._supervisor import run_with_locks

__all__ = [
    "LeaseLock",
    "LockSession",
    "ScheduleLock",
    "acquire_locks",
    "build_locks",
    "keep_connected",
    "run_with_locks",
]

"""dislock's asyncio API: the same names as the sync API, as async context managers.

``ScheduleLock``, ``LeaseLock``, ``acquire_locks``, ``build_locks`` and
``run_with_locks`` behave like their ``dislock`` namesakes, on
``psycopg.AsyncConnection``; the lease is renewed by an asyncio task and
``LockSession.lease_lost`` is an ``asyncio.Event``.  The locks of one event loop
share a connection per database; ``keep_connected`` keeps it open between locks.
``LockContext``, ``LeaseLossPolicy``, ``LEASE_LOST_EXIT_CODE`` and the errors are
exported here too, so that asyncio code needs no other import.
"""

import dislock as _dislock
from dislock.aio._decorators import with_locks as with_locks
from dislock.aio._fencing import set_fencing_token as set_fencing_token
from dislock.aio._hub import keep_connected as keep_connected
from dislock.aio._lease import LeaseLock as LeaseLock
from dislock.aio._schedule import ScheduleLock as ScheduleLock
from dislock.aio._session import LockSession as LockSession
from dislock.aio._session import acquire_locks as acquire_locks
from dislock.aio._session import build_locks as build_locks
from dislock.aio._supervisor import run_with_locks as run_with_locks
from dislock.core.public import *  # noqa: F403  (the core names)

__all__ = list(_dislock.__all__)

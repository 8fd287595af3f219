"""dislock's sync API, re-exported by ``dislock`` itself.

``ScheduleLock``, ``LeaseLock``, ``acquire_locks``, ``build_locks`` and
``run_with_locks`` are blocking context managers and functions on
``psycopg.Connection``.  The locks of a process share one connection per
database and one renewer thread; ``keep_connected`` keeps that connection open
between locks.  The modules
here are generated from the asyncio ones in ``dislock.aio`` (see
``tools/async_to_sync.py``), apart from ``_compat``.
"""

import dislock as _dislock
from dislock._sync._decorators import with_locks as with_locks
from dislock._sync._fencing import set_fencing_token as set_fencing_token
from dislock._sync._hub import keep_connected as keep_connected
from dislock._sync._lease import LeaseLock as LeaseLock
from dislock._sync._schedule import ScheduleLock as ScheduleLock
from dislock._sync._session import LockSession as LockSession
from dislock._sync._session import acquire_locks as acquire_locks
from dislock._sync._session import build_locks as build_locks
from dislock._sync._supervisor import run_with_locks as run_with_locks
from dislock.core.public import *  # noqa: F403  (the core names)

__all__ = list(_dislock.__all__)

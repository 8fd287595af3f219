"""dislock's public names, listed once, importing nothing.

``CORE_NAMES`` are defined in this package and exported by every flavour of the
API; ``LOCK_NAMES`` are what each flavour defines for itself: the sync one in
``dislock._sync`` (re-exported by ``dislock``) and the asyncio one in
``dislock.aio``.  Every module's ``__all__`` is built from these two lists, and
``tests/unit/test_namespace.py`` checks that every module exports exactly them.
They live apart from the names themselves (``dislock.core.public``) so that
``import dislock`` knows its names without importing psycopg.
"""

from __future__ import annotations

CORE_NAMES: tuple[str, ...] = (
    "LEASE_LOST_EXIT_CODE",
    "MAX_RUNTIME_EXIT_CODE",
    "ConfigurationError",
    "DatabaseUnreachableError",
    "DislockError",
    "KeyNotGrantedError",
    "LeaseLossPolicy",
    "LeaseLostError",
    "LockContext",
    "LockDelayedError",
    "LockNotAcquiredError",
    "LockPausedError",
    "MaxRuntimeExceeded",
    "NotReplicatedError",
    "SlotLateError",
    "StatementTimeout",
)

LOCK_NAMES: tuple[str, ...] = (
    "LeaseLock",
    "LockSession",
    "ScheduleLock",
    "acquire_locks",
    "build_locks",
    "keep_connected",
    "run_with_locks",
    "set_fencing_token",
    "with_locks",
)

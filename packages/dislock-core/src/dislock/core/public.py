"""dislock's public names, listed once.

``CORE_NAMES`` are defined in this package and exported by every flavour of the
API; ``LOCK_NAMES`` are what each flavour defines for itself: the sync one in
``dislock._sync`` (re-exported by ``dislock``) and the asyncio one in
``dislock.aio``.  Their ``__all__`` are built from these two lists, and
``tests/unit/test_namespace.py`` checks that every module exports exactly them.
``from dislock.core.public import *`` gives the core names.
"""

from __future__ import annotations

from dislock.core.context import LEASE_LOST_EXIT_CODE as LEASE_LOST_EXIT_CODE
from dislock.core.context import MAX_RUNTIME_EXIT_CODE as MAX_RUNTIME_EXIT_CODE
from dislock.core.context import LeaseLossPolicy as LeaseLossPolicy
from dislock.core.context import LockContext as LockContext
from dislock.core.errors import ConfigurationError as ConfigurationError
from dislock.core.errors import DatabaseUnreachableError as DatabaseUnreachableError
from dislock.core.errors import DislockError as DislockError
from dislock.core.errors import KeyNotGrantedError as KeyNotGrantedError
from dislock.core.errors import LeaseLostError as LeaseLostError
from dislock.core.errors import LockDelayedError as LockDelayedError
from dislock.core.errors import LockNotAcquiredError as LockNotAcquiredError
from dislock.core.errors import LockPausedError as LockPausedError
from dislock.core.errors import MaxRuntimeExceeded as MaxRuntimeExceeded
from dislock.core.errors import NotReplicatedError as NotReplicatedError
from dislock.core.errors import SlotLateError as SlotLateError
from dislock.core.errors import StatementTimeout as StatementTimeout

__all__ = [
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
]

CORE_NAMES: tuple[str, ...] = tuple(__all__)

LOCK_NAMES: tuple[str, ...] = (
    "LeaseLock",
    "LockSession",
    "ScheduleLock",
    "acquire_locks",
    "build_locks",
    "keep_connected",
    "run_with_locks",
    "with_locks",
)

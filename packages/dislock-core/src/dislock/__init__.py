"""dislock: PostgreSQL-backed distributed locks for cron jobs and one-off commands.

This file belongs to the ``dislock-core`` distribution, which owns the ``dislock``
namespace.  The other distributions add subpackages to it: ``dislock._sync`` (from
``dislock``), ``dislock.aio`` (from ``dislock-aio``) and ``dislock.cli`` (from
``dislock-cli``).  The core names below are imported eagerly; the sync names are
resolved on first use so that an async-only install never imports them.
"""

from __future__ import annotations

# Editable installs put every member's ``src`` directory on sys.path; extend_path
# lets ``dislock.aio`` and friends be found there although this __init__ lives
# only in dislock-core's tree.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

from importlib import import_module
from typing import TYPE_CHECKING, Any

from dislock.core.context import (
    LEASE_LOST_EXIT_CODE,
    LeaseLossPolicy,
    LockContext,
)
from dislock.core.errors import (
    ConfigurationError,
    DislockError,
    LeaseLostError,
    LockNotAcquiredError,
    LockPausedError,
    NotReplicatedError,
    StatementTimeout,
)

__version__ = "0.2.0"

_SYNC_NAMES = frozenset(
    {
        "ScheduleLock",
        "LeaseLock",
        "LockSession",
        "acquire_locks",
        "build_locks",
        "keep_connected",
        "run_with_locks",
    }
)

if TYPE_CHECKING:
    from dislock._sync import (
        LeaseLock,
        LockSession,
        ScheduleLock,
        acquire_locks,
        build_locks,
        keep_connected,
        run_with_locks,
    )


def __getattr__(name: str) -> Any:
    # PEP 562: the sync API lives in another distribution, imported on first use.
    if name in _SYNC_NAMES:
        try:
            _sync = import_module("dislock._sync")
        except ModuleNotFoundError as exc:
            if exc.name not in ("dislock._sync", "dislock"):
                raise
            raise ImportError(
                f"dislock.{name} is part of the sync API, which is not installed: "
                "pip install dislock"
            ) from exc
        return getattr(_sync, name)
    raise AttributeError(f"module 'dislock' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SYNC_NAMES)


__all__ = [
    "LEASE_LOST_EXIT_CODE",
    "ConfigurationError",
    "DislockError",
    "LeaseLock",
    "LeaseLossPolicy",
    "LeaseLostError",
    "LockContext",
    "LockNotAcquiredError",
    "LockPausedError",
    "LockSession",
    "NotReplicatedError",
    "ScheduleLock",
    "StatementTimeout",
    "acquire_locks",
    "build_locks",
    "keep_connected",
    "run_with_locks",
]

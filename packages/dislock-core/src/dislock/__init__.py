"""dislock: PostgreSQL-backed distributed locks for cron jobs and one-off commands.

This file belongs to ``dislock-core``, which owns the namespace; the other
distributions add ``dislock._sync``, ``dislock.aio`` and ``dislock.cli``.  Every name
is resolved on first use: an async-only install never imports the sync names, and
``import dislock`` imports nothing, not even psycopg (``dislock.cli.quick_import``).
"""

from __future__ import annotations

# Editable installs put every member's ``src`` directory on sys.path; extend_path
# lets ``dislock.aio`` and friends be found there although this __init__ lives
# only in dislock-core's tree.
from pkgutil import extend_path as _extend_path

__path__ = _extend_path(__path__, __name__)

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

__version__ = "0.2.0"

# The public names, listed once: the core's (``dislock.core.public`` gathers them) and
# those each flavour defines for itself (``dislock._sync``, ``dislock.aio``), whose
# ``__all__`` is this one; ``tests/unit/test_namespace.py`` holds every module to them.
_CORE_NAMES: tuple[str, ...] = (
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

_LOCK_NAMES: tuple[str, ...] = (
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

__all__ = list(_CORE_NAMES + _LOCK_NAMES)

if TYPE_CHECKING:
    # For type checkers, which cannot follow __getattr__ (tests/unit/test_namespace.py
    # checks that these are the LOCK_NAMES, and the star the CORE_NAMES).
    from dislock._sync import LeaseLock as LeaseLock
    from dislock._sync import LockSession as LockSession
    from dislock._sync import ScheduleLock as ScheduleLock
    from dislock._sync import acquire_locks as acquire_locks
    from dislock._sync import build_locks as build_locks
    from dislock._sync import keep_connected as keep_connected
    from dislock._sync import run_with_locks as run_with_locks
    from dislock._sync import set_fencing_token as set_fencing_token
    from dislock._sync import with_locks as with_locks
    from dislock.core.public import *  # noqa: F403


def __getattr__(name: str) -> object:
    # PEP 562: the core names are imported on first use, and the sync API, which
    # lives in another distribution, too.
    if name in _CORE_NAMES:
        value = getattr(_import_module("dislock.core.public"), name)
    elif name in _LOCK_NAMES:
        try:
            _sync = _import_module("dislock._sync")
        except ModuleNotFoundError as exc:
            if exc.name not in ("dislock._sync", "dislock"):
                raise
            raise ImportError(
                f"dislock.{name} is part of the sync API, which is not installed: "
                "pip install dislock"
            ) from exc
        value = getattr(_sync, name)
    else:
        raise AttributeError(f"module 'dislock' has no attribute {name!r}")
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    # The public names and the module's own dunders; not the helpers above.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})

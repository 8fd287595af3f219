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
from pkgutil import extend_path as _extend_path

__path__ = _extend_path(__path__, __name__)

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

from dislock.core.public import *  # noqa: F403  (the core names, imported eagerly)
from dislock.core.public import CORE_NAMES as _CORE_NAMES
from dislock.core.public import LOCK_NAMES as _LOCK_NAMES

__version__ = "0.2.0"

__all__ = [*_CORE_NAMES, *_LOCK_NAMES]

if TYPE_CHECKING:
    # For type checkers, which cannot follow __getattr__ (tests/unit/test_namespace.py
    # checks that these are the LOCK_NAMES).
    from dislock._sync import LeaseLock as LeaseLock
    from dislock._sync import LockSession as LockSession
    from dislock._sync import ScheduleLock as ScheduleLock
    from dislock._sync import acquire_locks as acquire_locks
    from dislock._sync import build_locks as build_locks
    from dislock._sync import keep_connected as keep_connected
    from dislock._sync import run_with_locks as run_with_locks
    from dislock._sync import with_locks as with_locks


def __getattr__(name: str) -> object:
    # PEP 562: the sync API lives in another distribution, imported on first use.
    if name in _LOCK_NAMES:
        try:
            _sync = _import_module("dislock._sync")
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
    # The public names and the module's own dunders; not the helpers above.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})

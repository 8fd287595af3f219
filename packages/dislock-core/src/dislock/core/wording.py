"""How a refusal names a setting: by its ``LockContext`` field, or by the wrapper's
variable while the wrapper builds its context (:func:`by_variables`).

A context variable, not an argument: ``LockContext``'s signature stays the one
Python users call, and each check is written once for both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from dislock.core.setting import Setting

_BY_VARIABLE: ContextVar[bool] = ContextVar("dislock_by_variable", default=False)


@contextmanager
def by_variables() -> Iterator[None]:
    """Within it, refusals name the wrapper's variables."""
    token = _BY_VARIABLE.set(True)
    try:
        yield
    finally:
        _BY_VARIABLE.reset(token)


def either(python: str, wrapper: str) -> str:
    """Words that differ by more than a setting's name."""
    return wrapper if _BY_VARIABLE.get() else python


def name(setting: Setting) -> str:
    """Its variable in the wrapper, else its field."""
    return str(setting.name if _BY_VARIABLE.get() and setting.name else setting.field)


def on(setting: Setting) -> str:
    """A flag turned on, as the caller writes it."""
    return either(f"{setting.field}=True", f"{setting.name}=1")

"""What one setting is: its variable, its ``LockContext`` field, its default, its
``--help`` line and, for a number, its bound; how its variable's text is read; and
how a refusal names it (:func:`name`).

The settings themselves are the table of ``dislock.core.variables``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

from dislock.core.bounds import Bound

Reader = Callable[[str, str], Any]
"""``(variable name, its non-blank text)`` to the value, or ConfigurationError."""


class Setting(NamedTuple):
    """One setting: a ``LockContext`` field, a variable of the wrapper, or both."""

    name: str
    """Its environment variable; ``""`` for a setting only Python gives."""
    field: str | None
    """The ``LockContext`` field it sets; None for the wrapper's own settings."""
    default: str
    """What an unset (or blank) variable means, as ``--help`` shows it."""
    help: str
    """The ``--help`` text; ``{range}`` stands for its bound's accepted range."""
    reader: Reader | None = None
    """How its text is read; None for a number (its bound reads it) and where it
    needs more than its own text (``CRON_TZ``, the log level)."""
    bound: Bound | None = None
    as_text: bool = False
    """The wrapper hands the text over, for ``LockContext`` to check once (a number's
    always)."""

    @property
    def high(self) -> float:
        """The largest value a numeric setting accepts."""
        assert self.bound is not None, self
        return self.bound.high

    @property
    def value(self) -> Any:
        """A number's default, as a field left out gets it."""
        return self.check(self.default)

    def check(self, value: object, name: str | None = None) -> Any:
        """A number within its bound (``name``: how the refusal names the setting)."""
        assert self.bound is not None, self
        return self.bound.check(value, name or self.name or str(self.field))

    def text(self, environ: Mapping[str, str]) -> str | None:
        """The variable's text; set-but-blank counts as unset."""
        value = environ.get(self.name) if self.name else None
        return value if value is not None and value.strip() else None

    def read(self, environ: Mapping[str, str]) -> Any:
        """The variable's value, checked; None when it is unset or blank."""
        raw = self.text(environ)
        if raw is None:
            return None
        if self.bound is not None:
            return self.check(raw)
        if self.reader is None:
            raise TypeError(f"{self.name} is not read on its own")
        return self.reader(self.name, raw)

    def given(self, environ: Mapping[str, str]) -> Any:
        """What the wrapper gives ``LockContext`` for the variable: its text, or its value."""
        return self.text(environ) if self.as_text or self.bound else self.read(environ)

    def describe(self) -> str:
        """The ``--help`` text, with the bound's range filled in."""
        return self.help.format(range=self.bound.describe() if self.bound else "")


# A context variable, not an argument: ``LockContext``'s signature stays the one
# Python users call, and each check is written once for both.
_BY_VARIABLE: ContextVar[bool] = ContextVar("dislock_by_variable", default=False)


@contextmanager
def by_variables() -> Iterator[None]:
    """Within it, refusals name the wrapper's variables, not ``LockContext``'s fields."""
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

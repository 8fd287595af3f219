"""Ranges of numbers and limits of text that every way in checks alike.

A numeric setting's :class:`Bound` is declared beside the setting, in
``dislock.core.variables``; :meth:`Bound.check` is its one check, from the
environment or from Python alike.  Lock keys, pause reasons and text shown on one
line are limited here too.
"""

from __future__ import annotations

import math
import sys
import unicodedata
from typing import NamedTuple

from dislock.core.errors import ConfigurationError

DAY = 86400.0


class Bound(NamedTuple):
    """The accepted range of one numeric setting."""

    low: float
    high: float
    unit: str
    """``"s"`` for seconds, ``""`` for a count."""
    why: str
    """Why the limits are where they are (shown in the docs)."""
    low_open: bool = False
    """``low`` itself is refused (``> 0`` rather than ``>= 0``)."""
    integer: bool = False

    def describe(self) -> str:
        """``0.1 to 604800 s``: the range as the docs and ``--help`` print it."""
        low = f"more than {_number(self.low)}" if self.low_open else _number(self.low)
        unit = f" {self.unit}" if self.unit else ""
        return f"{low} to {_number(self.high)}{unit}"

    def check(self, value: object, name: str) -> float:
        """``value`` (a number, or its text) within range, as a float (an int for a
        count); else one line naming the setting and quoting the value as given."""
        if self.integer and isinstance(value, str):
            value = value.strip()
        what = (
            "a whole number" if self.integer else "a number of seconds" if self.unit else "a number"
        )
        got = f", got {shown(value)}"
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigurationError(f"{name} must be {what}{got}")
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float: out of range, said so below
            number = sys.float_info.max if int(value) > 0 else -sys.float_info.max
        except ValueError:
            raise ConfigurationError(f"{name} must be {what}{got}") from None
        if not math.isfinite(number):
            raise ConfigurationError(f"{name} must be a finite {what[2:]}{got}")
        if self.integer and not number.is_integer():
            raise ConfigurationError(f"{name} must be a whole number{got}")
        low, high = _number(self.low), _number(self.high)
        unit = f" {self.unit}" if self.unit else ""
        if self.low_open and number <= self.low:
            raise ConfigurationError(f"{name} must be greater than {low}{got}")
        if self.integer and not self.low <= number <= self.high:
            raise ConfigurationError(f"{name} must be between {low} and {high}{got}")
        if number < self.low:
            if self.low == 0:
                raise ConfigurationError(f"{name} must not be negative{got}")
            raise ConfigurationError(f"{name} must be at least {low}{unit}{got}")
        if number > self.high:
            raise ConfigurationError(f"{name} must be at most {high}{unit}{got}")
        return int(number) if self.integer else number


MAX_KEY_BYTES = 2048
"""The longest lock key, in UTF-8 bytes: the row key is the primary key, and
PostgreSQL refuses an index entry over about 2.7 kB."""


def _number(value: float) -> str:
    return f"{value:g}" if value < 1e6 else str(int(value))


# Control characters break the one-line-per-lock output of `dislockctl ls` and the
# logs; format characters (bidirectional overrides) make a key read as another one;
# surrogates are bytes of the environment that are not UTF-8 and cannot be stored.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _refused(char: str) -> bool:
    return unicodedata.category(char) in _REFUSED_CATEGORIES


def check_text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{name} must be a non-empty string, got {value!r}")
    return value


def check_key(name: str, value: object) -> str:
    """A lock key: non-blank text of at most :data:`MAX_KEY_BYTES` UTF-8 bytes, printable
    on one line."""
    return _check_line(name, check_text(name, value), MAX_KEY_BYTES)


def _check_line(name: str, value: str, max_bytes: int) -> str:
    """Text printed on one line wherever it shows: none of the refused characters
    (surrogates among them, so it encodes), and at most ``max_bytes`` of UTF-8."""
    bad = next((char for char in value if _refused(char)), None)
    if bad is not None:
        raise ConfigurationError(
            f"{name} must not contain control or invisible characters "
            f"(found {bad!a} in {printable(value, limit=80)})"
        )
    return check_size(name, value, max_bytes)


def check_size(name: str, value: str, max_bytes: int) -> str:
    """Text of at most ``max_bytes`` of UTF-8 (``value`` encodes: see :func:`check_utf8`)."""
    size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise ConfigurationError(
            f"{name} is {size} bytes long; at most {max_bytes} bytes (UTF-8) are accepted"
        )
    return value


MAX_REASON_BYTES = 1000
"""The longest pause reason (``dislockctl pause --reason``), in UTF-8 bytes: it is
printed in every skip message of every machine and in ``dislockctl ls``."""


MAX_STORED_BYTES = 4096
"""The longest text, in UTF-8 bytes, that a granted role may write into a text column
of the lock table or the run history (``dislock.core.grant_policies``): dislock's
own longest is an owner token of :data:`MAX_KEY_BYTES` with a release mark appended.
``dislockctl`` reads no column longer than this many characters, whoever wrote it."""

MAX_OWNER_BYTES = 1000
"""The longest owner token of a replacer: the replace mark holds two owners, and a
row's ``value`` at most :data:`MAX_STORED_BYTES`."""


def check_reason(name: str, value: str) -> str:
    """A pause reason: printable on one line, at most :data:`MAX_REASON_BYTES`; may be
    empty."""
    return _check_line(name, value, MAX_REASON_BYTES)


def check_utf8(name: str, value: str) -> str:
    """Text that can be sent to the database: command-line arguments and environment
    variables that are not UTF-8 reach Python as lone surrogates."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"{name} is not valid UTF-8: {printable(value, limit=80)}"
        ) from None
    return value


def printable(text: str, *, limit: int | None = None) -> str:
    """``text`` quoted for one line of output: control, format and separator characters
    escaped (``'a\\nb'``), shortened to about ``limit`` characters."""
    shown = text if limit is None or len(text) <= limit else text[:limit] + "..."
    return "'" + escape(shown).replace("'", "\\'") + "'"


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)``, shortened: a setting's value as an error message quotes it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def escape(text: str) -> str:
    """``text`` with control, format and separator characters escaped, unquoted."""
    if not any(_refused(char) for char in text):
        return text
    return "".join(ascii(char)[1:-1] if _refused(char) else char for char in text)


SHOWN_CHARS = 64
"""How much of a key, an owner token or a host name one cell of a table shows
(``clip``): no row written by hand widens every line."""


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` for one cell of output: escaped, and cut to ``limit`` characters with
    ``…`` last."""
    if len(text) <= limit and not any(_refused(char) for char in text):
        return text
    parts: list[str] = []
    size = 0
    for char in text:
        part = escape(char)
        if size + len(part) > limit:
            while parts and size + 1 > limit:  # room for the ellipsis
                size -= len(parts.pop())
            return "".join(parts) + "…"
        parts.append(part)
        size += len(part)
    return "".join(parts)

"""The accepted range of every numeric setting, and of lock keys, in one table.

The wrapper's environment, ``LockContext`` and ``dislockctl check`` all check
numbers through :func:`check_number` with an entry of :data:`BOUNDS`, so they
refuse the same values with the same words (only the setting's name differs:
``RUN_LOCK_TTL_SECONDS`` from the environment, ``run_ttl_seconds`` in Python).
A new numeric setting is one entry here; ``docs/cli.md`` and ``dislock --help``
list every entry, and a test holds them to it.
"""

from __future__ import annotations

import math
import sys
import unicodedata
from typing import NamedTuple

from dislock.core.errors import ConfigurationError


class Bound(NamedTuple):
    """The range of one numeric setting."""

    variable: str | None
    """Its environment variable (the wrapper's), if it has one."""
    field: str | None
    """Its ``LockContext`` field, if it has one."""
    low: float
    high: float
    unit: str
    """``"s"`` for seconds, ``""`` for a count."""
    doc: str
    """Why the limits are where they are (shown in the docs)."""
    low_open: bool = False
    """``low`` itself is refused (``> 0`` rather than ``>= 0``)."""
    integer: bool = False

    def describe(self) -> str:
        """``0.1 to 604800 s``: the range as the docs and ``--help`` print it."""
        low = f"more than {_number(self.low)}" if self.low_open else _number(self.low)
        unit = f" {self.unit}" if self.unit else ""
        return f"{low} to {_number(self.high)}{unit}"


DAY = 86400.0

TTL = Bound(
    "RUN_LOCK_TTL_SECONDS",
    "run_ttl_seconds",
    0.1,
    7 * DAY,
    "s",
    "a lease shorter than a round trip cannot be renewed; one longer than a week keeps a "
    "crashed holder's lock for longer than anyone waits",
)
HEARTBEAT = Bound(
    "LOCK_LEASE_INTERVAL",
    "lease_interval_seconds",
    0.001,
    7 * DAY,
    "s",
    "and at most the TTL; faster than a millisecond is a busy loop",
)
JITTER = Bound(
    "LOCK_JITTER_SECONDS",
    "jitter_max_seconds",
    0.0,
    3600.0,
    "s",
    "a start-up delay longer than an hour is a mistake; with a schedule, also at most half "
    "the shortest interval between its fires (over its next 32), so the delayed start stays "
    "in its slot",
)
CONNECT_TIMEOUT = Bound(
    None,
    "connect_timeout_seconds",
    0.0,
    3600.0,
    "s",
    "an hour is longer than any cron run should wait for a database",
    low_open=True,
)
CONNECT_PATIENCE = Bound(
    "LOCK_CONNECT_PATIENCE_SECONDS",
    "connect_patience_seconds",
    0.0,
    3600.0,
    "s",
    "0 reports the first refusal; waiting out a busy server for longer than an hour is a "
    "mistake (a schedule lock never waits past its slot anyway)",
)

MAX_RUNTIME = Bound(
    "LOCK_MAX_RUNTIME_SECONDS",
    "max_runtime_seconds",
    1.0,
    30 * DAY,
    "s",
    "a bound under a second stops a command before it is under way; a job meant to run "
    "for more than a month wants no bound rather than one nobody remembers",
)
RETRIES = Bound(
    "LOCK_RETRIES",
    "retries",
    0,
    100,
    "",
    "more attempts than this in one slot is a loop, not a retry",
    integer=True,
)
RETRY_DELAY = Bound(
    "LOCK_RETRY_DELAY_SECONDS",
    "retry_delay_seconds",
    1.0,
    DAY,
    "s",
    "the first retry waits this long after the failed attempt ended, each later one twice "
    "as long as the one before; under a second, a retry starts before the failure's "
    "cause could change",
)
START_DEADLINE = Bound(
    "LOCK_START_DEADLINE_SECONDS",
    "start_deadline_seconds",
    1.0,
    366 * DAY,
    "s",
    "under a second refuses every start that cron or a busy machine delays at all; no slot "
    "is longer than a year",
)
OUTPUT_TAIL = Bound(
    "LOCK_OUTPUT_TAIL_BYTES",
    "output_tail_bytes",
    0,
    65536,
    "",
    "the end of a failed run's output is what says why; more than 64 KiB a run is a log, "
    "and a log belongs in a log store, not in every failed run's history row",
    integer=True,
)
WAIT = Bound(
    "LOCK_WAIT_SECONDS",
    "wait_seconds",
    0.0,
    DAY,
    "s",
    "a run that would wait longer than a day for the one before it wants a schedule instead",
)
WAIT_POLL = Bound(
    "LOCK_WAIT_POLL_SECONDS",
    "wait_poll_seconds",
    0.0,
    3600.0,
    "s",
    "polling less than hourly is not waiting",
    low_open=True,
)
SLOTS = Bound(
    "LOCK_SLOTS",
    "slots",
    1,
    1000,
    "",
    "more holders than this at once is not a lock any more; it also bounds the array the "
    "slot-taking statement is sent",
    integer=True,
)
CONFLICT_EXIT_CODE = Bound(
    "LOCK_CONFLICT_EXIT_CODE",
    None,
    0,
    255,
    "",
    "an exit status is one byte",
    integer=True,
)

BOUNDS: tuple[Bound, ...] = (
    TTL,
    HEARTBEAT,
    JITTER,
    CONNECT_TIMEOUT,
    CONNECT_PATIENCE,
    MAX_RUNTIME,
    RETRIES,
    RETRY_DELAY,
    START_DEADLINE,
    OUTPUT_TAIL,
    WAIT,
    WAIT_POLL,
    SLOTS,
    CONFLICT_EXIT_CODE,
)
"""Every numeric setting. Other settings add their entry here and check with it."""

MAX_KEY_BYTES = 2048
"""The longest lock key, in UTF-8 bytes. The row key ``cronjob-lock:<mode>:<key>`` is
indexed (the primary key), and PostgreSQL refuses an index entry over about 2.7 kB;
the limit is checked before connecting, and keys within it are stored as they are,
as dislock 0.1.0 stores them."""


def _number(value: float) -> str:
    return f"{value:g}" if value < 1e6 else str(int(value))


def check_number(bound: Bound, value: object, *, name: str | None = None) -> float:
    """``value`` (a number, or its text) within ``bound``, as a float; else one line
    naming the setting (``name``, by default its variable or field)."""
    label = name or bound.variable or bound.field or "value"
    what = (
        "a whole number" if bound.integer else "a number of seconds" if bound.unit else "a number"
    )
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigurationError(f"{label} must be {what}, got {shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float: out of range, said so below
        number = sys.float_info.max if int(value) > 0 else -sys.float_info.max
    except ValueError:
        raise ConfigurationError(f"{label} must be {what}, got {shown(value)}") from None
    if not math.isfinite(number):
        raise ConfigurationError(f"{label} must be a finite {what[2:]}, got {shown(value)}")
    if bound.integer and not number.is_integer():
        raise ConfigurationError(f"{label} must be a whole number, got {shown(value)}")
    unit = f" {bound.unit}" if bound.unit else ""
    if bound.low_open and number <= bound.low:
        raise ConfigurationError(
            f"{label} must be greater than {_number(bound.low)}, got {shown(value)}"
        )
    if bound.integer and not bound.low <= number <= bound.high:
        raise ConfigurationError(
            f"{label} must be between {_number(bound.low)} and {_number(bound.high)}, "
            f"got {shown(value)}"
        )
    if number < bound.low:
        if bound.low == 0:
            raise ConfigurationError(f"{label} must not be negative, got {shown(value)}")
        raise ConfigurationError(
            f"{label} must be at least {_number(bound.low)}{unit}, got {shown(value)}"
        )
    if number > bound.high:
        raise ConfigurationError(
            f"{label} must be at most {_number(bound.high)}{unit}, got {shown(value)}"
        )
    return number


def check_count(bound: Bound, value: object, *, name: str | None = None) -> int:
    """A whole number within ``bound`` (an int, or its decimal text)."""
    return int(check_number(bound, value.strip() if isinstance(value, str) else value, name=name))


# Control characters break the one-line-per-lock output of `dislockctl ls` and the
# logs; format characters (bidirectional overrides) make a key read as another one;
# surrogates are bytes of the environment that are not UTF-8 and cannot be stored.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _refused(char: str) -> bool:
    return unicodedata.category(char) in _REFUSED_CATEGORIES


def check_key(name: str, value: object) -> str:
    """A lock key: non-blank text of at most :data:`MAX_KEY_BYTES` UTF-8 bytes, with
    no control, format or line-separator characters."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{name} must be a non-empty string, got {value!r}")
    return _check_line(name, value, MAX_KEY_BYTES)


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
"""The longest text, in UTF-8 bytes, that a role of ``dislockctl grant`` may write into
a text column of the lock table (``key``, ``value``) or of the run history (``lock_key``,
``modes``, ``owner``, ``host``, ``cron``, ``cron_tz``); the server refuses longer ones
(``dislock.core.grants``).  dislock's own longest is a lock row's owner token of
:data:`MAX_KEY_BYTES` with a release mark appended; pause reasons
(:data:`MAX_REASON_BYTES`), host names, cron expressions, zone names and the failover
bookkeeping's numbers are all shorter.  ``dislockctl`` reads no column longer than
this many characters, whoever wrote it (``dislock.cli.shown``)."""


def check_reason(name: str, value: str) -> str:
    """A pause reason: at most :data:`MAX_REASON_BYTES` UTF-8 bytes, none of the
    characters a lock key may not hold (it is printed on one line too); may be empty."""
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
    escaped = "".join(ascii(char)[1:-1] if _refused(char) else char for char in shown)
    return "'" + escaped.replace("'", "\\'") + "'"


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
"""How much of a key, an owner token or a host name one cell of ``dislockctl``'s tables
and of the status page shows: longer ones end in an ellipsis (``clip``), so that
no row written by hand widens every line of a table."""


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` for one cell of output: escaped as :func:`escape` escapes it and, when
    that is longer than ``limit`` characters, cut to ``limit`` with ``…`` last."""
    if len(text) <= limit and not any(_refused(char) for char in text):
        return text
    parts: list[str] = []
    size = 0
    for char in text:
        part = ascii(char)[1:-1] if _refused(char) else char
        if size + len(part) > limit:
            while parts and size + 1 > limit:  # room for the ellipsis
                size -= len(parts.pop())
            return "".join(parts) + "…"
        parts.append(part)
        size += len(part)
    return "".join(parts)

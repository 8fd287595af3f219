"""The wrapper's environment variables, in one table: each one's ``LockContext``
field, how its text is read (and checked: a refusal names the variable), how a
field's value is written back as text, its default and its ``dislock --help`` line.

``dislock.cli.wrapper.settings`` reads the environment through it, ``dislock --help`` and
``docs/cli.md`` list it (a test holds them to it), ``dislockctl check`` reports
with it, and the tests' CLI driver turns a ``LockContext`` into an environment
with it.  A numeric variable refers to its entry of ``dislock.core.bounds``.

Only the standard library and dislock's light core modules are imported here:
``dislock --help`` reads this table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from dislock.core import bounds, config
from dislock.core.bounds import Bound
from dislock.core.errors import ConfigurationError

if TYPE_CHECKING:
    from dislock.core.context import LockContext

Reader = Callable[[str, str], Any]
"""``(variable name, its non-blank text)`` to the value, or ConfigurationError."""


class Variable(NamedTuple):
    """One variable the wrapper reads."""

    name: str
    field: str | None
    """The ``LockContext`` field it sets; None for the wrapper's own settings."""
    default: str
    """What an unset (or blank) variable means, as ``--help`` shows it."""
    help: str
    """The ``--help`` text; ``{range}`` stands for its bound's accepted range."""
    reader: Reader | None
    """None: read where it needs more than its own text (``CRON_TZ`` reads ``TZ``
    too; the log level falls back rather than refuse)."""
    writer: Callable[[Any], str | None] | None = None
    """A field's value as the variable's text; None: leave the variable unset."""
    bound: Bound | None = None

    def text(self, environ: Mapping[str, str]) -> str | None:
        """The variable's text; set-but-blank counts as unset."""
        value = environ.get(self.name)
        return value if value is not None and value.strip() else None

    def read(self, environ: Mapping[str, str]) -> Any:
        """The variable's value, checked; None when it is unset or blank."""
        if self.reader is None:
            raise TypeError(f"{self.name} is not read on its own")
        raw = self.text(environ)
        return None if raw is None else self.reader(self.name, raw)

    def write(self, value: Any) -> str | None:
        """``value`` (of the field) as this variable's text, or None to leave it unset."""
        if self.writer is None or value is None:
            return None
        return self.writer(value)

    def describe(self) -> str:
        """The ``--help`` text, with the bound's range filled in."""
        return self.help.format(range=self.bound.describe() if self.bound else "")


def _number(bound: Bound) -> Reader:
    return lambda name, raw: bounds.check_number(bound, raw, name=name)


def _count(bound: Bound) -> Reader:
    return lambda name, raw: bounds.check_count(bound, raw, name=name)


def _prefixed(parse: Callable[[str], Any]) -> Reader:
    """A reader whose refusal is quoted after the variable and its text."""

    def read(name: str, raw: str) -> Any:
        try:
            return parse(raw)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{name}={raw!r}: {exc}") from None

    return read


def _cron(name: str, raw: str) -> str:
    from dislock.core.cron import check_cron  # croniter: only schedule users pay for it

    return check_cron(raw, name=name)


def _parse_after() -> Callable[[str], Any]:
    from dislock.core.after import parse_after  # its SQL: only LOCK_AFTER users import it

    return parse_after


def _policy(name: str, raw: str) -> Any:
    from dislock.core.context import LeaseLossPolicy

    return LeaseLossPolicy.parse(raw, name=name)


def _group(name: str, raw: str) -> str:
    from dislock.core.groups import read_group

    return read_group(name, raw)


def _zone(tz: Any) -> str | None:
    zone = getattr(tz, "key", None)  # an IANA zone; a zone read from a path has none
    return zone if isinstance(zone, str) and not zone.startswith("/") else None


def _flag(value: bool) -> str:
    return "1" if value else "0"


_AUTO_FLAG = {None: "auto", True: "1", False: "0"}

KEY = Variable(
    "LOCK_KEY",
    "lock_key",
    "required",
    "name of the lock shared by every machine (at most 2048 bytes, no control characters)",
    bounds.check_key,
    str,
)
STRATEGY = Variable(
    "LOCK_STRATEGY",
    None,
    config.SCHEDULE,
    "schedule, lease, or schedule,lease",
    _prefixed(config.normalize_strategies),
    ",".join,
)
SCHEDULE = Variable(
    "CRON_SCHEDULE",
    "schedule",
    "-",
    "cron expression; required for schedule (5 fields, or 6 with seconds last; must fire)",
    _cron,
    str,
)
ZONE = Variable(
    "CRON_TZ",
    "cron_tz",
    "local zone",
    "IANA zone CRON_SCHEDULE is read in, like cron: default TZ, else /etc/localtime",
    None,
    _zone,
)
TABLE = Variable(
    "LOCK_TABLE",
    "table_parts",
    "key_value",
    "table, or schema.table",
    _prefixed(config.parse_table),
    ".".join,
)
TTL = Variable(
    "RUN_LOCK_TTL_SECONDS",
    "run_ttl_seconds",
    "60",
    "lease time-to-live: {range}",
    _number(bounds.TTL),
    str,
    bounds.TTL,
)
HEARTBEAT = Variable(
    "LOCK_LEASE_INTERVAL",
    "lease_interval_seconds",
    "derived",
    "heartbeat: {range}, <= TTL; default 30 % of the TTL kept within 1..10 s",
    _number(bounds.HEARTBEAT),
    str,
    bounds.HEARTBEAT,
)
JITTER = Variable(
    "LOCK_JITTER_SECONDS",
    "jitter_max_seconds",
    "0",
    "sleep up to this long before locking: {range}, and with a schedule at most half "
    "its shortest interval",
    _number(bounds.JITTER),
    str,
    bounds.JITTER,
)
LEASE_LOSS = Variable(
    "LOCK_ON_LEASE_LOSS",
    "lease_loss_policy",
    "terminate",
    "terminate (SIGTERM, SIGKILL after 10 s, exit 75) or continue (log only)",
    _policy,
    lambda policy: str(policy.value),
)
MAX_RUNTIME = Variable(
    "LOCK_MAX_RUNTIME_SECONDS",
    "max_runtime_seconds",
    "-",
    "stop the command this long after it started (SIGTERM, SIGKILL after 10 s, exit 124): {range}",
    _number(bounds.MAX_RUNTIME),
    lambda seconds: None if seconds is None else str(seconds),
    bounds.MAX_RUNTIME,
)
RETRIES = Variable(
    "LOCK_RETRIES",
    "retries",
    "0",
    "with a schedule, a failed run leaves its slot to up to this many more attempts, "
    "each by the first wrapper on any machine to start after the delay: {range}",
    _count(bounds.RETRIES),
    str,
    bounds.RETRIES,
)
RETRY_DELAY = Variable(
    "LOCK_RETRY_DELAY_SECONDS",
    "retry_delay_seconds",
    "60",
    "wait this long after a failed attempt before the next, twice as long after each "
    "later one: {range}",
    _number(bounds.RETRY_DELAY),
    str,
    bounds.RETRY_DELAY,
)
START_DEADLINE = Variable(
    "LOCK_START_DEADLINE_SECONDS",
    "start_deadline_seconds",
    "-",
    "with a schedule, a wrapper started more than this long after its slot began does not "
    "start it, and marks the slot late: {range}",
    _number(bounds.START_DEADLINE),
    lambda seconds: None if seconds is None else str(seconds),
    bounds.START_DEADLINE,
)
AFTER = Variable(
    "LOCK_AFTER",
    "after",
    "-",
    "KEY1[,KEY2...]: a slot starts only once each key has a run that succeeded and started "
    "within it; until then the run is skipped as if the lock were held, or waited for with "
    "LOCK_WAIT_SECONDS (needs LOCK_HISTORY=1)",
    lambda name, raw: _prefixed(_parse_after())(name, raw),
    lambda keys: ",".join(keys) or None,
)
OUTPUT_TAIL = Variable(
    "LOCK_OUTPUT_TAIL_BYTES",
    "output_tail_bytes",
    "0",
    "keep the last this many bytes of the command's stdout and of its stderr in the history "
    "row of a run that failed (LOCK_HISTORY=1); 0: none. {range}",
    _count(bounds.OUTPUT_TAIL),
    str,
    bounds.OUTPUT_TAIL,
)
FENCING = Variable(
    "LOCK_FENCING",
    "fencing",
    "0",
    "1: pass a fencing token to the command in DISLOCK_FENCING_TOKEN (dislockctl init --fencing)",
    config.parse_flag,
    _flag,
)
PASS_URL = Variable(
    "LOCK_PASS_URL",
    None,
    "1",
    "0: the command does not inherit URL_VARIABLE (give dislock a lock role and a "
    "variable of its own, e.g. DISLOCK_URL)",
    config.parse_flag,
    _flag,
)
WAIT = Variable(
    "LOCK_WAIT_SECONDS",
    "wait_seconds",
    "0",
    "wait up to this long for a lease held elsewhere, then skip: {range} (needs lease; "
    "with schedule,lease the slot is taken once and the lease waited for)",
    _number(bounds.WAIT),
    str,
    bounds.WAIT,
)
WAIT_POLL = Variable(
    "LOCK_WAIT_POLL_SECONDS",
    "wait_poll_seconds",
    "0.5",
    "poll cadence while waiting without LISTEN: {range}",
    _number(bounds.WAIT_POLL),
    str,
    bounds.WAIT_POLL,
)
WAIT_LISTEN = Variable(
    "LOCK_WAIT_LISTEN",
    "wait_listen",
    "auto",
    "auto: woken by the release (LISTEN/NOTIFY) on a direct connection, polling behind "
    "a pooler such as PgBouncer; 1 always; 0 never",
    config.parse_auto_flag,
    _AUTO_FLAG.__getitem__,
)
SLOTS = Variable(
    "LOCK_SLOTS",
    "slots",
    "1",
    "up to N holders of the lease at once: {range}",
    _count(bounds.SLOTS),
    str,
    bounds.SLOTS,
)
GROUP = Variable(
    "LOCK_GROUP",
    "group",
    "-",
    "NAME:N: at most N runs at once among every key naming group NAME, whatever its "
    "strategy; a run finding the group full is refused (or waits, LOCK_WAIT_SECONDS)",
    _group,
    str,
)
REPLACE = Variable(
    "LOCK_REPLACE",
    "replace",
    "0",
    "1: a lease held by a live holder is taken over: its command is stopped (it exits 75) "
    "and this one starts once it is gone (needs lease; not with LOCK_SLOTS)",
    config.parse_flag,
    _flag,
)
CONFLICT_EXIT_CODE = Variable(
    "LOCK_CONFLICT_EXIT_CODE",
    None,
    "0",
    "exit status when the lock is held elsewhere: {range}",
    _count(bounds.CONFLICT_EXIT_CODE),
    str,
    bounds.CONFLICT_EXIT_CODE,
)
CONNECT_PATIENCE = Variable(
    "LOCK_CONNECT_PATIENCE_SECONDS",
    "connect_patience_seconds",
    "30",
    "retry a refused connection (too many connections, server starting or restarting) "
    "this long ({range}), never past the schedule slot; 0: fail at once",
    _number(bounds.CONNECT_PATIENCE),
    str,
    bounds.CONNECT_PATIENCE,
)
HISTORY = Variable(
    "LOCK_HISTORY",
    "history",
    "0",
    "1: record each run in the history table (dislockctl init --history)",
    config.parse_flag,
    _flag,
)
HISTORY_TABLE = Variable(
    "LOCK_HISTORY_TABLE",
    "history_table",
    "derived",
    "default: <LOCK_TABLE>_history",
    _prefixed(config.parse_table),
    ".".join,
)
LOG_LEVEL = Variable(
    "CRONJOB_LOCK_LOG_LEVEL",
    None,
    "WARNING",
    "DEBUG, INFO, WARNING, ERROR, CRITICAL",
    None,
    str,
)
METRICS_TEXTFILE = Variable(
    "DISLOCK_METRICS_TEXTFILE",
    None,
    "-",
    "after each run, write its metrics to this node_exporter textfile (e.g. .../dislock.prom)",
    lambda name, raw: raw.strip(),
    str,
)

VARIABLES: tuple[Variable, ...] = (
    KEY,
    STRATEGY,
    SCHEDULE,
    ZONE,
    TABLE,
    TTL,
    HEARTBEAT,
    JITTER,
    LEASE_LOSS,
    MAX_RUNTIME,
    RETRIES,
    RETRY_DELAY,
    START_DEADLINE,
    AFTER,
    OUTPUT_TAIL,
    FENCING,
    PASS_URL,
    WAIT,
    WAIT_POLL,
    WAIT_LISTEN,
    SLOTS,
    GROUP,
    REPLACE,
    CONFLICT_EXIT_CODE,
    CONNECT_PATIENCE,
    HISTORY,
    HISTORY_TABLE,
    LOG_LEVEL,
    METRICS_TEXTFILE,
)
"""Every variable the wrapper reads, in the order ``--help`` lists them (the URL's
variable aside: its name is the wrapper's first argument)."""


def environment(context: LockContext) -> dict[str, str]:
    """The variables that give a wrapper ``context``'s settings (those it has a
    variable for and that are set), as text."""
    written = {
        variable.name: variable.write(getattr(context, variable.field))
        for variable in VARIABLES
        if variable.field is not None
    }
    return {name: text for name, text in written.items() if text is not None}


NAME_WIDTH = 23
DEFAULT_WIDTH = 11
HELP_WIDTH = 80


def help_lines() -> Iterator[str]:
    """The ``environment:`` section of ``dislock --help``: a variable, its default,
    and its text wrapped in a column of its own."""
    indent = 2 + NAME_WIDTH + DEFAULT_WIDTH
    for variable in VARIABLES:
        name = f"  {variable.name}"
        if len(variable.name) >= NAME_WIDTH:
            yield name
            name = ""
        lines = _wrap(variable.describe(), HELP_WIDTH - indent)
        yield f"{name:<{2 + NAME_WIDTH}}{variable.default:<{DEFAULT_WIDTH}}{lines[0]}"
        yield from (" " * indent + line for line in lines[1:])


def _wrap(text: str, width: int) -> list[str]:
    # textwrap would import re and more at every `--help`; greedy word wrap is enough.
    lines = [""]
    for word in text.split():
        if lines[-1] and len(lines[-1]) + 1 + len(word) > width:
            lines.append(word)
        else:
            lines[-1] = f"{lines[-1]} {word}" if lines[-1] else word
    return lines

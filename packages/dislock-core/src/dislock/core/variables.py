"""Every setting, declared once: its ``LockContext`` field, its environment
variable, its default, its ``dislock --help`` line and, for a number, its range
(a :class:`~dislock.core.bounds.Bound`, with why the limits are where they are).
The wrapper, ``LockContext``, ``--help``, docs/cli.md and ``dislockctl check`` all
read it.  Only light modules are imported here: ``dislock --help`` reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dislock.core import bounds, config
from dislock.core.bounds import DAY, Bound
from dislock.core.errors import ConfigurationError
from dislock.core.setting import Reader, Setting


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


def _after(name: str, raw: str) -> Any:
    from dislock.core.after import parse_after  # its SQL: only LOCK_AFTER users import it

    return _prefixed(parse_after)(name, raw)


def _policy(name: str, raw: str) -> Any:
    from dislock.core.context import LeaseLossPolicy

    return LeaseLossPolicy.parse(raw, name=name)


def _group(name: str, raw: str) -> str:
    from dislock.core.groups import parse_group  # groups imports this table

    return str(parse_group(raw, name=name))


KEY = Setting(
    "LOCK_KEY",
    "lock_key",
    "required",
    "name of the lock shared by every machine (at most 2048 bytes, no control characters)",
    bounds.check_key,
    as_text=True,
)
STRATEGY = Setting(
    "LOCK_STRATEGY",
    None,
    config.SCHEDULE,
    "schedule, lease, or schedule,lease",
    _prefixed(config.normalize_strategies),
)
SCHEDULE = Setting(
    "CRON_SCHEDULE",
    "schedule",
    "-",
    "cron expression; required for schedule (5 fields, or 6 with seconds last; must fire)",
    _cron,
    as_text=True,
)
ZONE = Setting(
    "CRON_TZ",
    "cron_tz",
    "local zone",
    "IANA zone CRON_SCHEDULE is read in, like cron: default TZ, else /etc/localtime",
)
TABLE = Setting(
    "LOCK_TABLE",
    "table_parts",
    "key_value",
    "table, or schema.table",
    _prefixed(config.parse_table),
)
TTL = Setting(
    "RUN_LOCK_TTL_SECONDS",
    "run_ttl_seconds",
    "60",
    "lease time-to-live: {range}",
    bound=Bound(
        0.1,
        7 * DAY,
        "s",
        "a lease shorter than a round trip cannot be renewed; one longer than a week keeps a "
        "crashed holder's lock for longer than anyone waits",
    ),
)
HEARTBEAT = Setting(
    "LOCK_LEASE_INTERVAL",
    "lease_interval_seconds",
    "derived",
    "heartbeat: {range}, <= TTL; default 30 % of the TTL kept within 1..10 s",
    bound=Bound(
        0.001, 7 * DAY, "s", "and at most the TTL; faster than a millisecond is a busy loop"
    ),
)
JITTER = Setting(
    "LOCK_JITTER_SECONDS",
    "jitter_max_seconds",
    "0",
    "sleep up to this long before locking: {range}, and with a schedule at most half "
    "its shortest interval",
    bound=Bound(
        0.0,
        3600.0,
        "s",
        "a start-up delay longer than an hour is a mistake; with a schedule, also at most half "
        "the shortest interval between its fires (over its next 32), so the delayed start stays "
        "in its slot",
    ),
)
LEASE_LOSS = Setting(
    "LOCK_ON_LEASE_LOSS",
    "lease_loss_policy",
    "terminate",
    "terminate (SIGTERM, SIGKILL after 10 s, exit 75) or continue (log only)",
    _policy,
    as_text=True,
)
MAX_RUNTIME = Setting(
    "LOCK_MAX_RUNTIME_SECONDS",
    "max_runtime_seconds",
    "-",
    "stop the command this long after it started (SIGTERM, SIGKILL after 10 s, exit 124): {range}",
    bound=Bound(
        1.0,
        30 * DAY,
        "s",
        "a bound under a second stops a command before it is under way; a job meant to run "
        "for more than a month wants no bound rather than one nobody remembers",
    ),
)
RETRIES = Setting(
    "LOCK_RETRIES",
    "retries",
    "0",
    "with a schedule, a failed run leaves its slot to up to this many more attempts, "
    "each by the first wrapper to start after the delay (another machine than the one that "
    "failed, for a short grace): {range}",
    bound=Bound(
        0, 100, "", "more attempts than this in one slot is a loop, not a retry", integer=True
    ),
)
RETRY_DELAY = Setting(
    "LOCK_RETRY_DELAY_SECONDS",
    "retry_delay_seconds",
    "60",
    "wait this long after a failed attempt before the next, twice as long after each "
    "later one: {range}",
    bound=Bound(
        1.0,
        DAY,
        "s",
        "the first retry waits this long after the failed attempt ended, each later one twice "
        "as long as the one before; under a second, a retry starts before the failure's "
        "cause could change",
    ),
)
START_DEADLINE = Setting(
    "LOCK_START_DEADLINE_SECONDS",
    "start_deadline_seconds",
    "-",
    "with a schedule, a wrapper started more than this long after its slot began does not "
    "start it, and marks the slot late: {range}",
    bound=Bound(
        1.0,
        366 * DAY,
        "s",
        "under a second refuses every start that cron or a busy machine delays at all; no slot "
        "is longer than a year",
    ),
)
AFTER = Setting(
    "LOCK_AFTER",
    "after",
    "-",
    "KEY1[,KEY2...]: a slot starts only once each key has a run that succeeded and started "
    "within it; until then the run is skipped as if the lock were held, or waited for with "
    "LOCK_WAIT_SECONDS (needs LOCK_HISTORY=1)",
    _after,
)
OUTPUT_TAIL = Setting(
    "LOCK_OUTPUT_TAIL_BYTES",
    "output_tail_bytes",
    "0",
    "keep the last this many bytes of the command's stdout and of its stderr in the history "
    "row of a run that failed (LOCK_HISTORY=1); 0: none. {range}",
    bound=Bound(
        0,
        65536,
        "",
        "the end of a failed run's output is what says why; more than 64 KiB a run is a log, "
        "and a log belongs in a log store, not in every failed run's history row",
        integer=True,
    ),
)
FENCING = Setting(
    "LOCK_FENCING",
    "fencing",
    "0",
    "1: pass a fencing token to the command in DISLOCK_FENCING_TOKEN (dislockctl init --fencing)",
    config.parse_flag,
)
PASS_URL = Setting(
    "LOCK_PASS_URL",
    None,
    "1",
    "0: the command does not inherit URL_VARIABLE (give dislock a lock role and a "
    "variable of its own, e.g. DISLOCK_URL)",
    config.parse_flag,
)
WAIT = Setting(
    "LOCK_WAIT_SECONDS",
    "wait_seconds",
    "0",
    "wait up to this long for a lease held elsewhere, then skip: {range} (needs lease; "
    "with schedule,lease the slot is taken once and the lease waited for)",
    bound=Bound(
        0.0,
        DAY,
        "s",
        "a run that would wait longer than a day for the one before it wants a schedule instead",
    ),
)
WAIT_POLL = Setting(
    "LOCK_WAIT_POLL_SECONDS",
    "wait_poll_seconds",
    "0.5",
    "poll cadence while waiting without LISTEN: {range}",
    bound=Bound(0.0, 3600.0, "s", "polling less than hourly is not waiting", low_open=True),
)
WAIT_LISTEN = Setting(
    "LOCK_WAIT_LISTEN",
    "wait_listen",
    "auto",
    "auto: woken by the release (LISTEN/NOTIFY) on a direct connection, polling behind "
    "a pooler such as PgBouncer; 1 always; 0 never",
    config.parse_auto_flag,
)
SLOTS = Setting(
    "LOCK_SLOTS",
    "slots",
    "1",
    "up to N holders of the lease at once: {range}",
    bound=Bound(
        1,
        1000,
        "",
        "more holders than this at once is not a lock any more; it also bounds the array the "
        "slot-taking statement is sent",
        integer=True,
    ),
)
GROUP = Setting(
    "LOCK_GROUP",
    "group",
    "-",
    "NAME:N: at most N runs at once among every key naming group NAME, whatever its "
    "strategy; a run finding the group full is refused (or waits, LOCK_WAIT_SECONDS)",
    _group,
    as_text=True,
)
REPLACE = Setting(
    "LOCK_REPLACE",
    "replace",
    "0",
    "1: a lease held by a live holder is taken over: its command is stopped (it exits 75) "
    "and this one starts once it is gone (needs lease; not with LOCK_SLOTS)",
    config.parse_flag,
)
CONFLICT_EXIT_CODE = Setting(
    "LOCK_CONFLICT_EXIT_CODE",
    None,
    "0",
    "exit status when the lock is held elsewhere: {range}",
    bound=Bound(0, 255, "", "an exit status is one byte", integer=True),
)
CONNECT_PATIENCE = Setting(
    "LOCK_CONNECT_PATIENCE_SECONDS",
    "connect_patience_seconds",
    "30",
    "retry a refused connection (too many connections, server starting or restarting) "
    "this long ({range}), never past the schedule slot; 0: fail at once",
    bound=Bound(
        0.0,
        3600.0,
        "s",
        "0 reports the first refusal; waiting out a busy server for longer than an hour is a "
        "mistake (a schedule lock never waits past its slot anyway)",
    ),
)
HISTORY = Setting(
    "LOCK_HISTORY",
    "history",
    "0",
    "1: record each run in the history table (dislockctl init --history)",
    config.parse_flag,
)
HISTORY_TABLE = Setting(
    "LOCK_HISTORY_TABLE",
    "history_table",
    "derived",
    "default: <LOCK_TABLE>_history",
    _prefixed(config.parse_table),
)
LOG_LEVEL = Setting(
    "CRONJOB_LOCK_LOG_LEVEL", None, "WARNING", "DEBUG, INFO, WARNING, ERROR, CRITICAL"
)
METRICS_TEXTFILE = Setting(
    "DISLOCK_METRICS_TEXTFILE",
    None,
    "-",
    "after each run, write its metrics to this node_exporter textfile (e.g. .../dislock.prom)",
    lambda name, raw: raw.strip(),
)
CONNECT_TIMEOUT = Setting(
    "",
    "connect_timeout_seconds",
    "10",
    "give up connecting after this long (unless the URL sets connect_timeout)",
    bound=Bound(
        0.0,
        3600.0,
        "s",
        "an hour is longer than any cron run should wait for a database",
        low_open=True,
    ),
)

# Collected rather than listed again: the order of the entries above is the table's.
SETTINGS = tuple(value for value in dict(globals()).values() if isinstance(value, Setting))
"""Every setting, in the order ``--help`` lists them; a new one is one entry above."""

VARIABLES = tuple(setting for setting in SETTINGS if setting.name)
"""Every variable the wrapper reads (the URL's aside: its name is the wrapper's first
argument)."""

NUMBERS = tuple(setting for setting in SETTINGS if setting.bound is not None)
"""Every numeric setting, checked by its bound wherever it enters."""

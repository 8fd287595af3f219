"""The command-line wrapper's configuration, read from environment variables.

Every variable is checked before anything runs, by its entry of
``dislock.core.variables``; a bad one raises ``ConfigurationError`` with one line
naming the variable and its value (the database URL excepted: it is never shown).
Here: which variables a run reads (by its strategies), and the rules that join
several of them, named after the variables.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from dislock.core import config, variables
from dislock.core.context import DEFAULT_TABLE, LockContext, default_owner
from dislock.core.dsn import parse_dsn
from dislock.core.errors import ConfigurationError
from dislock.core.supervision import check_command
from dislock.core.variables import LOG_LEVEL, Variable
from dislock.core.waiting import check_waiting

if TYPE_CHECKING:
    from dislock.core.cron_zone import CronZone

DEFAULT_TTL_SECONDS = 60.0
"""The lease's TTL when ``RUN_LOCK_TTL_SECONDS`` is unset (``LockContext`` has none)."""
DEFAULT_STRATEGY = config.SCHEDULE
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class WrapperSettings(NamedTuple):
    """Everything the wrapper needs, validated: the locks' context and the wrapper's own."""

    url_variable: str
    command: tuple[str, ...]
    strategies: tuple[str, ...]
    context: LockContext
    """What the locks are taken with, this run's owner token included."""
    conflict_exit_code: int = 0
    cron_zone: CronZone | None = None
    """The zone the schedule is read in and where that came from (``CRON_TZ``, else
    the local zone); the context holds the same zone."""
    pass_url: bool = True
    """``LOCK_PASS_URL``: whether the command inherits the URL variable (as in 0.1.0)."""

    def __repr__(self) -> str:
        return f"WrapperSettings(command={self.command!r}, context={self.context!r}, ...)"


def parse_log_level(environ: Mapping[str, str]) -> tuple[int, str | None]:
    """The logging level, and a warning to log when the variable was unusable."""
    raw = (environ.get(LOG_LEVEL.name) or "").strip()
    if not raw:
        return logging.WARNING, None
    if raw.upper() in LOG_LEVELS:
        return logging.getLevelName(raw.upper()), None
    return logging.WARNING, (
        f"{LOG_LEVEL.name}={raw!r} is not one of {', '.join(LOG_LEVELS)}; using WARNING"
    )


def read_database_url(url_variable: str, environ: Mapping[str, str]) -> str:
    """The URL held by the variable named ``url_variable``, checked to parse."""
    if "://" in url_variable or "=" in url_variable:
        raise ConfigurationError(
            "the first argument must be the NAME of an environment variable holding the "
            "database URL (e.g. DATABASE_URL), not the URL itself"
        )
    if not url_variable.strip():
        raise ConfigurationError("the first argument (the database URL variable) is empty")
    url = environ.get(url_variable)
    if url is None or not url.strip():
        raise ConfigurationError(f"environment variable {url_variable} is unset or empty")
    try:
        parse_dsn(url)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{url_variable}: {exc}") from None
    return url


def read_table(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``LOCK_TABLE``, or the default table."""
    parts: tuple[str, ...] | None = variables.TABLE.read(environ)
    return DEFAULT_TABLE if parts is None else parts


def read_history_table(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """``LOCK_HISTORY_TABLE``, or None for the default next to the lock table."""
    parts: tuple[str, ...] | None = variables.HISTORY_TABLE.read(environ)
    return parts


def read_wrapper_settings(
    url_variable: str, command: Sequence[str], environ: Mapping[str, str]
) -> WrapperSettings:
    """Validate the wrapper's arguments and environment, in the order users fix them."""
    url = read_database_url(url_variable, environ)
    argv = tuple(check_command(command))

    key = variables.KEY
    lock_key = key.read(environ)
    if lock_key is None:
        raise ConfigurationError(
            f"{key.name} is unset or empty: name the lock, e.g. {key.name}=nightly"
        )
    strategies: tuple[str, ...] = variables.STRATEGY.read(environ) or (DEFAULT_STRATEGY,)
    fields: dict[str, Any] = {
        "url": url,
        "lock_key": lock_key,
        "owner": default_owner(),
        "table_parts": read_table(environ),
    }

    zone = None
    if config.SCHEDULE in strategies:
        fields["schedule"] = _required_schedule(environ)
        zone = read_cron_zone(environ)
    if config.LEASE in strategies:
        fields.update(_lease_timing(environ))

    jitter = _read(fields, variables.JITTER, environ)
    if "schedule" in fields and jitter is not None:
        from dislock.core.cron import check_jitter

        check_jitter(
            fields["schedule"],
            jitter,
            jitter_name=variables.JITTER.name,
            schedule_name=variables.SCHEDULE.name,
        )
    for variable in (
        variables.LEASE_LOSS,
        variables.MAX_RUNTIME,
        variables.RETRIES,
        variables.RETRY_DELAY,
        variables.OUTPUT_TAIL,
        variables.FENCING,
        variables.HISTORY,
    ):
        _read(fields, variable, environ)
    if fields.get("output_tail_bytes") and not fields.get("history"):
        raise ConfigurationError(
            f"{variables.OUTPUT_TAIL.name} keeps a failed run's output in its history row:"
            f" it needs {variables.HISTORY.name}=1 (and dislockctl init --history)"
        )
    _read(fields, variables.HISTORY_TABLE, environ)
    pass_url = read_pass_url(environ)
    if fields.get("history") and "schedule" not in fields:
        # A lease-only job's history still records its schedule, for `dislockctl missed`.
        schedule = _read(fields, variables.SCHEDULE, environ)
        if schedule is not None:
            zone = read_cron_zone(environ)  # and the zone it is read in, as for a slot
    _read(fields, variables.START_DEADLINE, environ)
    if fields.get("retries") or fields.get("start_deadline_seconds") is not None:
        from dislock.core.retries import check_retries

        check_retries(
            strategies,
            fields.get("retries", 0),
            fields.get("start_deadline_seconds"),
            names=(variables.RETRIES.name, variables.START_DEADLINE.name),
        )
    if _read(fields, variables.AFTER, environ):
        from dislock.core.after import check_after

        check_after(
            fields["after"],
            history=bool(fields.get("history")),
            schedule=fields["schedule"] if config.SCHEDULE in strategies else None,
            names=(
                variables.AFTER.name,
                f"{variables.HISTORY.name}=1 (and dislockctl init --history)",
                f"{variables.STRATEGY.name}=schedule (or schedule,lease)",
            ),
        )
    conflict_exit_code = read_waiting(environ, strategies, fields)
    _read(fields, variables.CONNECT_PATIENCE, environ)
    if zone is not None:
        fields["cron_tz"] = zone.tz
    context = LockContext(**fields)
    return WrapperSettings(
        url_variable, argv, strategies, context, conflict_exit_code, zone, pass_url
    )


def _read(fields: dict[str, Any], variable: Variable, environ: Mapping[str, str]) -> Any:
    """``variable``'s value into its field, when it is set (else the field's default
    stands, the same as the variable's)."""
    value = variable.read(environ)
    if value is not None and variable.field is not None:
        fields[variable.field] = value
    return value


def _required_schedule(environ: Mapping[str, str]) -> str:
    schedule: str | None = variables.SCHEDULE.read(environ)
    if schedule is None:
        name = variables.SCHEDULE.name
        raise ConfigurationError(
            f"{name} is unset or empty, but the schedule strategy needs it "
            f"(e.g. {name}='0 3 * * *')"
        )
    return schedule


def _lease_timing(environ: Mapping[str, str]) -> dict[str, float]:
    """The lease's TTL and heartbeat, the heartbeat derived from the TTL when unset."""
    ttl_variable, interval_variable = variables.TTL, variables.HEARTBEAT
    ttl: float | None = ttl_variable.read(environ)
    interval: float | None = interval_variable.read(environ)
    if ttl is None:
        ttl = DEFAULT_TTL_SECONDS
    if interval is None:
        interval = config.derived_interval(
            ttl,
            ttl_name=f"{ttl_variable.name}={ttl_variable.text(environ)!r}",
            advice=f"set {interval_variable.name} too",
        )
    else:
        config.check_interval(ttl, interval, interval_name=interval_variable.name)
    return {"run_ttl_seconds": ttl, "lease_interval_seconds": interval}


def read_pass_url(environ: Mapping[str, str]) -> bool:
    """``LOCK_PASS_URL``: on unless set to an off value. Jobs that need the database
    for their own work got the URL from 0.1.0, so only a fleet with a lock role of
    its own turns it off, keeping that credential from the command."""
    value: bool | None = variables.PASS_URL.read(environ)
    return True if value is None else value


def read_waiting(
    environ: Mapping[str, str], strategies: Sequence[str], fields: dict[str, Any]
) -> int:
    """``LOCK_WAIT_SECONDS``, ``LOCK_WAIT_POLL_SECONDS``, ``LOCK_WAIT_LISTEN``,
    ``LOCK_SLOTS``, ``LOCK_GROUP`` and ``LOCK_REPLACE`` into ``fields``;
    ``LOCK_CONFLICT_EXIT_CODE`` returned."""
    wait = _read(fields, variables.WAIT, environ)
    _read(fields, variables.WAIT_POLL, environ)
    _read(fields, variables.WAIT_LISTEN, environ)
    slots = _read(fields, variables.SLOTS, environ)
    group = _read(fields, variables.GROUP, environ)
    replace = _read(fields, variables.REPLACE, environ)
    if replace and slots is not None and slots > 1:
        raise ConfigurationError(
            f"{variables.REPLACE.name}=1 takes over a lease's one holder: it cannot be"
            f" combined with {variables.SLOTS.name}={slots}"
        )
    code: int | None = variables.CONFLICT_EXIT_CODE.read(environ)
    try:
        check_waiting(
            strategies,
            wait or 0.0,
            slots or 1,
            bool(replace),
            group=group is not None,
            after=bool(fields.get("after")),
        )
    except ConfigurationError as exc:
        name = variables.STRATEGY.name
        raise ConfigurationError(f"{name}={','.join(strategies)!r}: {exc}") from None
    return 0 if code is None else code


def read_cron_zone(environ: Mapping[str, str]) -> CronZone:
    """The zone cron reads the crontab in: ``CRON_TZ``, else ``TZ``, else the system zone."""
    from dislock.core.cron_zone import cron_zone

    return cron_zone(environ)

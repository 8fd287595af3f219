"""The command-line wrapper's configuration, read from environment variables.

Every variable is checked before anything runs; a bad one raises
``ConfigurationError`` with one line naming the variable and its value (the
database URL excepted: it is never shown).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from dislock.core import bounds, config
from dislock.core.context import LeaseLossPolicy, LockContext, default_owner
from dislock.core.dsn import parse_dsn
from dislock.core.errors import ConfigurationError
from dislock.core.patience import DEFAULT_CONNECT_PATIENCE
from dislock.core.supervision import check_command
from dislock.core.waiting import DEFAULT_POLL_SECONDS, check_waiting

if TYPE_CHECKING:
    from dislock.core.cron_zone import CronZone

DEFAULT_TTL_SECONDS = 60.0
DEFAULT_TABLE = "key_value"
DEFAULT_STRATEGY = config.SCHEDULE
LOG_LEVEL_VARIABLE = "CRONJOB_LOCK_LOG_LEVEL"
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
    raw = environ.get(LOG_LEVEL_VARIABLE, "").strip()
    if not raw:
        return logging.WARNING, None
    if raw.upper() in LOG_LEVELS:
        return logging.getLevelName(raw.upper()), None
    return logging.WARNING, (
        f"{LOG_LEVEL_VARIABLE}={raw!r} is not one of {', '.join(LOG_LEVELS)}; using WARNING"
    )


def _variable(environ: Mapping[str, str], name: str) -> str | None:
    """A variable's value; set-but-blank counts as unset."""
    value = environ.get(name)
    return value if value is not None and value.strip() else None


def read_database_url(url_variable: str, environ: Mapping[str, str]) -> str:
    """The URL held by the variable named ``url_variable``, checked to parse."""
    if "://" in url_variable or "=" in url_variable:
        raise ConfigurationError(
            "the first argument must be the NAME of an environment variable holding the "
            "database URL (e.g. DATABASE_URL), not the URL itself"
        )
    if not url_variable.strip():
        raise ConfigurationError("the first argument (the database URL variable) is empty")
    url = _variable(environ, url_variable)
    if url is None:
        raise ConfigurationError(f"environment variable {url_variable} is unset or empty")
    try:
        parse_dsn(url)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{url_variable}: {exc}") from None
    return url


def read_table(environ: Mapping[str, str]) -> tuple[str, ...]:
    raw_table = _variable(environ, "LOCK_TABLE") or DEFAULT_TABLE
    try:
        return config.parse_table(raw_table)
    except ConfigurationError as exc:
        raise ConfigurationError(f"LOCK_TABLE={raw_table!r}: {exc}") from None


def read_history_table(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """``LOCK_HISTORY_TABLE``, or None for the default next to the lock table."""
    raw = _variable(environ, "LOCK_HISTORY_TABLE")
    if raw is None:
        return None
    try:
        return config.parse_table(raw)
    except ConfigurationError as exc:
        raise ConfigurationError(f"LOCK_HISTORY_TABLE={raw!r}: {exc}") from None


def read_wrapper_settings(
    url_variable: str, command: Sequence[str], environ: Mapping[str, str]
) -> WrapperSettings:
    """Validate the wrapper's arguments and environment, in the order users fix them."""
    url = read_database_url(url_variable, environ)
    argv = tuple(check_command(command))

    lock_key = _variable(environ, "LOCK_KEY")
    if lock_key is None:
        raise ConfigurationError("LOCK_KEY is unset or empty: name the lock, e.g. LOCK_KEY=nightly")
    bounds.check_key("LOCK_KEY", lock_key)

    raw_strategy = _variable(environ, "LOCK_STRATEGY") or DEFAULT_STRATEGY
    try:
        strategies = config.normalize_strategies(raw_strategy)
    except ConfigurationError as exc:
        raise ConfigurationError(f"LOCK_STRATEGY={raw_strategy!r}: {exc}") from None

    table_parts = read_table(environ)

    schedule = zone = None
    if config.SCHEDULE in strategies:
        raw_schedule = _variable(environ, "CRON_SCHEDULE")
        if raw_schedule is None:
            raise ConfigurationError(
                "CRON_SCHEDULE is unset or empty, but the schedule strategy needs it "
                "(e.g. CRON_SCHEDULE='0 3 * * *')"
            )
        from dislock.core.cron import check_cron

        schedule = check_cron(raw_schedule, name="CRON_SCHEDULE")
        zone = read_cron_zone(environ)

    ttl = interval = None
    if config.LEASE in strategies:
        raw_ttl = _variable(environ, "RUN_LOCK_TTL_SECONDS")
        ttl = DEFAULT_TTL_SECONDS if raw_ttl is None else bounds.check_number(bounds.TTL, raw_ttl)
        raw_interval = _variable(environ, "LOCK_LEASE_INTERVAL")
        if raw_interval is None:
            interval = config.derive_lease_interval(ttl)
            if interval > ttl:
                raise ConfigurationError(
                    f"RUN_LOCK_TTL_SECONDS={raw_ttl!r} is shorter than the 1 s minimum "
                    "heartbeat: set LOCK_LEASE_INTERVAL too"
                )
        else:
            interval = bounds.check_number(bounds.HEARTBEAT, raw_interval)
            config.check_interval(ttl, interval, interval_name="LOCK_LEASE_INTERVAL")

    raw_jitter = environ.get("LOCK_JITTER_SECONDS", "").strip()
    jitter = bounds.check_number(bounds.JITTER, raw_jitter) if raw_jitter else 0.0
    if schedule is not None:
        from dislock.core.cron import check_jitter

        check_jitter(
            schedule, jitter, jitter_name="LOCK_JITTER_SECONDS", schedule_name="CRON_SCHEDULE"
        )

    raw_policy = _variable(environ, "LOCK_ON_LEASE_LOSS") or LeaseLossPolicy.TERMINATE.value
    policy = LeaseLossPolicy.parse(raw_policy, name="LOCK_ON_LEASE_LOSS")
    fencing = config.parse_flag("LOCK_FENCING", environ.get("LOCK_FENCING", ""))
    history = config.parse_flag("LOCK_HISTORY", environ.get("LOCK_HISTORY", ""))
    history_table = read_history_table(environ)
    pass_url = read_pass_url(environ)
    raw_schedule = _variable(environ, "CRON_SCHEDULE")
    if history and schedule is None and raw_schedule is not None:
        # A lease-only job's history still records its schedule, for `dislockctl missed`.
        from dislock.core.cron import check_cron

        schedule = check_cron(raw_schedule, name="CRON_SCHEDULE")
        zone = read_cron_zone(environ)  # and the zone it is read in, as for a slot
    waiting = read_waiting(environ, strategies)
    raw_patience = _variable(environ, "LOCK_CONNECT_PATIENCE_SECONDS")
    patience = (
        DEFAULT_CONNECT_PATIENCE
        if raw_patience is None
        else bounds.check_number(bounds.CONNECT_PATIENCE, raw_patience)
    )

    conflict_exit_code = waiting.pop("conflict_exit_code")
    context = LockContext(
        url=url,
        table_parts=table_parts,
        lock_key=lock_key,
        owner=default_owner(),
        schedule=schedule,
        run_ttl_seconds=ttl,
        lease_interval_seconds=interval,
        jitter_max_seconds=jitter,
        lease_loss_policy=policy,
        fencing=fencing,
        history=history,
        history_table=history_table,
        cron_tz=None if zone is None else zone.tz,
        connect_patience_seconds=patience,
        **waiting,
    )
    return WrapperSettings(
        url_variable, argv, strategies, context, conflict_exit_code, zone, pass_url
    )


def read_pass_url(environ: Mapping[str, str]) -> bool:
    """``LOCK_PASS_URL``: on unless set to an off value. Jobs that need the database
    for their own work got the URL from 0.1.0, so only a fleet with a lock role of
    its own turns it off, keeping that credential from the command."""
    raw = _variable(environ, "LOCK_PASS_URL")
    return True if raw is None else config.parse_flag("LOCK_PASS_URL", raw)


def read_waiting(environ: Mapping[str, str], strategies: Sequence[str]) -> dict[str, Any]:
    """``LOCK_WAIT_SECONDS``, ``LOCK_WAIT_POLL_SECONDS``, ``LOCK_WAIT_LISTEN``,
    ``LOCK_SLOTS`` and ``LOCK_CONFLICT_EXIT_CODE``, as ``LockContext`` and
    ``WrapperSettings`` fields."""
    raw_wait = _variable(environ, "LOCK_WAIT_SECONDS")
    wait = 0.0 if raw_wait is None else bounds.check_number(bounds.WAIT, raw_wait)
    raw_poll = _variable(environ, "LOCK_WAIT_POLL_SECONDS")
    poll = (
        DEFAULT_POLL_SECONDS
        if raw_poll is None
        else bounds.check_number(bounds.WAIT_POLL, raw_poll)
    )
    listen = config.parse_auto_flag("LOCK_WAIT_LISTEN", environ.get("LOCK_WAIT_LISTEN", ""))
    raw_slots = _variable(environ, "LOCK_SLOTS")
    slots = 1 if raw_slots is None else bounds.check_count(bounds.SLOTS, raw_slots)
    raw_code = _variable(environ, "LOCK_CONFLICT_EXIT_CODE")
    code = 0 if raw_code is None else bounds.check_count(bounds.CONFLICT_EXIT_CODE, raw_code)
    try:
        check_waiting(strategies, wait, slots)
    except ConfigurationError as exc:
        raise ConfigurationError(f"LOCK_STRATEGY={','.join(strategies)!r}: {exc}") from None
    return {
        "wait_seconds": wait,
        "wait_poll_seconds": poll,
        "wait_listen": listen,
        "slots": slots,
        "conflict_exit_code": code,
    }


def read_cron_zone(environ: Mapping[str, str]) -> CronZone:
    """The zone cron reads the crontab in: ``CRON_TZ``, else ``TZ``, else the system zone."""
    from dislock.core.cron_zone import cron_zone

    return cron_zone(environ)

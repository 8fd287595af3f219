"""The command-line wrapper's configuration, read from environment variables: which
variables a run reads (by its strategies).  Each is checked before anything runs, by its
entry of ``dislock.core.variables`` and then ``LockContext`` (the rules joining several);
a bad one raises ``ConfigurationError`` naming it (and its value, the URL excepted), as
does a variable named like a setting but misspelled (``dislock.core.unknown_variables``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from dislock.core import config, variables
from dislock.core.context import DEFAULT_TABLE, LockContext, context_from_environment, default_owner
from dislock.core.dsn import parse_dsn
from dislock.core.errors import ConfigurationError
from dislock.core.setting import Setting
from dislock.core.supervision import check_command
from dislock.core.unknown_variables import Unknown, typo_error, unknown_variables
from dislock.core.variables import LOG_LEVEL

if TYPE_CHECKING:
    from dislock.core.cron_zone import CronZone

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
    """The zone the schedule is read in and where that came from."""
    pass_url: bool = True
    """``LOCK_PASS_URL``: whether the command inherits the URL variable (as in 0.1.0)."""
    unknown: tuple[Unknown, ...] = ()
    """Variables named like dislock's that no setting is (none a likely typo): warned of."""

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
        raise ConfigurationError(
            f"environment variable {url_variable} is unset or empty (or set but not exported:"
            " a file read with `.` needs `set -a` before its lines)"
        )
    try:
        parse_dsn(url)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{url_variable}: {exc}") from None
    return url


def read_table(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``LOCK_TABLE``, or the default table."""
    return variables.TABLE.read(environ) or DEFAULT_TABLE


_READ_BY_STRATEGY = (variables.KEY, variables.SCHEDULE, variables.TTL, variables.HEARTBEAT)
"""Fields read apart from the rest: whether they are needed depends on the strategies."""


def read_wrapper_settings(
    url_variable: str, command: Sequence[str], environ: Mapping[str, str]
) -> WrapperSettings:
    """Validate the wrapper's arguments and environment, in the order users fix them:
    the misspelled variables, the URL, the command, the key, then the context and what
    its strategies allow."""
    unknown = unknown_variables(environ, url_variable)
    if (typo := typo_error(unknown)) is not None:
        raise typo
    url = read_database_url(url_variable, environ)
    argv = tuple(check_command(command))
    key = variables.KEY
    lock_key = key.given(environ)
    if lock_key is None:
        raise ConfigurationError(
            f"{key.name} is unset or empty: name the lock, e.g. {key.name}=nightly"
        )
    strategies: tuple[str, ...] = variables.STRATEGY.read(environ) or (config.SCHEDULE,)
    fields: dict[str, Any] = {"url": url, "lock_key": lock_key, "owner": default_owner()}
    if config.SCHEDULE in strategies:
        schedule = variables.SCHEDULE
        fields["schedule"] = schedule.given(environ)
        if fields["schedule"] is None:
            raise ConfigurationError(
                f"{schedule.name} is unset or empty, but the schedule strategy needs it "
                f"(e.g. {schedule.name}='0 3 * * *')"
            )
    if config.LEASE in strategies:
        # The wrapper's lease has a TTL by default; LockContext's None means no lease.
        fields["run_ttl_seconds"] = variables.TTL.text(environ) or variables.TTL.default
        _read(fields, variables.HEARTBEAT, environ)
    for setting in variables.VARIABLES:
        readable = setting.reader is not None or setting.bound is not None  # CRON_TZ: below
        if setting.field is not None and readable and setting not in _READ_BY_STRATEGY:
            _read(fields, setting, environ)
    if "schedule" not in fields and fields.get("history"):
        # A lease-only job's history still records its schedule, for `dislockctl missed`.
        _read(fields, variables.SCHEDULE, environ)
    zone = None
    if "schedule" in fields:
        from dislock.core.cron_zone import cron_zone

        zone = cron_zone(environ)  # CRON_TZ, else TZ, else the system zone, as cron reads it
        fields["cron_tz"] = zone.tz
    context = context_from_environment(strategies, **fields)
    code: int | None = variables.CONFLICT_EXIT_CODE.read(environ)
    # On unless turned off: jobs that need the database for their own work got the
    # URL from 0.1.0, so only a fleet with a lock role of its own keeps it from them.
    pass_url: bool | None = variables.PASS_URL.read(environ)
    return WrapperSettings(
        url_variable, argv, strategies, context, code or 0, zone, pass_url is not False, unknown
    )


def _read(fields: dict[str, Any], setting: Setting, environ: Mapping[str, str]) -> None:
    """``setting``'s text or value into its field when its variable is set (else the
    field's default stands, the same as the variable's)."""
    value = setting.given(environ)
    if value is not None and setting.field is not None:
        fields[setting.field] = value

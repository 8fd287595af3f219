"""One-line explanations of database failures, for operators reading cron mail.

Errors are classified by SQLSTATE rather than by exception class so that the
wording does not depend on the driver's class hierarchy; every message is
scrubbed of the URL's secrets.
"""

from __future__ import annotations

from dislock.core.dsn import redact_dsn, scrub
from dislock.core.errors import DatabaseUnreachableError
from dislock.core.sql import create_table_sql

_UNDEFINED_TABLE = "42P01"
_UNDEFINED_COLUMN = "42703"
_UNDEFINED_SCHEMA = "3F000"
_INSUFFICIENT_PRIVILEGE = "42501"
_READ_ONLY_TRANSACTION = "25006"
_NOT_IN_PREREQUISITE_STATE = "55000"  # e.g. a standby asked for its WAL position


def describe_database_error(error: BaseException, *, table_parts: tuple[str, ...], url: str) -> str:
    """What went wrong, what to do about it, in one line and without secrets."""
    table = ".".join(table_parts)
    # Only the driver's own words can carry a secret (libpq quotes what it parsed);
    # scrubbing just them keeps a short password from mangling the rest.
    detail = scrub(" ".join(str(error).split()), url) or type(error).__name__
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(error, DatabaseUnreachableError):
        return _unreachable(error, url)
    if sqlstate in (_UNDEFINED_TABLE, _UNDEFINED_SCHEMA):
        message = (
            f"lock table {table} does not exist; create it with `dislockctl URL_VARIABLE init`"
            f" or: {create_table_sql(table_parts)}"
        )
    elif sqlstate == _UNDEFINED_COLUMN and "fence" in detail:
        message = (
            f"lock table {table} has no fence column, which fencing tokens need; add it with "
            "`dislockctl URL_VARIABLE init --fencing`"
        )
    elif sqlstate == _UNDEFINED_COLUMN:
        message = (
            f"lock table {table} lacks a column dislock needs ({detail}); it must have "
            "key text PRIMARY KEY, value text NOT NULL, expire_at timestamptz NOT NULL"
        )
    elif sqlstate == _INSUFFICIENT_PRIVILEGE:
        message = (
            f"permission denied on lock table {table} ({detail}); the role needs SELECT, "
            "INSERT and UPDATE on it"
        )
    elif sqlstate == _READ_ONLY_TRANSACTION or (
        sqlstate == _NOT_IN_PREREQUISITE_STATE and "recovery is in progress" in detail
    ):
        message = (
            f"the database is read-only ({detail}); point the URL at the primary, not a replica"
        )
    elif sqlstate is None and type(error).__name__ in ("OperationalError", "ConnectionTimeout"):
        message = f"cannot connect to the database ({redact_dsn(url)}): {detail}"
    else:
        message = f"{type(error).__name__}: {detail}"
    return message


def _unreachable(error: DatabaseUnreachableError, url: str) -> str:
    """A wrapper that gave up connecting: for how long, and, when the slot's end made
    it give up, which slot went by (the command did not run in it here)."""
    detail = scrub(error.detail, url)
    where = redact_dsn(url)
    if error.slot_end is not None:
        return (
            f"the schedule slot of {error.lock_key!r} ending {error.slot_end.isoformat()}"
            f" ended while the database was unreachable for {error.unreachable_for:.1f} s"
            f" ({where}); the command did not run: {detail}"
        )
    return (
        f"cannot connect to the database ({where}): unreachable for"
        f" {error.unreachable_for:.1f} s, {error.attempts} attempts"
        f" (LOCK_CONNECT_PATIENCE_SECONDS={error.patience:g}): {detail}"
    )

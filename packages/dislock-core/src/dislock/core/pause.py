"""Fleet-wide pause of a lock key: a row in the lock table that acquisitions respect.

``dislockctl pause KEY`` writes ``cronjob-lock:pause:KEY`` with the reason in
``value`` and the end of the pause in ``expire_at``; every acquiring statement
(``dislock.core.lock_queries``) refuses to start while that row is live, and answers with
the reason in the same round trip.  ``resume`` deletes the row.  dislock 0.1.0
wrappers on the same table do not look at it: they keep starting the job.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from psycopg import sql

from dislock.core.errors import LockPausedError
from dislock.core.rows import pause_key

UNTIL_RESUMED = datetime(9999, 12, 31, tzinfo=timezone.utc)
"""``expire_at`` of a pause without an end.  (Not ``'infinity'``: psycopg cannot
load it into a datetime, and every reader of the table would fail on the row.)"""


def describe_until(until: datetime | None) -> str:
    """``until resumed``, or ``until`` and the end, to the nearest second (a pause
    ``--for 2h`` ends at a time with microseconds, which no one needs to read)."""
    if until is None or until >= UNTIL_RESUMED:
        return "until resumed"
    rounded = until.replace(microsecond=0)
    if until.microsecond >= 500_000:
        rounded += timedelta(seconds=1)
    return f"until {rounded.isoformat()}"


def paused_error(lock_key: str, reason: str | None, until: datetime | None) -> LockPausedError:
    why = f": {reason}" if reason else ""
    return LockPausedError(
        f"{lock_key!r} is paused {describe_until(until)}{why}", reason=reason or "", until=until
    )


def pause_statement(table_parts: tuple[str, ...], *, for_interval: bool) -> sql.Composed:
    """Params: key, reason, and ``seconds`` (``for_interval``) or ``until``.
    Writes (or replaces) the pause row; returns its end, or no row when that end
    is not in the future."""
    end = (
        sql.SQL("NOW() + make_interval(secs => %(seconds)s)")
        if for_interval
        else sql.SQL("%(until)s::timestamptz")
    )
    return sql.SQL(
        "INSERT INTO {table} AS held (key, value, expire_at)"
        " SELECT %(key)s, %(reason)s, {end} WHERE {end} > NOW()"
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at"
        " RETURNING held.expire_at"
    ).format(table=sql.Identifier(*table_parts), end=end)


def resume_statement(table_parts: tuple[str, ...]) -> sql.Composed:
    """Params: key. Deletes the pause row; returns whether it was still live."""
    return sql.SQL("DELETE FROM {} WHERE key = %(key)s RETURNING expire_at > NOW()").format(
        sql.Identifier(*table_parts)
    )


def pause_params(lock_key: str, reason: str, **end: object) -> dict[str, object]:
    return {"key": pause_key(lock_key), "reason": reason, **end}

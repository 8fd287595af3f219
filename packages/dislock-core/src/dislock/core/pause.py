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
from dislock.core.exchange import Exchange, Rows, read_flag
from dislock.core.rows import pause_key

UNTIL_RESUMED = datetime(9999, 12, 31, tzinfo=timezone.utc)
"""``expire_at`` of a pause without an end (not ``'infinity'``: ``limits.NEVER_EXPIRES``)."""


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


def _read_end(rows: Rows) -> datetime | None:
    if not rows:
        return None
    ((ends,),) = rows
    if not isinstance(ends, datetime):
        raise TypeError(f"a pause answered {ends!r} for its end")
    return ends


def pausing(
    table_parts: tuple[str, ...],
    lock_key: str,
    reason: str,
    *,
    seconds: float | None = None,
    until: datetime | None = None,
) -> Exchange[datetime | None]:
    """Write (or replace) ``lock_key``'s pause row, for ``seconds`` or ``until`` (else
    until resumed): its end, or None when that end is not in the future on the
    database's clock (nothing is then written)."""
    if seconds is not None:
        end = sql.SQL("NOW() + make_interval(secs => %(seconds)s)")
        params: dict[str, object] = {"seconds": seconds}
    else:
        end = sql.SQL("%(until)s::timestamptz")
        params = {"until": until or UNTIL_RESUMED}
    query = sql.SQL(
        "INSERT INTO {table} AS held (key, value, expire_at)"
        " SELECT %(key)s, %(reason)s, {end} WHERE {end} > NOW()"
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at"
        " RETURNING held.expire_at AS ends"
    ).format(table=sql.Identifier(*table_parts), end=end)
    return Exchange(query, {"key": pause_key(lock_key), "reason": reason, **params}, _read_end)


def resuming(table_parts: tuple[str, ...], lock_key: str) -> Exchange[bool]:
    """Delete ``lock_key``'s pause row: whether it was still live (paused)."""
    query = sql.SQL(
        "DELETE FROM {} WHERE key = %(key)s RETURNING expire_at > NOW() AS was_live"
    ).format(sql.Identifier(*table_parts))
    return Exchange(query, {"key": pause_key(lock_key)}, read_flag)

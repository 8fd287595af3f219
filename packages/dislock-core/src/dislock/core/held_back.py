"""A schedule slot held back by a key it comes after (``LockContext.after``,
``LOCK_AFTER``), as the run history records it: one event row per slot.

A refused start writes no lock row (``dislock.core.after``): without a trace, a
slot held back all along would read as one nobody started.  So the acquisition
that was held back records it, once per slot: the row's start is inserted only
while the key has no such row for the slot (``INSERT … WHERE NOT EXISTS``, one
index probe of ``(lock_key, started_at DESC)`` from the slot's start), then ended
as it started with outcome ``held_back``, as an operator's event is
(``dislock.core.operator_commands``: a granted role may insert a row's start columns, then end
it, not both at once).  Two wrappers refused at the same instant may each write
one; readers count the slot once.

The row: ``modes`` ``after`` (what the ``NOT EXISTS`` looks for), ``slot_end``,
``owner`` ``waiting for <key>`` (``waited_for`` reads it back), and the rest as a
run's; it commits asynchronously, and a failure is logged, never raised.  A role
granted before this outcome existed may not write it: the end is then ``late``
(``LATE_FALLBACK``), still a slot to look at; ``dislockctl grant`` again fixes it.
"""

from __future__ import annotations

from datetime import datetime

from psycopg import sql

from dislock.core.exchange import Exchange, Rows

HELD_BACK = "held_back"
"""The outcome of a held-back slot's event row."""

MODES = "after"
"""The ``modes`` of that row: no run's (``schedule``, ``lease``) nor a pause's."""

LATE_FALLBACK = "late"
"""The outcome written instead when the role may not write ``held_back``."""

_WAITING = "waiting for "


def owner_of(key: str) -> str:
    """The row's ``owner``: the key the slot waited for."""
    return f"{_WAITING}{key}"


def waited_for(owner: str | None) -> str | None:
    """The key a held-back row's ``owner`` names (None: not one of ours)."""
    if owner is None or not owner.startswith(_WAITING):
        return None
    return owner[len(_WAITING) :]


# As ``dislock.core.history``'s writes: committed asynchronously.
_ASYNC_COMMIT = sql.SQL("(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit")


def record_start(
    history: tuple[str, ...],
    *,
    lock_key: str,
    key: str,
    slot_start: datetime,
    slot_end: datetime,
    host: str,
    pid: int,
    cron: str | None,
    cron_tz: str | None,
) -> Exchange[int | None]:
    """Insert the start of the held-back event of the slot ``slot_start`` to
    ``slot_end`` of ``lock_key``, waiting for ``key``, unless the slot has one: the
    new row's id, or None (already recorded)."""
    query = sql.SQL(
        "INSERT INTO {table} (lock_key, modes, slot_end, owner, host, pid, started_at, cron,"
        " cron_tz) SELECT %(lock_key)s, {modes}, %(slot_end)s, %(owner)s, %(host)s, %(pid)s,"
        " NOW(), %(cron)s, %(cron_tz)s FROM {async_commit}"
        " WHERE NOT EXISTS (SELECT FROM {table} AS e WHERE e.lock_key = %(lock_key)s"
        " AND e.started_at >= %(slot_start)s AND e.modes = {modes}"
        " AND e.slot_end = %(slot_end)s)"
        " RETURNING id"
    ).format(table=sql.Identifier(*history), modes=sql.Literal(MODES), async_commit=_ASYNC_COMMIT)
    params = {
        "lock_key": lock_key,
        "slot_start": slot_start,
        "slot_end": slot_end,
        "owner": owner_of(key),
        "host": host,
        "pid": pid,
        "cron": cron,
        "cron_tz": cron_tz,
    }
    from dislock.core import history_functions

    plain = Exchange(query, params, read_id)
    return history_functions.via(history, "held_back", plain, outcome=HELD_BACK)


def read_id(rows: Rows) -> int | None:
    """``record_start``'s answer."""
    return int(rows[0][0]) if rows else None


def record_end(history: tuple[str, ...], run_id: int, outcome: str = HELD_BACK) -> Exchange[None]:
    """The event's row ended as it started, with ``outcome`` (``HELD_BACK``, or
    ``LATE_FALLBACK`` for a role granted before it)."""
    query = sql.SQL(
        "UPDATE {} SET ended_at = started_at, outcome = %(outcome)s FROM {async_commit}"
        " WHERE id = %(id)s AND ended_at IS NULL"
    ).format(sql.Identifier(*history), async_commit=_ASYNC_COMMIT)
    from dislock.core import history_functions

    plain: Exchange[None] = Exchange(query, {"id": run_id, "outcome": outcome}, lambda rows: None)
    # (Through the function, the event's row was written ended: nothing left to do.)
    return history_functions.via(history, "end", plain)


def refused(error: BaseException) -> bool:
    """Whether the end failed because the role may not write the outcome (a grant
    from before it): insufficient_privilege, row-level security's refusal too."""
    return getattr(error, "sqlstate", None) == "42501"

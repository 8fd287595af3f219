"""``dislockctl rerun``: one more run of a key's current schedule slot, whatever became
of it (done, failed with its attempts used), taken by the next wrapper that starts,
on any machine.  A start deadline still holds: past it, that wrapper marks the slot
late instead (``LockContext.start_deadline_seconds``).

It rewrites the slot row as a failed attempt would reopen it (``dislock.core.retries``):
expired now, with the reopened mark of its slot, and as the run of an attempt 0, so
that a job with retries takes it as attempt 1 of a fresh count, and one without
takes it as it takes any expired row.  It refuses while a run of the key holds its
lease: the next wrapper would take the slot and then find the lease held, and the
slot would be spent without a run.  The operator's role and reason are written in
the row and, when there is a run history, as an event (``dislock.core.operator_commands``).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import NamedTuple

from psycopg import sql

from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.rows import lease_key, schedule_key


class Rerun(NamedTuple):
    """What the rerun statement found and did: the row it answers."""

    value: str | None
    """The slot row's value before (None: the key has no slot row)."""
    expire_at: datetime | None
    leased_by: str | None
    """The owner of a live lease of the key, which kept the slot as it was."""
    reopened: bool
    now: datetime


def _read(rows: Rows) -> Rerun:
    (row,) = rows
    found = Rerun._make(row)
    return found._replace(reopened=bool(found.reopened))


def rerun(table_parts: tuple[str, ...], lock_key: str) -> Exchange[Rerun]:
    """Open ``lock_key``'s live slot row for one more run, now, unless its lease is
    held (one statement; the role that runs it is named in the row)."""
    table = sql.Identifier(*table_parts)
    query = sql.SQL(
        "WITH before AS (SELECT value, expire_at FROM {table} WHERE key = %(key)s),"
        " leased AS (SELECT value FROM {table} WHERE key = %(lease)s AND expire_at > NOW()),"
        " reopened AS (UPDATE {table}"
        " SET value = 'rerun by ' || current_user || ' (attempt 0) (failed; retry in slot '"
        " || COALESCE((regexp_match(value, {slot}))[1],"
        " floor(extract(epoch FROM expire_at))::bigint::text)"
        " || ')', expire_at = NOW()"
        " WHERE key = %(key)s AND expire_at > NOW() AND NOT EXISTS (SELECT FROM leased)"
        " RETURNING key)"
        " SELECT {columns}"
    ).format(
        table=table,
        slot=sql.Literal(r" \(failed; retry in slot (\d+)\)$"),
        columns=select_list(
            Rerun._fields,
            value=sql.SQL("(SELECT value FROM before)"),
            expire_at=sql.SQL("(SELECT expire_at FROM before)"),
            leased_by=sql.SQL("(SELECT value FROM leased)"),
            reopened=sql.SQL("EXISTS (SELECT FROM reopened)"),
            now=sql.SQL("NOW()"),
        ),
    )
    params = {"key": schedule_key(lock_key), "lease": lease_key(lock_key)}
    return Exchange(query, params, _read)


def slot_end_of(value: str, expire_at: datetime) -> datetime:
    """The end of the slot a live slot row stands for: the slot its reopened mark
    names, else its ``expire_at`` (a taken slot row expires as its slot ends)."""
    return reopened_slot(value) or expire_at


def reopened_slot(value: str) -> datetime | None:
    """The end of the slot a slot row's value says is reopened for another attempt
    (by a failed attempt or a rerun), or None."""
    found = re.search(r" \(failed; retry in slot (\d{1,11})\)$", value)
    if found is None:
        return None
    try:
        return datetime.fromtimestamp(int(found.group(1)), timezone.utc)
    except (OverflowError, OSError, ValueError):  # a mark written by hand
        return None


def waiting(table_parts: tuple[str, ...], lock_key: str) -> Exchange[datetime | None]:
    """The end of ``lock_key``'s slot whose row waits for another attempt, if one does."""
    query = sql.SQL("SELECT value FROM {} WHERE key = %(key)s").format(sql.Identifier(*table_parts))

    def read(rows: Rows) -> datetime | None:
        return reopened_slot(rows[0][0]) if rows else None

    return Exchange(query, {"key": schedule_key(lock_key)}, read)

"""Changing a lock table in use (``grant``, ``revoke``, ``init``'s new column) without
making the fleet wait: a strong lock is asked for a moment at a time.

PostgreSQL grants table locks in the order they were asked for.  An ``ALTER TABLE``
or ``DROP POLICY`` needs the table's ACCESS EXCLUSIVE lock, so it waits for every
open transaction that has read the table; and while it waits, every statement that
comes after it on the table (each machine's acquisition and renewal) waits behind
it.  One role's idle ``BEGIN; SELECT … FROM locks`` would turn an operator's
``revoke`` of that very role into an outage of every team.  So such a transaction
sets a short ``lock_timeout`` (``SET_LOCK_TIMEOUT``): refused, it is rolled back,
the queue behind it drains, and it is tried again after a jittered pause within a
patience (``Tries``).  Out of patience, one line names who holds the table
(``holders``, ``busy``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from psycopg import sql

from dislock.core.bounds import escape
from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.patience import backoff_delay

LOCK_WAIT_MS = 100
"""How long one try waits for its lock, in milliseconds: the longest any other
statement on the table waits behind it, once per try."""

DEFAULT_PATIENCE = 30.0
"""Seconds ``grant``, ``revoke`` and ``init`` keep trying before they give up."""

SET_LOCK_TIMEOUT = sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{LOCK_WAIT_MS}ms"))
"""The first statement of each try's transaction."""


class Tries:
    """When to try again: jittered exponential pauses (those of the connection
    patience), none that would end past the deadline."""

    def __init__(self, patience: float, now: float, rng: random.Random | None = None) -> None:
        self.deadline = now + patience
        self.attempt = 0
        self._rng = rng

    def next_delay(self, now: float) -> float | None:
        """The pause before the next try (the last one at the deadline), or None:
        out of patience."""
        if now >= self.deadline:
            return None
        self.attempt += 1
        return min(backoff_delay(self.attempt - 1, self._rng), self.deadline - now)


class Holder(NamedTuple):
    """A session holding a lock on the table (or asking for one before us): the row
    ``holders`` answers."""

    pid: int | None
    """None: a prepared transaction (``PREPARE TRANSACTION``), which no session holds."""
    role: str
    application: str
    mode: str
    transaction_seconds: float | None
    """How long its transaction has been open; None where this role may not see it
    (another role's session, without ``pg_read_all_stats``)."""


# Holders before waiters, other roles' sessions before this role's own, oldest
# transaction first: the first is the likeliest to be in the way.  A session with no
# transaction age comes after those with one: either it was between statements when
# the activity view was read (pg_locks is read live, the view once: a fleet's wrappers
# take and drop the table's lock in milliseconds), or this role may not see its age.
_HOLDERS = sql.SQL(
    "SELECT {columns}"
    " FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'relation'"
    " AND l.relation IN (SELECT to_regclass(t) FROM unnest(%(tables)s::text[]) t)"
    " AND l.pid IS DISTINCT FROM pg_backend_pid()"
    " ORDER BY l.granted DESC, a.usename IS NOT DISTINCT FROM current_user,"
    " a.xact_start NULLS LAST, l.pid"
).format(
    columns=select_list(
        Holder._fields,
        pid=sql.SQL("l.pid"),
        role=sql.SQL("coalesce(a.usename, '')"),
        application=sql.SQL("coalesce(a.application_name, '')"),
        mode=sql.SQL("l.mode"),
        transaction_seconds=sql.SQL("extract(epoch FROM clock_timestamp() - a.xact_start)"),
    )
)


def _read_holders(rows: Rows) -> list[Holder]:
    holders: dict[object, Holder] = {}
    for row in map(Holder._make, rows):
        pid, seconds = row.pid, row.transaction_seconds
        if pid is None or pid not in holders:  # a session holding several locks: once
            holders[pid if pid is not None else object()] = Holder(
                None if pid is None else int(pid),
                str(row.role),
                str(row.application),
                str(row.mode),
                None if seconds is None else float(seconds),
            )
    return list(holders.values())


def holders(tables: Sequence[tuple[str, ...]]) -> Exchange[list[Holder]]:
    """Who holds or awaits a lock on any of ``tables`` (those that exist), oldest
    transaction first."""
    names = [sql.Identifier(*table).as_string(None) for table in tables]
    return Exchange(_HOLDERS, {"tables": names}, _read_holders)


def busy(what: str, table: Sequence[str], found: Sequence[Holder], waited: float) -> str:
    """The one line of a ``what`` (``revoke``, …) that gave up after ``waited`` seconds."""
    name = ".".join(table)
    head = f"{what} gave up after {waited:g} s: {name} stayed locked by others"
    if not found:
        return f"{head} (no session holds it now: run it again)"
    shown = [_describe(holder) for holder in found[:3]]
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    sessions = [holder.pid for holder in found if holder.pid is not None]
    end = f" (or SELECT pg_terminate_backend({sessions[0]}))" if sessions else ""
    return f"{head}: {'; '.join(shown)}{more}; end that transaction{end} and run it again"


def _describe(holder: Holder) -> str:
    if holder.pid is None:
        return (
            f"a prepared transaction ({holder.mode}: COMMIT PREPARED or ROLLBACK PREPARED"
            " one of SELECT gid FROM pg_prepared_xacts)"
        )
    role = escape(holder.role or "?")
    application = f", '{escape(holder.application)}'" if holder.application else ""
    seconds = holder.transaction_seconds
    age = "" if seconds is None else f", in a transaction open {seconds:.0f} s"
    return f"role '{role}' (pid {holder.pid}{application}, {holder.mode}{age})"

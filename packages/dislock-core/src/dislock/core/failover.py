"""What a PostgreSQL failover can take away, and how dislock keeps it from making two
holders (why, and what it costs: docs/guarantees.md, "Failover and replication").

Two decisions live here, both plain data for the shells to act on: a commit that
synchronous replication did not confirm is not a success (``not_replicated``
recognises the server's WARNING); and a lock delay after a change of server timeline
(Chubby's), during which the acquiring statements take no missing or expired row of a
key (``lock_delay``).  The metadata rows' keys do not start with ``cronjob-lock:``, so
``dislockctl ls`` and dislock 0.1.0 (which only read their own keys) never see them.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from psycopg import sql

from dislock.core.errors import NotReplicatedError
from dislock.core.exchange import Exchange, Rows, read_value, select_list
from dislock.core.limits import NEVER_EXPIRES, max_ttl_of

if TYPE_CHECKING:
    from psycopg.errors import Diagnostic

TIMELINE_KEY = "dislock:failover:timeline"
"""Metadata row: ``value`` is the server timeline last seen, ``expire_at`` the instant
it was first seen, where every key's lock delay starts (``NEVER_NOTICED``, long
ago, for the first timeline ever recorded, which starts none)."""

NEVER_NOTICED = sql.SQL("'epoch'::timestamptz")

TTL_KEY_PREFIX = "dislock:failover:ttl:"
"""Metadata rows ``<prefix><role>``: ``value`` is the longest lease TTL (seconds) that
role ever took a lease with, up to the table's maximum; they never expire.  One row
per role, so that no role can hold up another's acquisitions by locking a shared
row, nor lower another's record.  (dislock before 0.2.0's release kept one
``dislock:failover:longest-ttl`` row, with no maximum; it is no longer read.)"""

SCOPE_KEY_PREFIX = "dislock:failover:scope:"
"""Metadata rows ``<prefix><role>``, written by ``dislockctl grant`` alone: ``value``
is a regular expression (PostgreSQL's ARE) of the lock keys the role was granted.
A role's TTL record counts for the keys its scope matches; without a scope row, for
every key."""

TTL_RECORD = sql.SQL('({} || current_user::text COLLATE "default")').format(
    sql.Literal(TTL_KEY_PREFIX)
)
"""The key of the acquiring role's own TTL record.  ``current_user`` is a ``name``,
whose collation is "C": without the ``COLLATE`` the comparison with ``key`` would
be made in "C", which the primary key's index cannot answer, and every acquisition
would scan the whole table for its record."""

SYNCREP_FUNCTION = "SyncRepWaitForLSN"
"""The server function that waits for synchronous standbys (``syncrep.c``)."""

TIMELINE = sql.SQL("('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8")
"""The server's current timeline, from the name of the WAL segment it writes to (the
first eight hex digits of a segment name are its timeline).  Fails on a standby,
which cannot take locks anyway."""

CURRENT_TIMELINE = sql.SQL("SELECT {} AS timeline").format(TIMELINE)

TIMELINE_NOW: Exchange[int | None] = Exchange(CURRENT_TIMELINE, {}, read_value)
"""The server's current timeline, read by a holder that reconnected."""


def not_replicated(
    *, severity: str | None, source_function: str | None, message: str | None
) -> bool:
    """Whether a notice says the statement committed without its synchronous
    standbys confirming it.

    The server function that sends it is the signal: its name is never
    translated, unlike the message (``lc_messages``), which is only a fallback
    for servers that withhold source locations.
    """
    if (severity or "").upper() != "WARNING":
        return False
    if source_function:
        return source_function == SYNCREP_FUNCTION
    text = (message or "").lower()
    return "wait for synchronous replication" in text or (
        "synchronous replication" in text and "cancel" in text
    )


def unreplicated_notice(diag: Diagnostic) -> str | None:
    """The message of a psycopg notice that ``not_replicated`` recognises, else None."""
    if not not_replicated(
        severity=diag.severity_nonlocalized or diag.severity,
        source_function=diag.source_function,
        message=diag.message_primary,
    ):
        return None
    return diag.message_primary or ""


def unconfirmed(message: str | None) -> NotReplicatedError:
    """The error for a statement answered with such a notice."""
    return NotReplicatedError(
        "committed on the primary, but no synchronous standby confirmed it"
        f" ({message or 'the wait for synchronous replication was cancelled'})"
    )


def lock_delay(
    table: sql.Identifier, ttl: sql.Composable, lock_key: sql.Composable, record: sql.Composable
) -> tuple[sql.Composed, sql.SQL]:
    """The lock-delay fragment of an acquiring upsert on ``table``.

    Returns ``(ctes, calm)``: ``ctes`` are common table expressions for the
    statement's ``WITH`` clause (before the ``INSERT``), ``calm`` a condition for
    its row source (an acquisition with no candidate row neither inserts nor
    takes over anything).  ``ttl`` is the acquisition's own TTL in seconds (``0``
    for a schedule slot), ``lock_key`` its lock key (an expression), ``record`` the key
    of the role's TTL record (``TTL_RECORD``).  ``dislock_cap`` (the table's maximum
    TTL) is one of the expressions, for the acquiring statement to check its own TTL
    against.  The key's own delay (a scan over the roles' records and scopes) is
    computed only within the table's maximum TTL of a failover: ``CASE`` evaluates its
    branches lazily, and so does the scalar subquery of ``dislock_longest`` (what the
    rest costs: docs/guarantees.md).
    """
    ctes = sql.SQL(
        "dislock_server AS (SELECT {timeline} AS timeline),"
        " dislock_seen AS ("
        "SELECT value::int8 AS timeline, expire_at AS noticed"
        " FROM {table} WHERE key = {timeline_key}),"
        " dislock_cap AS (SELECT {cap} AS max_ttl),"
        # This key's delay: the longest TTL of the roles that may hold it.
        " dislock_longest AS (SELECT least((SELECT max_ttl FROM dislock_cap),"
        " greatest({ttl}::float8, coalesce({recorded}, 0))) AS ttl),"
        " {noting},"
        # A new timeline with a delay of zero for this key refuses nothing.  A
        # running delay is judged by the real time: NOW() is this transaction's
        # start, which can come before the commit that recorded the timeline
        # although this statement sees the row.  Past the table's maximum TTL
        # since the failover no key waits, and the key's own delay is not computed.
        # (One reference to each of the cap and the key's delay: every subquery of
        # the statement is set up on every execution, run or not.)
        " dislock_calm AS (SELECT NOT EXISTS ("
        "SELECT FROM dislock_seen s, dislock_server h"
        " WHERE CASE WHEN s.timeline = h.timeline AND clock_timestamp() >= s.noticed"
        " + make_interval(secs => (SELECT max_ttl FROM dislock_cap)) THEN false"
        " ELSE (SELECT ttl FROM dislock_longest) > CASE WHEN s.timeline <> h.timeline THEN 0"
        " ELSE EXTRACT(EPOCH FROM clock_timestamp() - s.noticed) END END) AS calm)"
    ).format(
        timeline=TIMELINE,
        table=table,
        timeline_key=sql.Literal(TIMELINE_KEY),
        cap=max_ttl_of(table),
        recorded=_recorded(table, lock_key),
        ttl=ttl,
        noting=_noting(table, ttl, record),
    )
    return ctes, sql.SQL("(SELECT calm FROM dislock_calm)")


def _recorded(table: sql.Identifier, lock_key: sql.Composable | None = None) -> sql.Composed:
    """A scalar SQL expression: the longest TTL any role recorded; with ``lock_key`` (an
    expression), of the roles whose scope matches it (or that have none)."""
    # (A correlated read of each record's scope rather than a join: the statement is
    # planned on every execution, and a join's nodes are set up even when, as
    # outside a failover's window, they never run.)
    scoped = sql.SQL(
        " AND coalesce({lock_key} ~ (SELECT scope.value FROM {table} AS scope"
        " WHERE scope.key = {scope_prefix} || substr(r.key, {after})), true)"
    ).format(
        lock_key=lock_key,
        table=table,
        scope_prefix=sql.Literal(SCOPE_KEY_PREFIX),
        after=sql.Literal(len(TTL_KEY_PREFIX) + 1),
    )
    return sql.SQL(
        "(SELECT max(r.value::float8) FROM {table} AS r WHERE starts_with(r.key, {prefix}){scoped})"
    ).format(
        table=table,
        prefix=sql.Literal(TTL_KEY_PREFIX),
        scoped=sql.SQL("") if lock_key is None else scoped,
    )


def _noting(table: sql.Identifier, ttl: sql.Composable, record: sql.Composable) -> sql.Composed:
    """The lock delay's writes: a new timeline, and the role's longer TTL."""
    return sql.SQL(
        # A different timeline than the one recorded is recorded with the instant
        # it was noticed, where every key's delay starts; the first one ever
        # recorded starts none.
        "dislock_note_timeline AS ("
        "INSERT INTO {table} AS noted (key, value, expire_at)"
        " SELECT {timeline_key}, h.timeline::text,"
        " CASE WHEN EXISTS (SELECT FROM dislock_seen) THEN NOW() ELSE {never_noticed} END"
        " FROM dislock_server h"
        " WHERE NOT EXISTS (SELECT FROM dislock_seen s WHERE s.timeline = h.timeline)"
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at"
        " WHERE noted.value IS DISTINCT FROM EXCLUDED.value),"
        # The role's record of its longest TTL, written only when a lease is longer
        # than any it took before (rarely: acquisitions of different keys do not
        # queue on it), never past the maximum.
        " dislock_note_ttl AS ("
        "INSERT INTO {table} AS noted (key, value, expire_at)"
        " SELECT {record}, {ttl}::float8::text, {never}::timestamptz"
        " WHERE {ttl}::float8 > 0 AND {ttl}::float8 <= (SELECT max_ttl FROM dislock_cap)"
        # (The cast in the target list: a qual could be tried on any row of a
        # small table, and a lock row's value is no number.)
        " AND coalesce((SELECT value::float8 FROM {table} WHERE key = {record}), 0)"
        " < {ttl}::float8"
        # Two acquisitions of one role at once: the shorter TTL must not win.
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        " WHERE noted.value::float8 < EXCLUDED.value::float8)"
    ).format(
        table=table,
        timeline_key=sql.Literal(TIMELINE_KEY),
        never_noticed=NEVER_NOTICED,
        record=record,
        ttl=ttl,
        never=sql.Literal(NEVER_EXPIRES),
    )


def timeline_returned() -> sql.SQL:
    """What an acquiring upsert with the fragment returns after its token: the
    timeline the lock was taken on, for the holder to compare on reconnection."""
    return sql.SQL("(SELECT timeline FROM dislock_server)")


def delay_end_returned() -> sql.SQL:
    """What an acquiring upsert with the fragment returns after the timeline: the end
    of the key's lock delay that kept it from taking anything, NULL when none runs
    (so that a refusal during a delay is not reported as a lock held by someone
    else).  A timeline noticed by this very statement starts its delay now."""
    return sql.SQL(
        "(SELECT CASE WHEN c.calm THEN NULL"
        " ELSE CASE WHEN s.timeline IS DISTINCT FROM h.timeline THEN NOW() ELSE s.noticed END"
        " + make_interval(secs => (SELECT ttl FROM dislock_longest)) END"
        " FROM dislock_calm c CROSS JOIN dislock_server h LEFT JOIN dislock_seen s ON true)"
    )


def delayed(what: str, until: datetime) -> str:
    """Why ``what`` (a lock, in words) was not taken: a lock delay, ending ``until``."""
    return (
        f"{what} is not taken before {until.isoformat()}: lock delay after a database"
        " failover (a holder that was cut off with the old primary may still be running)"
    )


def longest_delay(table: sql.Identifier, noticed: sql.Composable) -> sql.Composed:
    """A scalar SQL expression: the end of the longest lock delay that a timeline
    noticed at ``noticed`` starts, whatever the key (every role's record counts),
    up to the table's maximum TTL.  The operator views show it: no key waits longer,
    but for a lease longer than every recorded one, which waits for its own TTL."""
    return sql.SQL("{} + make_interval(secs => least({}, coalesce({}, 0)))").format(
        noticed, max_ttl_of(table), _recorded(table)
    )


class DelayState(NamedTuple):
    """The timeline and the lock delay after a failover, as ``check`` and ``ls`` show
    them: the row ``delay_state`` answers."""

    recorded: int
    """The timeline recorded in the table."""
    ends: datetime
    """When the longest lock delay of any key ends (``longest_delay``)."""
    seconds_left: float
    """Until ``ends``; not above 0 when no delay runs."""
    server: int
    """The server's own timeline: another than ``recorded`` means a failover that no
    acquisition noticed yet."""


def _read_delay_state(rows: Rows) -> DelayState | None:
    if not rows:
        return None
    (row,) = rows
    found = DelayState._make(row)
    return DelayState(int(found.recorded), found.ends, float(found.seconds_left), int(found.server))


def delay_state(table_parts: tuple[str, ...]) -> Exchange[DelayState | None]:
    """The table's timeline and lock delay; None before the first acquisition."""
    table = sql.Identifier(*table_parts)
    query = sql.SQL(
        "SELECT {columns}"
        " FROM (SELECT value::int8 AS recorded, {ends} AS ends"
        " FROM {table} WHERE key = {timeline_key}) AS seen"
    ).format(
        columns=select_list(
            DelayState._fields,
            recorded=sql.SQL("recorded"),
            ends=sql.SQL("ends"),
            seconds_left=sql.SQL("(EXTRACT(EPOCH FROM ends) - EXTRACT(EPOCH FROM NOW()))::float8"),
            server=TIMELINE,
        ),
        ends=longest_delay(table, sql.SQL("expire_at")),
        table=table,
        timeline_key=sql.Literal(TIMELINE_KEY),
    )
    return Exchange(query, {}, _read_delay_state)


def timeline_change(before: int | None, after: int | None) -> str | None:
    """The warning a holder logs when its new connection is on another timeline."""
    if before is None or after is None or before == after:
        return None
    return (
        f"reconnected to a server on timeline {after} (the lock was taken on timeline {before}):"
        " the database failed over; a lease whose row was not replicated is lost, and"
        " its next renewal will say so"
    )

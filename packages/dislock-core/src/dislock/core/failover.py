"""What a PostgreSQL failover can take away, and how dislock keeps it from making two holders.

Two decisions live here, both plain data for the shells to act on:

* **A commit that synchronous replication did not confirm is not a success.**
  When the wait for the standby is cancelled (by dislock's own statement
  timeout, an operator, a shutdown), the server commits locally and says so in
  a WARNING from ``syncrep.c``.  A failover can then lose the row.
  ``not_replicated`` (``unreplicated_notice``) recognises that notice.

* **A lock delay after a change of server history** (Chubby's lock delay).  A
  promoted standby starts a new *timeline*; rows written on the old primary but
  never replicated are gone, and nothing in the table can show it.  So the
  acquiring statements read the server's timeline themselves
  (``pg_walfile_name(pg_current_wal_lsn())``, which any role may call, unlike
  ``pg_control_checkpoint()`` on hardened servers) and compare it with the one
  recorded in a metadata row of the lock table.  The first acquisition to see a
  different timeline records it, and until one TTL later no acquisition takes a
  missing or expired row.  The TTL is the longest one any lease in the table
  ever asked for (recorded in a second metadata row, written only when it
  grows), so every holder from before the failover has passed its own deadline
  by the time anyone else gets in.  A restart keeps the timeline: no delay.

The metadata rows' keys do not start with ``cronjob-lock:``, so ``dislockctl
ls`` and dislock 0.1.0 (which only read their own keys) never see them.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from psycopg import sql

from dislock.core.errors import NotReplicatedError

if TYPE_CHECKING:
    from psycopg.errors import Diagnostic

TIMELINE_KEY = "dislock:failover:timeline"
"""Metadata row: ``value`` is the server timeline last seen, ``expire_at`` the end of
the lock delay that started when it was first seen (in the past when none runs)."""

LONGEST_TTL_KEY = "dislock:failover:longest-ttl"
"""Metadata row: ``value`` is the longest lease TTL (seconds) ever used in the table."""

METADATA_KEYS = (TIMELINE_KEY, LONGEST_TTL_KEY)

SYNCREP_FUNCTION = "SyncRepWaitForLSN"
"""The server function that waits for synchronous standbys (``syncrep.c``)."""

TIMELINE = sql.SQL("('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8")
"""The server's current timeline, from the name of the WAL segment it writes to (the
first eight hex digits of a segment name are its timeline).  Fails on a standby,
which cannot take locks anyway."""

CURRENT_TIMELINE = sql.SQL("SELECT {}").format(TIMELINE)


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


NEVER_EXPIRES = "9999-12-31 00:00:00+00"
"""``expire_at`` of the longest-TTL row, which never expires.  Not ``'infinity'``:
psycopg cannot load it into a datetime, and PostgreSQL before 17 cannot subtract it
(``expire_at - NOW()``, which ``dislockctl`` and operators' queries compute); the
same end as a pause without one (``dislock.core.pause.UNTIL_RESUMED``)."""


def lock_delay(table: sql.Identifier, ttl: sql.Composable) -> tuple[sql.Composed, sql.SQL]:
    """The lock-delay fragment of an acquiring upsert on ``table``.

    Returns ``(ctes, calm)``: ``ctes`` are common table expressions for the
    statement's ``WITH`` clause (before the ``INSERT``), ``calm`` a condition for
    its row source (an acquisition with no
    candidate row neither inserts nor takes over anything).  ``ttl`` is the
    acquisition's own TTL in seconds (``0`` for a schedule slot).

    It costs no round trip: the common case reads two metadata rows by primary
    key and writes nothing.  The metadata rows are written only when the
    timeline changes or a longer TTL appears, and only when their guard holds,
    so acquisitions of different keys never queue on them.
    """
    ctes = sql.SQL(
        "dislock_history AS (SELECT {timeline} AS timeline),"
        " dislock_seen AS ("
        "SELECT value::int8 AS timeline, expire_at AS delay_ends"
        " FROM {table} WHERE key = {timeline_key}),"
        " dislock_longest AS ("
        "SELECT greatest({ttl}::float8, coalesce((SELECT value::float8 FROM {table}"
        " WHERE key = {ttl_key}), 0)) AS ttl),"
        # A different timeline than the one recorded starts the delay (for the
        # longest TTL); the first one ever recorded starts none.
        " dislock_note_timeline AS ("
        "INSERT INTO {table} AS noted (key, value, expire_at)"
        " SELECT {timeline_key}, h.timeline::text,"
        " CASE WHEN EXISTS (SELECT FROM dislock_seen) THEN NOW()"
        " + make_interval(secs => (SELECT ttl FROM dislock_longest)) ELSE NOW() END"
        " FROM dislock_history h"
        " WHERE NOT EXISTS (SELECT FROM dislock_seen s WHERE s.timeline = h.timeline)"
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at"
        " WHERE noted.value IS DISTINCT FROM EXCLUDED.value),"
        " dislock_note_ttl AS ("
        "INSERT INTO {table} AS noted (key, value, expire_at)"
        " SELECT {ttl_key}, {ttl}::float8::text, {never}::timestamptz"
        " WHERE {ttl}::float8 > coalesce((SELECT value::float8 FROM {table}"
        " WHERE key = {ttl_key}), 0)"
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        " WHERE noted.value::float8 < EXCLUDED.value::float8),"
        " dislock_calm AS (SELECT NOT EXISTS ("
        "SELECT FROM dislock_seen s, dislock_history h"
        " WHERE s.timeline <> h.timeline OR NOW() < s.delay_ends) AS calm)"
    ).format(
        timeline=TIMELINE,
        table=table,
        timeline_key=sql.Literal(TIMELINE_KEY),
        ttl_key=sql.Literal(LONGEST_TTL_KEY),
        ttl=ttl,
        never=sql.Literal(NEVER_EXPIRES),
    )
    return ctes, sql.SQL("(SELECT calm FROM dislock_calm)")


def timeline_returned() -> sql.SQL:
    """What an acquiring upsert with the fragment returns after its token: the
    timeline the lock was taken on, for the holder to compare on reconnection."""
    return sql.SQL("(SELECT timeline FROM dislock_history)")


def delay_end_returned() -> sql.SQL:
    """What an acquiring upsert with the fragment returns after the timeline: the end
    of the lock delay that kept it from taking anything, NULL when none runs (so that
    a refusal during a delay is not reported as a lock held by someone else).  A
    timeline noticed by this very statement starts its delay now."""
    return sql.SQL(
        "(SELECT CASE WHEN c.calm THEN NULL"
        " WHEN s.timeline IS DISTINCT FROM h.timeline THEN NOW() + make_interval(secs => l.ttl)"
        " ELSE s.delay_ends END"
        " FROM dislock_calm c CROSS JOIN dislock_history h CROSS JOIN dislock_longest l"
        " LEFT JOIN dislock_seen s ON true)"
    )


def delayed(what: str, until: datetime) -> str:
    """Why ``what`` (a lock, in words) was not taken: a lock delay, ending ``until``."""
    return (
        f"{what} is not taken before {until.isoformat()}: lock delay after a database"
        " failover (a holder that was cut off with the old primary may still be running)"
    )


def lock_delay_query(table: sql.Identifier) -> sql.Composed:
    """``(timeline recorded, lock delay ends, seconds left, server timeline)`` for
    ``dislockctl check``; no row before the first acquisition."""
    return sql.SQL(
        "SELECT value::int8, expire_at, EXTRACT(EPOCH FROM (expire_at - NOW()))::float8, {timeline}"
        " FROM {table} WHERE key = {timeline_key}"
    ).format(timeline=TIMELINE, table=table, timeline_key=sql.Literal(TIMELINE_KEY))


def timeline_change(before: int | None, after: int | None) -> str | None:
    """The warning a holder logs when its new connection is on another timeline."""
    if before is None or after is None or before == after:
        return None
    return (
        f"reconnected to a server on timeline {after} (the lock was taken on timeline {before}):"
        " the database failed over; a lease whose row was not replicated is lost, and"
        " its next renewal will say so"
    )

"""The text of the lock statements, composed from named fragments with quoted identifiers.

Every lock operation is a single statement in its own (autocommit) transaction,
so ``NOW()`` is the time that statement started.  The acquiring statements are
``dislock.core.claim_queries``'.

Renewals only change ``expire_at``, a column no index covers, so PostgreSQL can
update the row in place (a HOT update) instead of growing the table and index.

``dislock.core.lock_statements`` pairs each text with its parameters and the
reader of its answer (``dislock.core.answers``), whose row type names its columns.
"""

from __future__ import annotations

from typing import NamedTuple

from psycopg import sql

from dislock.core import retries
from dislock.core.answers import LookRow, Renewed
from dislock.core.claim_queries import Claims
from dislock.core.exchange import select_list
from dislock.core.failover import TIMELINE, TIMELINE_KEY, TTL_RECORD
from dislock.core.limits import MAX_TTL_KEY, max_ttl_of
from dislock.core.rows import RELEASED_MARK
from dislock.core.unknown_outcome import Mine
from dislock.core.waiting import wake_payload


class Queries(NamedTuple):
    """The text of the lock statements of one table: each is the statement of the
    ``LockStatements`` method of its name (``renew_batch``: ``renew``), which gives it
    its parameters, says what it does, and reads its answer into a row type."""

    acquire_until: sql.Composed
    acquire_for: sql.Composed
    renew_batch: sql.Composed
    release: sql.Composed
    hand_back: sql.Composed
    now: sql.SQL
    acquire_slot: sql.Composed
    mine: sql.Composed
    acquire_by_clock: sql.Composed
    acquire_retrying: sql.Composed
    reopen: sql.Composed
    done: sql.Composed
    look: sql.Composed
    take_over: sql.Composed


def queries(
    table_parts: tuple[str, ...], fencing: bool = False, record: sql.Composable = TTL_RECORD
) -> Queries:
    """The statements' text for ``table_parts``; with ``fencing``, acquisitions also bump and
    return the row's ``fence`` column, in the same statement.  ``record``: the key of
    the acquiring role's longest-TTL record (``dislock.core.failover``)."""
    table = sql.Identifier(*table_parts)
    claims = Claims(table, fencing, record)
    return Queries(
        acquire_until=claims.acquire_until(),
        acquire_for=claims.acquire_for(),
        renew_batch=_renew_batch(table),
        release=_releasing(table, "key = %(key)s"),
        hand_back=_releasing(table, "key = ANY(%(keys)s::text[])"),
        now=sql.SQL("SELECT NOW()"),
        acquire_slot=claims.acquire_slot(),
        mine=_mine(table, claims.token),
        acquire_by_clock=claims.acquire_by_clock(),
        acquire_retrying=claims.acquire_retrying(),
        reopen=retries.reopen_query(table),
        done=retries.done_query(table),
        look=_look(table),
        take_over=claims.take_over(),
    )


def _renew_batch(table: sql.Identifier) -> sql.Composed:
    # Every lease a process holds in this table, in one statement.  The arrays
    # join on (key, value) like ``WHERE (key, value) IN (...)`` would, and carry
    # each lease's own TTL along.  A row whose TTL already ran out is not
    # renewed, even if nobody took it.
    return sql.SQL(
        "UPDATE {table} AS held"
        " SET expire_at = NOW() + make_interval(secs => batch.ttl)"
        " FROM unnest(%(keys)s::text[], %(owners)s::text[], %(ttls)s::float8[])"
        " AS batch (key, value, ttl)"
        " WHERE held.key = batch.key AND held.value = batch.value"
        " AND held.expire_at > NOW()"
        # A lease longer than the table's maximum (lowered while it ran) is not
        # renewed, so it alone is lost, rather than failing the whole batch
        # under row-level security (dislock.core.grants).
        " AND batch.ttl <= {cap}"
        " RETURNING {columns}"
    ).format(
        table=table,
        cap=max_ttl_of(table),
        columns=select_list(Renewed._fields, key=sql.SQL("held.key"), owner=sql.SQL("held.value")),
    )


def _releasing(table: sql.Identifier, rows: str) -> sql.Composed:
    return sql.SQL(
        "UPDATE {table} SET expire_at = NOW(), value = value || {mark}"
        " WHERE {rows} AND value = %(owner)s AND expire_at > NOW()"
        " RETURNING pg_notify(%(channel)s, {wake})"
    ).format(
        table=table,
        rows=sql.SQL(rows),
        mark=sql.Literal(RELEASED_MARK),
        wake=wake_payload(sql.SQL("tableoid")),
    )


def _mine(table: sql.Identifier, token: sql.Composable) -> sql.Composed:
    return sql.SQL(
        "SELECT {columns} FROM {table} AS held"
        " WHERE key = ANY(%(keys)s::text[]) AND value = %(owner)s AND expire_at > NOW()"
        " ORDER BY key"
    ).format(
        columns=select_list(
            Mine._fields,
            key=sql.SQL("key"),
            token=token,
            expire_at=sql.SQL("expire_at"),
            timeline=TIMELINE,
        ),
        table=table,
    )


def _look(table: sql.Identifier) -> sql.Composed:
    return sql.SQL(
        "SELECT {columns} FROM {table}"
        " WHERE key IN (%(key)s, %(pause)s, {timeline_key}, {max_ttl_key})"
    ).format(
        table=table,
        columns=select_list(
            LookRow._fields,
            now=sql.SQL("NOW()"),
            clock=sql.SQL("clock_timestamp()"),
            timeline=TIMELINE,
            key=sql.SQL("key"),
            value=sql.SQL("value"),
            expire_at=sql.SQL("expire_at"),
        ),
        timeline_key=sql.Literal(TIMELINE_KEY),
        max_ttl_key=sql.Literal(MAX_TTL_KEY),
    )

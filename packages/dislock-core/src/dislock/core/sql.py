"""The SQL dislock runs, composed with quoted identifiers, and the lock row keys.

Every lock operation is a single statement in its own (autocommit) transaction,
so ``NOW()`` is the time that statement started.  Acquisition is one atomic
upsert: it inserts a missing row, or takes over a row whose ``expire_at`` has
passed, and touches nothing otherwise; no SELECT comes first.

Renewals only change ``expire_at``, a column no index covers, so PostgreSQL can
update the row in place (a HOT update) instead of growing the table and index.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from psycopg import sql

KEY_PREFIX = "cronjob-lock"


def schedule_key(lock_key: str) -> str:
    return f"{KEY_PREFIX}:schedule:{lock_key}"


def lease_key(lock_key: str) -> str:
    return f"{KEY_PREFIX}:lease:{lock_key}"


@dataclass(frozen=True)
class Statements:
    """The statements for one lock table."""

    table: sql.Identifier
    acquire_until: sql.Composed
    """Params: key, owner, expire_at (timestamptz). One row affected when acquired."""
    acquire_for: sql.Composed
    """Params: key, owner, ttl (seconds). One row affected when acquired."""
    renew: sql.Composed
    """Params: key, owner, ttl. One row affected while the lease is still ours."""
    release: sql.Composed
    """Params: key, owner. Expires our row now; a row another owner took is untouched."""
    now: sql.SQL
    """The database clock (statement time)."""
    create_table: sql.Composed
    """The lock table, created if missing."""


@lru_cache(maxsize=64)
def statements(table_parts: tuple[str, ...]) -> Statements:
    table = sql.Identifier(*table_parts)
    upsert = """
        INSERT INTO {table} AS held (key, value, expire_at)
        VALUES (%(key)s, %(owner)s, {expiry})
        ON CONFLICT (key) DO UPDATE
            SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at
            WHERE held.expire_at <= NOW()
    """
    lease_expiry = sql.SQL("NOW() + make_interval(secs => %(ttl)s)")
    return Statements(
        table=table,
        acquire_until=sql.SQL(upsert).format(
            table=table, expiry=sql.SQL("%(expire_at)s::timestamptz")
        ),
        acquire_for=sql.SQL(upsert).format(table=table, expiry=lease_expiry),
        # A row whose TTL already ran out is not renewed, even if nobody took it.
        renew=sql.SQL(
            "UPDATE {table} SET expire_at = {expiry}"
            " WHERE key = %(key)s AND value = %(owner)s AND expire_at > NOW()"
        ).format(table=table, expiry=lease_expiry),
        release=sql.SQL(
            "UPDATE {table} SET expire_at = NOW()"
            " WHERE key = %(key)s AND value = %(owner)s AND expire_at > NOW()"
        ).format(table=table),
        now=sql.SQL("SELECT NOW()"),
        create_table=sql.SQL(
            "CREATE TABLE IF NOT EXISTS {table} ("
            "key text PRIMARY KEY, value text NOT NULL, expire_at timestamptz NOT NULL)"
        ).format(table=table),
    )


def acquire_until_params(key: str, owner: str, expire_at: datetime) -> dict[str, Any]:
    return {"key": key, "owner": owner, "expire_at": expire_at}


def lease_params(key: str, owner: str, ttl_seconds: float) -> dict[str, Any]:
    return {"key": key, "owner": owner, "ttl": ttl_seconds}


def release_params(key: str, owner: str) -> dict[str, Any]:
    return {"key": key, "owner": owner}


def create_table_sql(table_parts: tuple[str, ...]) -> str:
    """The DDL as plain text, for messages and for teams that apply DDL by hand."""
    return statements(table_parts).create_table.as_string(None) + ";"

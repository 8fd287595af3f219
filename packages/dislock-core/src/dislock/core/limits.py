"""The lock table's maximum lease TTL: where it is kept, how statements read it, how it is set.

The lock delay after a failover (``dislock.core.failover``) never lasts longer:
without a cap, one wrapper started with a week-long TTL would make every later
failover stop the fleet for a week.  It lives in a metadata row of the lock table,
read by the acquiring statement itself (no extra round trip); only the table's
owner writes it (``dislockctl init --max-ttl``).
"""

from __future__ import annotations

from typing import NamedTuple

from psycopg import sql

from dislock.core.exchange import Exchange, Rows, select_list

MAX_TTL_KEY = "dislock:config:max-ttl"
"""Metadata row: ``value`` is the maximum lease TTL in seconds; it never expires."""

DEFAULT_MAX_TTL = 3600.0
"""The cap of a table whose metadata has none (``dislockctl init`` without ``--max-ttl``)."""

NEVER_EXPIRES = "9999-12-31 00:00:00+00"
"""``expire_at`` of a metadata row that never expires.  Not ``'infinity'``: psycopg
cannot load it into a datetime, and PostgreSQL before 17 cannot subtract it."""


def max_ttl_of(table: sql.Identifier) -> sql.Composed:
    """A scalar SQL expression: the table's maximum lease TTL, in seconds."""
    return sql.SQL(
        "coalesce((SELECT value::float8 FROM {table} WHERE key = {key}), {default})"
    ).format(table=table, key=sql.Literal(MAX_TTL_KEY), default=sql.Literal(DEFAULT_MAX_TTL))


def metadata_row(table_parts: tuple[str, ...], key: str, value: str) -> sql.Composed:
    """Write the metadata row ``key`` (one that never expires) with ``value``."""
    return sql.SQL(
        "INSERT INTO {table} (key, value, expire_at) VALUES ({key}, {value}, {never})"
        " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expire_at = EXCLUDED.expire_at"
    ).format(
        table=sql.Identifier(*table_parts),
        key=sql.Literal(key),
        value=sql.Literal(value),
        never=sql.Literal(NEVER_EXPIRES),
    )


def set_max_ttl(table_parts: tuple[str, ...], seconds: float) -> sql.Composed:
    """Record ``seconds`` as the table's maximum lease TTL."""
    text = f"{seconds:g}" if float(seconds).is_integer() else repr(float(seconds))
    return metadata_row(table_parts, MAX_TTL_KEY, text)


class MaxTtl(NamedTuple):
    """A table's maximum lease TTL: the row ``max_ttl`` answers."""

    seconds: float
    recorded: bool
    """Whether the table records one (``init --max-ttl``); else the default applies."""


def _read_max_ttl(rows: Rows) -> MaxTtl:
    (row,) = rows
    found = MaxTtl._make(row)
    return MaxTtl(float(found.seconds), bool(found.recorded))


def max_ttl(table_parts: tuple[str, ...]) -> Exchange[MaxTtl]:
    """The table's maximum lease TTL, and whether it records one."""
    table = sql.Identifier(*table_parts)
    columns = select_list(
        MaxTtl._fields,
        seconds=max_ttl_of(table),
        recorded=sql.SQL("EXISTS (SELECT FROM {table} WHERE key = {key})").format(
            table=table, key=sql.Literal(MAX_TTL_KEY)
        ),
    )
    return Exchange(sql.SQL("SELECT {}").format(columns), {}, _read_max_ttl)


def too_long(ttl: float, cap: float) -> str:
    """Why a lease of ``ttl`` seconds was refused by a table whose cap is ``cap``."""
    return (
        f"a lease TTL of {ttl:g} s is longer than this table's maximum of {cap:g} s"
        " (raise it with dislockctl init --max-ttl, see docs/migrating.md)"
    )

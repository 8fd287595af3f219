"""The lock table's definition: the DDL that ``dislockctl init`` runs, and that teams
applying DDL by hand are shown."""

from __future__ import annotations

from psycopg import sql


def create_table(table_parts: tuple[str, ...], *, fencing: bool = False) -> sql.Composed:
    """The lock table, created if missing.

    ``fillfactor`` leaves room in each page so that renewals, which only touch
    the unindexed ``expire_at``, stay in-place (HOT) updates.
    """
    fence = sql.SQL(", fence bigint NOT NULL DEFAULT 0") if fencing else sql.SQL("")
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {table} ("
        "key text PRIMARY KEY, value text NOT NULL, expire_at timestamptz NOT NULL{fence})"
        " WITH (fillfactor = 70)"
    ).format(table=sql.Identifier(*table_parts), fence=fence)


def create_table_sql(table_parts: tuple[str, ...], *, fencing: bool = False) -> str:
    """The DDL as plain text, for messages and for teams that apply DDL by hand."""
    return create_table(table_parts, fencing=fencing).as_string(None) + ";"

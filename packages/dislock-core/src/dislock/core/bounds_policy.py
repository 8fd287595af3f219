"""The restrictive policy that holds every granted role to the table's bounds: no
lease row and no lock delay ends more than the table's maximum TTL from now
(``dislock.core.limits``), and a new timeline's lock delay lasts at least the
longest TTL recorded (so that no role can cut a delay short after a failover).

``dislockctl grant`` writes it with a role's first grant, ``dislockctl init
--max-ttl`` again with a new maximum: a policy cannot read the table it guards,
so the maximum is written into it as a literal.
"""

from __future__ import annotations

from psycopg import sql

from dislock.core.failover import TIMELINE_KEY, TTL_KEY_PREFIX
from dislock.core.rows import LEASE_ROWS

MAX_NAME = 63  # PostgreSQL truncates longer identifiers (NAMEDATALEN - 1)


BOUNDS_POLICY = "dislock:bounds"


def floor_function(table_parts: tuple[str, ...]) -> sql.Identifier:
    """The function that tells the bounds policy the shortest lock delay a new timeline
    may start: the table's longest recorded lease TTL, up to its maximum.  A policy
    cannot read the table it guards (the read would apply the policy again), so the
    function runs as the table's owner (``SECURITY DEFINER``), whom row-level
    security does not apply to.  It lives beside the table (``table_parts`` names the
    schema)."""
    *schema, name = table_parts
    return sql.Identifier(*schema, f"{name[: MAX_NAME - 14]}_dislock_delay")


def bounds_function(table_parts: tuple[str, ...]) -> sql.Identifier:
    """The function the bounds policy's check calls (``bounds_policy``), beside the table."""
    *schema, name = table_parts
    return sql.Identifier(*schema, f"{name[: MAX_NAME - 15]}_dislock_bounds")


def bounds_policy(table_parts: tuple[str, ...], max_ttl: float) -> list[sql.Composed]:
    """The restrictive policy that holds every granted role to the table's maximum TTL,
    and holds a new timeline's lock delay to at least the longest recorded TTL (so
    that no role can cut a delay short after a failover), with its two functions:
    ``floor_function`` and the check itself (``bounds_function``)."""
    table = sql.Identifier(*table_parts)
    cap = sql.Literal(float(max_ttl))
    floor = floor_function(table_parts)
    within = sql.SQL(
        "CASE WHEN key ~ {lease} THEN expire_at <= NOW() + make_interval(secs => {cap})"
        " WHEN key = {timeline} THEN expire_at <= NOW() + make_interval(secs => {cap})"
        " AND expire_at >= NOW() + make_interval(secs => {floor}())"
        " WHEN starts_with(key, {ttl_prefix}) THEN value::float8 <= {cap}"
        " ELSE true END"
    ).format(
        lease=sql.Literal(LEASE_ROWS),
        timeline=sql.Literal(TIMELINE_KEY),
        ttl_prefix=sql.Literal(TTL_KEY_PREFIX),
        cap=cap,
        floor=floor,
    )
    bounds = bounds_function(table_parts)
    return [
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {floor}() RETURNS float8 LANGUAGE sql STABLE"
            " SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS {body}"
        ).format(
            floor=floor,
            body=sql.Literal(
                sql.SQL(
                    "SELECT least({cap}, coalesce((SELECT max(value::float8) FROM {table}"
                    " WHERE starts_with(key, {prefix})), 0))"
                )
                .format(cap=cap, table=table, prefix=sql.Literal(TTL_KEY_PREFIX))
                .as_string(None)
            ),
        ),
        # The check in a function of its own, which the planner cannot inline (a
        # PL/pgSQL body, a pinned search_path): written into the policy, the CASE
        # was planned again for every row a statement may write (an acquisition has
        # six such checks), a third of what row-level security cost it.
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {bounds}(key text, value text, expire_at timestamptz)"
            " RETURNS boolean LANGUAGE plpgsql STABLE"
            " SET search_path = pg_catalog, pg_temp AS {body}"
        ).format(
            bounds=bounds,
            body=sql.Literal(
                sql.SQL("BEGIN RETURN {within}; END").format(within=within).as_string(None)
            ),
        ),
        # (PUBLIC has EXECUTE by default, unless a hardened server revoked it.)
        sql.SQL("GRANT EXECUTE ON FUNCTION {}() TO PUBLIC").format(floor),
        sql.SQL("GRANT EXECUTE ON FUNCTION {}(text, text, timestamptz) TO PUBLIC").format(bounds),
        sql.SQL("DROP POLICY IF EXISTS {name} ON {table}").format(
            name=sql.Identifier(BOUNDS_POLICY), table=table
        ),
        sql.SQL(
            "CREATE POLICY {name} ON {table} AS RESTRICTIVE FOR ALL TO PUBLIC"
            " USING (true) WITH CHECK ({bounds}(key, value, expire_at))"
        ).format(name=sql.Identifier(BOUNDS_POLICY), table=table, bounds=bounds),
    ]

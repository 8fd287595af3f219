"""The functions beside a granted lock table that its row-level security policies call.

Every execution of a statement sets each policy expression up anew, once for every
row check the policy applies to (an acquisition carries about forty: each read of
the table, and five checks on each of its three upserts), whether or not a row is
ever checked; each function call in an expression costs a catalog lookup and a
permission check in that set-up.  That set-up, not the checks themselves, was most
of what row-level security cost a warm lock cycle, so the policies
(``dislock.core.grants``) are written with as few calls as will do, and what they
rarely need sits behind one call to a function here:

* ``<table>_dislock_max_ttl()``: the table's maximum lease TTL as an interval.  An
  immutable SQL function of one literal, so the planner folds it into a constant
  (bounding a lease row costs a comparison), and replacing it (``dislockctl init
  --max-ttl``) discards every cached plan that folded the old value.
* ``<table>_dislock_noting(key, value, expire_at, existing, slots)``: whether a
  role may write a row it rarely writes, within its bounds: the failover
  bookkeeping, and its keys' further lease slots (``slots``, their regular
  expression).  Only rows that none of the policy's ``LIKE`` patterns matched get
  this far, which in steady state is none at all.

Their bodies resolve no name through the caller's ``search_path`` (a literal, or a
``search_path`` pinned to ``pg_catalog``), so no role can make them call a function
of its own.
"""

from __future__ import annotations

from psycopg import sql

from dislock.core.failover import TIMELINE, TIMELINE_KEY, TTL_RECORD

MAX_NAME = 63  # PostgreSQL truncates longer identifiers (NAMEDATALEN - 1)

PINNED = sql.SQL("SET search_path = pg_catalog, pg_temp")


def beside(table_parts: tuple[str, ...], suffix: str) -> sql.Identifier:
    return sql.Identifier(*beside_parts(table_parts, suffix))


def beside_parts(table_parts: tuple[str, ...], suffix: str) -> tuple[str, ...]:
    """The name of a function beside the table (its schema, and its name cut so that
    the suffix fits), as parts."""
    *schema, name = table_parts
    return (*schema, f"{name[: MAX_NAME - len(suffix)]}{suffix}")


def max_ttl_function(table_parts: tuple[str, ...]) -> sql.Identifier:
    """The table's maximum lease TTL, as an interval (folded by the planner)."""
    return beside(table_parts, "_dislock_max_ttl")


def former_floor_function(table_parts: tuple[str, ...]) -> sql.Identifier:
    """A function that grants before per-key lock delays wrote (the shortest delay a
    new timeline could record); it is dropped when the others are written."""
    return beside(table_parts, "_dislock_delay")


def noting_function(table_parts: tuple[str, ...]) -> sql.Identifier:
    """Whether a granted role may write a row it rarely writes (``_noting_body``)."""
    return beside(table_parts, "_dislock_noting")


def _noting_body(table_parts: tuple[str, ...], cap: sql.Literal) -> sql.Composed:
    # A further slot of the role's keys ends within the maximum, as its first does;
    # the timeline row only with the server's real timeline, over a stale one (a
    # role cannot forge a failover), noticed now (every key's delay starts then:
    # a role can neither end a delay early nor start one late); the role's own
    # TTL record, up to the maximum.  A scope row (dislock.core.failover) is the
    # grant's alone.
    return sql.SQL(
        "BEGIN"
        " IF key ~ slots THEN"
        " RETURN existing OR expire_at <= NOW() + make_interval(secs => {cap});"
        " END IF;"
        " IF key = {timeline_key} THEN"
        " IF existing THEN RETURN value IS DISTINCT FROM {timeline}::text; END IF;"
        " RETURN value = {timeline}::text AND expire_at = NOW();"
        " END IF;"
        " IF key = {record} THEN RETURN existing OR value::float8 <= {cap}; END IF;"
        " RETURN false;"
        " END"
    ).format(
        timeline_key=sql.Literal(TIMELINE_KEY),
        timeline=TIMELINE,
        cap=cap,
        record=TTL_RECORD,
    )


def policy_functions(table_parts: tuple[str, ...], max_ttl: float) -> list[sql.Composed]:
    """The functions (re)written with a table's first grant and by ``dislockctl init
    --max-ttl``: the maximum is a literal in each (a policy cannot read the table)."""
    cap = sql.Literal(float(max_ttl))
    statements = [
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}() RETURNS interval LANGUAGE sql IMMUTABLE"
            " PARALLEL SAFE AS {body}"
        ).format(
            fn=max_ttl_function(table_parts),
            # ``interval '…'`` is the type's keyword, not a name looked up.
            body=sql.Literal(f"SELECT interval '{float(max_ttl)!r} seconds'"),
        ),
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}(key text, value text, expire_at timestamptz,"
            " existing boolean, slots text) RETURNS boolean LANGUAGE plpgsql STABLE {pinned}"
            " AS {body}"
        ).format(
            fn=noting_function(table_parts),
            pinned=PINNED,
            body=sql.Literal(_noting_body(table_parts, cap).as_string(None)),
        ),
        # (After the function that called it was replaced.)
        sql.SQL("DROP FUNCTION IF EXISTS {}()").format(former_floor_function(table_parts)),
    ]
    # (PUBLIC has EXECUTE by default, unless a hardened server revoked it.)
    for fn, args in (
        (max_ttl_function(table_parts), ""),
        (noting_function(table_parts), "text, text, timestamptz, boolean, text"),
    ):
        statements.append(
            sql.SQL("GRANT EXECUTE ON FUNCTION {}({}) TO PUBLIC").format(fn, sql.SQL(args))
        )
    return statements
